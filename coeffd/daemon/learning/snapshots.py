"""The registry's view of one configuration → a publishable :class:`Snapshot`."""

from __future__ import annotations

import math
import time
from typing import Any

from coeffd.daemon.publish.snapshot import ConfigurationRef, DriftEvent, ErrorStats, Snapshot
from coeffd.learners.snapshots import ConfigSnapshot
from coeffd.learners.steady import TERM_HINTS

__all__ = ["to_snapshot"]


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


def to_snapshot(cs: ConfigSnapshot, version: int, description: dict[str, Any]) -> Snapshot:
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
        DriftEvent(
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
