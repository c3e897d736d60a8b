"""Versioned coefficient snapshots: the record and its BLIS validation.

A snapshot is what coeffd publishes for one serving configuration: the α (3) and β (11)
vectors in BLIS's order and units (µs; spec ``blis-trained-physics.md`` §5.1, §6), plus
the provenance needed to trust them (observations used, prequential error of the learned
and of BLIS's default coefficients, drift history, terms the data could not identify).

Invariant: nothing that BLIS would reject is ever written. ``validate_for_blis`` applies
BLIS's own constructor rules (§7.1 items 1, 2, 4, 8 and the CLI's "β not all zeros",
§7.2.6) and :meth:`.store.SnapshotStore.publish` refuses before touching the disk. Where
snapshots live on disk is :mod:`.store`; when a new one is worth publishing,
:mod:`.policy`.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import msgspec
import structlog

from coeffd.learners.estimates import ConfigEstimate
from coeffd.learners.features.basis import check_coeffs
from coeffd.learners.steady import TERM_HINTS

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

#: A configuration id: a safe single path component (it names a directory).
CONFIG_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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


class DriftEntry(msgspec.Struct, frozen=True, kw_only=True):
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
    drift: tuple[DriftEntry, ...] = ()
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
    #: The β learner's observations behind ``alpha``/``beta``: this version's own when it
    #: published new numbers, the version's that first published them when it is a
    #: heartbeat (which repeats them with a larger ``observations``). The publish policy's
    #: ``refined`` reason reads it after a restart. None: written before it was recorded.
    fitted_on: int | None = None

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
    if not isinstance(config_id, str) or not CONFIG_ID_RE.match(config_id):
        raise InvalidConfigurationIdError(f"invalid configuration id {config_id!r}")
    return config_id


# ------------------------------------------------- from the learners' estimate


def _stats(summary: dict[str, Any], source: str) -> ErrorStats | None:
    s = summary.get(source, {}).get("all")
    if not s:
        return None
    mape, rmse = s.get("mape"), s.get("rmse")
    return ErrorStats(
        mape=float(mape) if mape is not None and math.isfinite(mape) else None,
        rmse=float(rmse) if rmse is not None and math.isfinite(rmse) else None,
        count=int(s.get("n", 0)),
    )


def to_snapshot(cs: ConfigEstimate, version: int, description: dict[str, Any]) -> Snapshot:
    """A publishable :class:`Snapshot` from the registry's view of one configuration."""
    v = cs.vectors

    def named(name: str) -> dict[str, float]:
        vec = v.get(name)
        return {} if vec is None else dict(zip(vec.names, vec.values, strict=True))

    kv: dict[str, float] = {}
    for direction in ("store", "load"):
        for k, val in named(f"kv_{direction}").items():
            kv[f"{direction}_{'base_us' if k == 'one' else 'us_per_byte'}"] = val
    prequential: dict[str, dict[str, ErrorStats]] = {}
    for target, summary in cs.errors.items():
        row = {s: st for s in ("learned", "blis_default") if (st := _stats(summary, s))}
        if row:
            prequential[target] = row
    drift = tuple(
        DriftEntry(
            wall_ns=int(e.get("wall_ns", 0)),
            target=name,
            detector=str(e.get("detector", "")),
            detail=", ".join(f"{k}={e[k]}" for k in sorted(e) if k not in ("wall_ns", "detector")),
        )
        for name, vec in sorted(v.items())
        for e in vec.drift_history
    )
    unidentified = tuple(f"beta.{n}" for n in (v["beta"].unidentified if "beta" in v else ()))
    sources = v["beta"].sources if "beta" in v else {}
    return Snapshot(
        configuration=ConfigurationRef(id=cs.config_id, labels=cs.labels, description=description),
        version=version,
        wall_ns=time.time_ns(),
        alpha=tuple(cs.alpha),
        beta=tuple(cs.beta),
        extended=named("beta_extended"),
        queue_wait=named("queue_wait"),
        kv_offload=kv,
        observations={name: vec.observations for name, vec in v.items()},
        prequential=prequential,
        drift=drift,
        unidentified=unidentified,
        estimate=v["beta"].estimate if "beta" in v else "",
        step_time_rel_std=dict(cs.step_time_rel_std),
        identification=dict(sources),
        identify_with={n: TERM_HINTS[n] for n, src in sources.items() if src != "data"},
    )
