"""``GET /v1/statistics``: what an instance learned, in the form a merge needs.

Every coeffd instance serves this document; the query tier (:mod:`.view`) reads it from
every peer and merges members of the same configuration id exactly
(:mod:`learners.merge`). Per configuration it carries:

* ``set``: the configuration's learner state, exactly as a checkpoint holds it
  (``LearnerSet.state_dict``: every learner's information matrix and vector with its
  own forgetting applied, its prior, counts, the steady estimator's mode);
* ``rows``: its most recent step rows (basis terms, measured period µs), at most
  :data:`MAX_ROWS`, on which the fleet model scores leave-one-configuration-out errors;
* ``prequential``: the prequential error summary per target and source.

The document is versioned (``format``, ``version``); a reader refuses any other version
whole, with the reason, rather than guess at a layout. It is built on the learners' thread
(:func:`export_statistics`) and served as bytes, so an HTTP thread never touches a learner.

Reading it (:func:`parse_statistics`) treats the peer as untrusted: size bounded before
decoding (by the client), ids checked as names, every set rebuilt in a scratch registry
(:meth:`LearnerRegistry.check_state`, the checkpoint's own content check), rows finite
and of the basis' width. One bad configuration costs that configuration, not the peer.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from coeffd.daemon.publish.snapshot import (
    InvalidConfigurationIdError,
    coeffd_version,
    validate_config_id,
)
from coeffd.learners.features import TERM_NAMES
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.registry import LearnerRegistry

__all__ = [
    "FORMAT",
    "MAX_ROWS",
    "VERSION",
    "ConfigStatistics",
    "PeerStatistics",
    "StatisticsError",
    "StatisticsExporter",
    "export_statistics",
    "parse_statistics",
]

FORMAT = "coeffd.statistics"
VERSION = 1
#: Step rows sent per configuration: enough for a LOCO score (``FleetModel.min_rows`` is
#: 20), small enough that 32 peers × 4 configurations stay a few MB.
MAX_ROWS = 512

FloatArray = npt.NDArray[np.float64]


class StatisticsError(ValueError):
    """A statistics document this version cannot read (whole peer refused); ``reason`` is
    the metric label: ``version`` (another format version) or ``invalid``."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ConfigStatistics:
    """One configuration as one peer reported it (validated)."""

    config_id: str
    set_state: dict[str, Any]
    rows_x: FloatArray
    rows_y: FloatArray
    prequential: dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class PeerStatistics:
    """A peer's document: its configurations and what was wrong with the others."""

    wall_ns: int
    instance: dict[str, Any]
    configurations: dict[str, ConfigStatistics]
    #: configuration id (or a placeholder) → why it was skipped
    skipped: dict[str, str]


def export_statistics(
    registry: LearnerRegistry, instance: Mapping[str, Any], rows: int = MAX_ROWS
) -> bytes:
    """The document for every live configuration of ``registry`` (learners' thread)."""
    configurations: dict[str, Any] = {}
    for cid in registry.ids():
        ls = registry.get(cid)
        if ls is None or ls.observations == 0:
            continue
        x, y = ls.baseline.rows()
        ev = registry.evaluator
        configurations[cid] = {
            "set": ls.state_dict(),
            "rows": {"x": x[-rows:].tolist(), "y": y[-rows:].tolist()},
            "prequential": {t: _all_only(ev.summary(cid, t)) for t in ev.targets(cid)},
        }
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "wall_ns": time.time_ns(),
        "instance": dict(instance) | {"coeffd_version": coeffd_version()},
        "configurations": configurations,
    }
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _all_only(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    return {src: dict(regimes["all"]) for src, regimes in summary.items() if "all" in regimes}


def parse_statistics(body: bytes, registry: LearnerRegistry) -> PeerStatistics:
    """Validate a peer's document; raises :class:`StatisticsError` for the whole peer.

    ``registry`` gives the settings and model resolver the learner states are checked
    against (the query tier's own).
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise StatisticsError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StatisticsError(f"not a {FORMAT} document")
    if doc.get("version") != VERSION:
        raise StatisticsError(
            f"version {doc.get('version')!r}; this coeffd reads {VERSION}", reason="version"
        )
    configs, wall_ns, instance = doc.get("configurations"), doc.get("wall_ns"), doc.get("instance")
    if not isinstance(configs, dict) or not isinstance(wall_ns, int):
        raise StatisticsError("configurations / wall_ns missing")
    out: dict[str, ConfigStatistics] = {}
    skipped: dict[str, str] = {}
    for cid, entry in configs.items():
        try:
            out[cid] = _config(cid, entry, registry)
        except (InvalidConfigurationIdError, ValueError, TypeError, KeyError) as exc:
            name = cid if isinstance(cid, str) and len(cid) <= 128 else "<bad id>"
            skipped[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return PeerStatistics(wall_ns, instance if isinstance(instance, dict) else {}, out, skipped)


def _config(cid: str, entry: Any, registry: LearnerRegistry) -> ConfigStatistics:
    validate_config_id(cid)
    if not isinstance(entry, dict):
        raise TypeError("entry is not a map")
    state = entry["set"]
    registry.check_state({"sets": {cid: state}})
    if ServingConfig.from_dict(state["config"]).id != cid:
        raise ValueError("id does not match the configuration it describes")
    x = np.asarray(entry["rows"]["x"], dtype=float)
    y = np.asarray(entry["rows"]["y"], dtype=float)
    n = len(y)
    if n > MAX_ROWS or y.shape != (n,) or (n and x.shape != (n, len(TERM_NAMES))):
        raise ValueError(f"rows: expected at most {MAX_ROWS} rows of {len(TERM_NAMES)} terms")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError("rows: non-finite or non-positive values")
    pre = entry.get("prequential", {})
    clean: dict[str, dict[str, dict[str, float]]] = {}
    for target, sources in pre.items() if isinstance(pre, dict) else ():
        for source, s in sources.items() if isinstance(sources, dict) else ():
            vals = {k: s.get(k) for k in ("mape", "rmse", "n")} if isinstance(s, dict) else {}
            if all(isinstance(v, int | float) and math.isfinite(v) for v in vals.values()):
                clean.setdefault(str(target)[:64], {})[str(source)[:64]] = {
                    k: float(v) for k, v in vals.items() if v is not None
                }
    return ConfigStatistics(cid, state, x.reshape(n, len(TERM_NAMES)), y, clean)


class StatisticsExporter:
    """Rebuilds the document every ``interval_s`` on the learners' thread; HTTP threads
    read :attr:`latest` (one reference swap: no lock, never a half-built document)."""

    def __init__(self, registry: LearnerRegistry, interval_s: float = 5.0, name: str = "") -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.instance = {"name": name or socket.gethostname(), "started_wall_ns": time.time_ns()}
        self.latest: bytes | None = None
        self._due = 0.0

    def tick(self, now: float, force: bool = False) -> None:
        if force or now >= self._due:
            self._due = now + self.interval_s
            self.latest = export_statistics(self.registry, self.instance)
