"""Versioned coefficient snapshots: the record, BLIS validation, the store, the policy.

A snapshot is what coeffd publishes for one serving configuration: the α (3) and β (11)
vectors in BLIS's order and units (µs; spec ``blis-trained-physics.md`` §5.1, §6), plus
the provenance needed to trust them (observations used, prequential error of the learned
and of BLIS's default coefficients, drift history, terms the data could not identify).

Invariant: nothing that BLIS would reject is ever written. ``validate_for_blis`` applies
BLIS's own constructor rules (§7.1 items 1, 2, 4, 8 and the CLI's "β not all zeros",
§7.2.6) and ``SnapshotStore.publish`` refuses before touching the disk.

Layout on disk (one directory per configuration id)::

    <dir>/<config_id>/v<version>.json   immutable, one per published version
    <dir>/<config_id>/latest.json       a copy of the newest version, atomically replaced

``latest.json`` is a regular file rather than a symlink: replacing a symlink and then
reading through it are two steps a reader can interleave with a prune.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import structlog
from prometheus_client import CollectorRegistry, Gauge

from coeffd.daemon.publish.atomic import atomic_write_bytes, is_temp_file
from coeffd.learners.features.basis import check_coeffs

log = structlog.get_logger(__name__)

ALPHA_LEN = 3
BETA_LEN = 11
BLIS_MIN_ALPHA = 3
BLIS_MIN_BETA = 7

#: BLIS's names for the vector positions (spec §5.1, §6), for humans and dashboards.
ALPHA_NAMES: tuple[str, ...] = (
    "queueing_time",
    "post_decode_fixed_overhead",
    "output_token_processing_time",
)
BETA_NAMES: tuple[str, ...] = (
    "prefill_compute",
    "decode_compute",
    "weight_loading",
    "tp_communication",
    "per_layer",
    "per_request",
    "per_step",
    "per_moe_layer",
    "prefill_memory",
    "decode_memory",
    "moe_dispatch",
)

_CONFIG_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION_FILE_RE = re.compile(r"^v(\d+)\.json$")
LATEST_NAME = "latest.json"


@functools.cache
def coeffd_version() -> str:
    """The installed coeffd version (provenance in every snapshot). Cached: the metadata
    lookup scans ``sys.path`` (~3 % of a loaded daemon's time when done per snapshot)."""
    try:
        return metadata.version("coeffd")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


class InvalidCoefficientsError(ValueError):
    """A coefficient vector BLIS would reject; the message is BLIS-like and names the index."""


class InvalidConfigurationIdError(ValueError):
    """A configuration id that is not a safe single path component."""


class StaleVersionError(ValueError):
    """A snapshot whose version does not exceed the latest published one."""


# ----------------------------------------------------------------------------- record


class ConfigurationRef(msgspec.Struct, frozen=True, kw_only=True):
    """Which serving configuration a snapshot belongs to (see ARCHITECTURE "Configuration identity")."""

    id: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    description: dict[str, Any] = msgspec.field(default_factory=dict)


class ErrorStats(msgspec.Struct, frozen=True, kw_only=True):
    """Prequential (predict-then-learn) error of one coefficient set on one target."""

    mape: float | None = None  # mean absolute percentage error, as a fraction (0.05 = 5 %)
    rmse: float | None = None  # in the target's unit (µs)
    count: int = 0


class DriftEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One drift detection on a target's residuals (the learner reset or re-weighted)."""

    wall_ns: int
    target: str
    detector: str = ""
    detail: str = ""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One published coefficient set for one configuration.

    ``alpha``/``beta`` are exactly what BLIS takes (``--alpha-coeffs``/``--beta-coeffs``,
    µs). ``prequential`` is ``target -> {"learned" | "blis_default" -> ErrorStats}``.
    ``extended``, ``queue_wait`` and ``kv_offload`` hold coeffd's coefficients that BLIS has
    no slot for (name -> value). ``unidentified`` names terms the data could not pin down
    (e.g. ``beta[7]`` on a dense model); their published value is the prior's.
    """

    configuration: ConfigurationRef
    version: int
    wall_ns: int
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    extended: dict[str, float] = msgspec.field(default_factory=dict)
    queue_wait: dict[str, float] = msgspec.field(default_factory=dict)
    kv_offload: dict[str, float] = msgspec.field(default_factory=dict)
    observations: dict[str, int] = msgspec.field(default_factory=dict)
    prequential: dict[str, dict[str, ErrorStats]] = msgspec.field(default_factory=dict)
    drift: tuple[DriftEvent, ...] = ()
    unidentified: tuple[str, ...] = ()
    coeffd_version: str = msgspec.field(default_factory=coeffd_version)
    #: Fleet snapshot only (``learners.fleet``): leave-one-configuration-out step-time
    #: error, configuration id (or ``mean``) -> source (``fleet``, ``blis_default``, …).
    loco: dict[str, dict[str, ErrorStats]] = msgspec.field(default_factory=dict)
    #: ``steady`` (long-memory estimate) or ``tracking`` (fast: the physics is changing)
    estimate: str = ""
    #: per β term: ``data`` (this configuration's own data identify it), ``data+prior``
    #: (only its combination with other terms is identified; the split is the pooled
    #: prior's) or ``prior``
    identification: dict[str, str] = msgspec.field(default_factory=dict)
    #: for every term not from ``data``: the batches or configurations that would identify it
    identify_with: dict[str, str] = msgspec.field(default_factory=dict)
    #: per regime: estimated relative standard error of the step time β predicts on a
    #: fixed set of batches (``learners.evaluation.regime_batches``)
    step_time_rel_std: dict[str, float] = msgspec.field(default_factory=dict)

    @property
    def config_id(self) -> str:
        return self.configuration.id


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Snapshot)


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """JSON bytes of a snapshot (the on-disk and HTTP representation)."""
    return _encoder.encode(snapshot)


def decode_snapshot(data: bytes | str) -> Snapshot:
    """Parse and type-check a snapshot; raises ``msgspec.ValidationError``/``DecodeError``."""
    return _decoder.decode(data)


# ------------------------------------------------------------------------- validation


def _check_values(name: str, values: Sequence[float]) -> None:
    try:
        check_coeffs(values, name)
    except ValueError as e:
        raise InvalidCoefficientsError(str(e)) from None


def validate_for_blis(
    alpha: Sequence[float], beta: Sequence[float], *, exact_lengths: bool = True
) -> None:
    """Raise ``InvalidCoefficientsError`` unless BLIS would accept ``alpha``/``beta``.

    BLIS's order (§7.1): α has ≥ 3 values (1), every α finite and ≥ 0 (2), β has ≥ 7
    values (4), every supplied value finite and ≥ 0 (8); and β must not be all zeros
    (§7.2.6, BLIS treats that as "no coefficients"). With ``exact_lengths`` (snapshots)
    α must have exactly 3 and β exactly 11 values: coeffd always learns the full split
    form, and a shorter β would silently change BLIS's formula (§5.1).

    >>> validate_for_blis([1.0, 2.0, 3.0], [0.0] * 10 + [1.0])
    >>> validate_for_blis([1.0, 2.0], [1.0] * 11)
    Traceback (most recent call last):
    ...
    coeffd.daemon.publish.snapshot.InvalidCoefficientsError: AlphaCoeffs requires at least 3 elements, got 2
    """
    if len(alpha) < BLIS_MIN_ALPHA:
        raise InvalidCoefficientsError(
            f"AlphaCoeffs requires at least {BLIS_MIN_ALPHA} elements, got {len(alpha)}"
        )
    _check_values("AlphaCoeffs", alpha)
    if len(beta) < BLIS_MIN_BETA:
        raise InvalidCoefficientsError(
            f"BetaCoeffs requires at least {BLIS_MIN_BETA} elements, got {len(beta)}"
        )
    _check_values("BetaCoeffs", beta)
    if all(v == 0 for v in beta):
        raise InvalidCoefficientsError("BetaCoeffs are all zeros (BLIS treats that as missing)")
    if exact_lengths:
        if len(alpha) != ALPHA_LEN:
            raise InvalidCoefficientsError(
                f"AlphaCoeffs must have exactly {ALPHA_LEN} elements, got {len(alpha)}"
            )
        if len(beta) != BETA_LEN:
            raise InvalidCoefficientsError(
                f"BetaCoeffs must have exactly {BETA_LEN} elements, got {len(beta)}"
            )


def validate_config_id(config_id: str) -> str:
    """Return ``config_id`` if it is a safe single path component, else raise.

    Ids come from URLs (the HTTP API), so anything like ``..`` or ``a/b`` must never reach
    the file system.
    """
    if not isinstance(config_id, str) or not _CONFIG_ID_RE.match(config_id):
        raise InvalidConfigurationIdError(f"invalid configuration id {config_id!r}")
    return config_id


# ------------------------------------------------------------------------------ store


class SnapshotStore:
    """Versioned snapshot files per configuration, written atomically.

    One writer per directory (the daemon); any number of readers, in- or out-of-process.
    ``retention`` versions are kept per configuration (the newest; at least 1).
    Pass a ``registry`` to export ``coeffd_snapshot_version`` and
    ``coeffd_snapshot_timestamp_seconds`` per configuration.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        retention: int = 20,
        *,
        registry: CollectorRegistry | None = None,
        stale_temp_age_s: float = 3600.0,
    ) -> None:
        if retention < 1:
            raise ValueError("retention must be >= 1")
        self.directory = Path(directory)
        self.retention = retention
        self._lock = threading.Lock()
        self._version_gauge: Gauge | None = None
        self._time_gauge: Gauge | None = None
        if registry is not None:
            self._version_gauge = Gauge(
                "coeffd_snapshot_version",
                "Version of the latest published snapshot",
                ["config"],
                registry=registry,
            )
            self._time_gauge = Gauge(
                "coeffd_snapshot_timestamp_seconds",
                "Wall time of the latest published snapshot",
                ["config"],
                registry=registry,
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temp(stale_temp_age_s)

    # -- paths

    def _config_dir(self, config_id: str) -> Path:
        return self.directory / validate_config_id(config_id)

    def _remove_stale_temp(self, max_age_s: float) -> None:
        """Delete temp files of crashed writers; young ones may belong to a live writer."""
        cutoff = time.time() - max_age_s
        for path in self.directory.glob("*/.*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue

    # -- writing

    def next_version(self, config_id: str) -> int:
        """The version number the next snapshot of ``config_id`` should carry."""
        versions = self.versions(config_id)
        return (versions[-1] + 1) if versions else 1

    def publish(self, snapshot: Snapshot) -> Path:
        """Validate and write ``snapshot``; return the path of its version file.

        Raises ``InvalidCoefficientsError`` (nothing written) for a vector BLIS would
        reject and ``StaleVersionError`` unless the version is above the latest.
        """
        validate_for_blis(snapshot.alpha, snapshot.beta)
        if snapshot.version < 1:
            raise StaleVersionError(f"version must be >= 1, got {snapshot.version}")
        cdir = self._config_dir(snapshot.config_id)
        data = encode_snapshot(snapshot)
        with self._lock:
            existing = self.versions(snapshot.config_id)
            if existing and snapshot.version <= existing[-1]:
                raise StaleVersionError(
                    f"{snapshot.config_id}: version {snapshot.version} <= latest {existing[-1]}"
                )
            cdir.mkdir(parents=True, exist_ok=True)
            path = atomic_write_bytes(cdir / f"v{snapshot.version}.json", data)
            # latest.json last: a reader that sees version N there can always open vN.json.
            atomic_write_bytes(cdir / LATEST_NAME, data)
            self._prune(cdir, [*existing, snapshot.version])
        if self._version_gauge is not None and self._time_gauge is not None:
            self._version_gauge.labels(snapshot.config_id).set(snapshot.version)
            self._time_gauge.labels(snapshot.config_id).set(snapshot.wall_ns / 1e9)
        # Debug: a busy daemon publishes every configuration about once a second.
        log.debug(
            "snapshot published",
            config=snapshot.config_id,
            version=snapshot.version,
            observations=sum(snapshot.observations.values()),
        )
        return path

    def _prune(self, cdir: Path, versions: list[int]) -> None:
        for v in sorted(versions)[: -self.retention]:
            try:
                (cdir / f"v{v}.json").unlink()
            except FileNotFoundError:
                continue

    # -- reading

    def configurations(self) -> list[str]:
        """Ids of configurations with a published snapshot, sorted."""
        out = []
        try:
            entries = list(self.directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        for entry in entries:
            if _CONFIG_ID_RE.match(entry.name) and (entry / LATEST_NAME).is_file():
                out.append(entry.name)
        return sorted(out)

    def versions(self, config_id: str) -> list[int]:
        """Retained versions of ``config_id``, ascending (temp files ignored)."""
        cdir = self._config_dir(config_id)
        try:
            names = os.listdir(cdir)
        except (FileNotFoundError, NotADirectoryError):
            # nothing retained (a file in the way fails the next write: counted there)
            return []
        found = []
        for name in names:
            m = _VERSION_FILE_RE.match(name)
            if m and not is_temp_file(cdir / name):
                found.append(int(m.group(1)))
        return sorted(found)

    def _read(self, path: Path) -> Snapshot | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a name too long, a directory in the way: not a snapshot
            log.warning("unreadable snapshot skipped", path=str(path)[:200], error=exc.strerror)
            return None
        try:
            return decode_snapshot(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Only a foreign edit can get here (writes are atomic); skip, don't crash the API.
            log.warning("unreadable snapshot skipped", path=str(path), error=str(exc))
            return None

    def latest(self, config_id: str) -> Snapshot | None:
        """The newest snapshot of ``config_id``, or None."""
        return self._read(self._config_dir(config_id) / LATEST_NAME)

    def get(self, config_id: str, version: int) -> Snapshot | None:
        """Snapshot ``version`` of ``config_id`` if it is retained, else None."""
        return self._read(self._config_dir(config_id) / f"v{int(version)}.json")

    def history(self, config_id: str) -> list[Snapshot]:
        """All retained snapshots of ``config_id``, oldest first."""
        out = []
        for v in self.versions(config_id):
            snap = self.get(config_id, v)  # may vanish between listdir and open (prune)
            if snap is not None:
                out.append(snap)
        return out


# ----------------------------------------------------------------------------- policy


def max_relative_change(old: Iterable[float], new: Iterable[float], floor: float = 1e-9) -> float:
    """Largest ``|new - old| / max(|old|, floor)`` over paired positions (inf on length change).

    >>> max_relative_change([1.0, 2.0], [1.1, 2.0])  # doctest: +ELLIPSIS
    0.100...
    """
    a, b = list(old), list(new)
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        worst = max(worst, abs(y - x) / max(abs(x), floor))
    return worst


def step_time_change(
    old: Sequence[float], new: Sequence[float], batches: npt.NDArray[np.float64]
) -> float:
    """Mean ``|x·new − x·old| / x·old`` over the rows ``x`` of ``batches`` (BLIS basis
    terms of recent steps): how much a new β would move the predicted step times of the
    batches this configuration really runs. A term that no batch excites moves nothing.

    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> round(step_time_change([10.0, 5.0], [10.0, 5.5], x), 4)  # only the second row moves
    0.0167
    >>> step_time_change([10.0, 5.0], [10.0, 5.0, 1.0], x)
    inf
    """
    a = np.asarray(old, dtype=float)
    b = np.asarray(new, dtype=float)
    if a.shape != b.shape or batches.ndim != 2 or batches.shape[1] != len(a):
        return math.inf
    p_old = batches @ a
    ok = p_old > 0
    if not ok.any():
        return max_relative_change(a, b)
    return float(np.mean(np.abs(batches[ok] @ b - p_old[ok]) / p_old[ok]))


def regime_step_time_change(
    old: Sequence[float], new: Sequence[float], batches: npt.NDArray[np.float64]
) -> float:
    """:func:`step_time_change` over the batches with a prefill and over those without,
    the larger. Decode steps are most of what an engine runs (and, at vLLM's default
    sampling, nearly all that is observed), so a mean over them all never saw prefill
    terms move: a β with 10 %-off prefill terms stayed published, and TTFT with it.

    >>> import numpy as np
    >>> pd = np.array([[0.0, 1.0]] * 9 + [[1.0, 1.0]])  # nine decode batches, one prefill
    >>> round(step_time_change([10.0, 5.0], [11.0, 5.0], pd), 4)  # the mix: 0.67 %
    0.0067
    >>> round(regime_step_time_change([10.0, 5.0], [11.0, 5.0], pd), 4)  # prefill: 6.7 %
    0.0667
    """
    if batches.ndim != 2 or batches.shape[1] != len(old) or not len(batches):
        return step_time_change(old, new, batches)
    prefill = batches[:, 0] > 0
    return max(step_time_change(old, new, batches[g]) for g in (prefill, ~prefill) if g.any())


class PublishPolicy:
    """Decide when a new snapshot is worth publishing, and with which numbers.

    New coefficients are published when the vector is valid and nothing was published
    yet, or when they change what BLIS would predict: β moves the predicted step time of
    the configuration's recent batches (``recent``) by more than ``step_time_threshold``
    on average (without recent batches: any β by more than ``relative_threshold``), or
    an α moved by more than ``relative_threshold``. Otherwise, once ``interval_s`` has
    passed, a heartbeat version carries the *previous* numbers with fresh provenance
    (reason ``interval``), so users see that the estimate was confirmed, not that it
    wobbled (issue 15: consecutive versions of a steady engine moved E2E by 4–8 %).
    """

    def __init__(
        self,
        interval_s: float = 60.0,
        relative_threshold: float = 0.05,
        min_observations: int = 0,
        step_time_threshold: float = 0.005,
    ) -> None:
        self.interval_s = interval_s
        self.relative_threshold = relative_threshold
        self.min_observations = min_observations
        self.step_time_threshold = step_time_threshold

    def decide(
        self,
        previous: Snapshot | None,
        alpha: Sequence[float],
        beta: Sequence[float],
        now_wall_ns: int,
        observations: int = 0,
        recent: npt.NDArray[np.float64] | None = None,
    ) -> tuple[bool, str]:
        """Return ``(publish, reason)``; reason is one of ``invalid``, ``too_few_observations``,
        ``first``, ``significant_change`` (publish these numbers), ``interval`` (publish
        the previous numbers again), ``unchanged``."""
        try:
            validate_for_blis(alpha, beta)
        except InvalidCoefficientsError:
            return False, "invalid"
        if observations < self.min_observations:
            return False, "too_few_observations"
        if previous is None:
            return True, "first"
        if recent is not None and len(recent):
            moved = regime_step_time_change(previous.beta, beta, recent)
            beta_moved = moved > self.step_time_threshold
        else:
            beta_moved = max_relative_change(previous.beta, beta) > self.relative_threshold
        if beta_moved or max_relative_change(previous.alpha, alpha) > self.relative_threshold:
            return True, "significant_change"
        if now_wall_ns - previous.wall_ns >= self.interval_s * 1e9:
            return True, "interval"
        return False, "unchanged"
