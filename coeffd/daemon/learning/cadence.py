"""The publish cadence: when a configuration's learners have moved enough (the
:class:`~daemon.publish.policy.PublishPolicy`), a new :class:`Snapshot` goes to the
writer thread, and the learning gauges (MAPE, drift, coefficients) follow.

A heartbeat (the policy's ``interval`` or ``unchanged`` reasons) republishes the numbers
users already have with fresh provenance; a configuration still below the policy's
minimum of observations is a cold start, not counted against freshness.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.learning.freshness import Freshness
from coeffd.daemon.learning.metrics import SOURCES, ServeMetrics
from coeffd.daemon.publish.policy import PublishPolicy
from coeffd.daemon.publish.snapshot import Snapshot, to_snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.writer import Writer
from coeffd.learners.estimates import ConfigEstimate
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.registry import LearnerRegistry

__all__ = ["Pending", "Publisher"]

log = structlog.get_logger(__name__)


@dataclass
class Pending:
    """Per configuration: what the next snapshot will include."""

    first_arrival: float | None = None  # of the oldest observation not yet published
    first_step_arrival: float | None = None  # of that observation's step summary
    last_published_version: int = -1
    drift_seen: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False, kw_only=True)
class Publisher:
    """Snapshots and learning gauges on the publish cadence (the pipeline worker's).

    ``configs`` is the consumer's map of configuration id → what it stands for (the
    snapshot's description).
    """

    registry: LearnerRegistry
    metrics: ServeMetrics
    store: SnapshotStore | None
    policy: PublishPolicy
    writer: Writer
    freshness: Freshness
    configs: dict[str, ServingConfig]
    fleet: FleetPublisher | None = None
    #: what telemetry says about a configuration's engine beyond its id's fields (the KV
    #: size of its step summaries: ``blis-args`` prints it as ``--total-kv-blocks``)
    engine_facts: Callable[[str], dict[str, Any]] | None = None
    #: snapshots handed to the writer
    published: int = 0
    _pending: dict[str, Pending] = field(default_factory=dict)
    _last: dict[str, Snapshot] = field(default_factory=dict)  # last handed to the writer
    _next_version: dict[str, int] = field(default_factory=dict)
    #: observations behind the numbers last published (not a heartbeat's)
    _fitted_on: dict[str, int] = field(default_factory=dict)

    def pending(self, cid: str, now: float) -> Pending:
        """What the next snapshot of ``cid`` includes (it has learned something new)."""
        p = self._pending.get(cid)
        if p is None:
            p = self._pending[cid] = Pending()
        if p.first_arrival is None:
            p.first_arrival = now
        return p

    def publish_due(self, now: float, force: bool = False) -> None:
        """Publish every configuration whose learners moved and whose policy says so."""
        for cid in self.registry.ids():
            ls = self.registry.get(cid)
            p = self._pending.get(cid)
            if ls is None or p is None or ls.version == p.last_published_version:
                continue
            cs = self.registry.estimate(cid)
            self.registry.pool(cs)
            self._export_gauges(cs, p)
            if self.store is not None:
                self._publish(cs, p, now, force)

    def _export_gauges(self, cs: ConfigEstimate, p: Pending) -> None:
        cid = cs.config_id
        for target, summary in cs.errors.items():
            for source, regimes in summary.items():
                s = regimes.get("all")
                if source in SOURCES and s and math.isfinite(s.get("mape", math.nan)):
                    self.metrics.mape.labels(cid, target, source).set(s["mape"])
        for regime, value in cs.step_time_rel_std.items():
            if math.isfinite(value):
                self.metrics.step_time_std.labels(cid, regime).set(value)
        for name, vec in cs.vectors.items():
            seen = p.drift_seen.get(name, 0)
            if vec.drift_detections > seen:
                target = "step_period" if name.startswith("beta") else name
                self.metrics.drift.labels(cid, target).inc(vec.drift_detections - seen)
                p.drift_seen[name] = vec.drift_detections

    def _publish(self, cs: ConfigEstimate, p: Pending, now: float, force: bool) -> None:
        assert self.store is not None
        cid = cs.config_id
        previous = self._last.get(cid)
        if previous is None and cid not in self._next_version:
            previous = self.store.latest(cid)  # after a restart: what is on disk
        now_ns = int(now * 1e9)
        beta = cs.vectors.get("beta")
        learned = beta.observations if beta is not None else 0
        fitted_on = self._fitted_on.get(cid)
        if fitted_on is None and previous is not None:
            fitted_on = self._fitted_on_disk(previous)  # after a restart
            if fitted_on is not None:
                self._fitted_on[cid] = fitted_on
        ok, reason = self.policy.decide(
            previous, cs.alpha, cs.beta, now_ns, cs.observations, cs.recent_terms,
            learned, fitted_on,
        )  # fmt: skip
        if reason == "invalid":
            # The registry only hands out valid vectors; refusing here is the last guard.
            self.metrics.publish_refused.labels(cid).inc()
            log.error("refusing to publish invalid coefficients", config=cid)
            return
        if reason == "too_few_observations":
            # Cold start, not staleness: what arrives before a configuration can be
            # published at all is not counted against freshness.
            p.first_arrival = p.first_step_arrival = None
            return
        if not ok and not (force and reason == "unchanged"):
            return
        cfg = self.configs.get(cid)
        description = cfg.to_dict() if cfg is not None else {}
        if self.engine_facts is not None:
            description |= self.engine_facts(cid)
        version = self._next_version.get(cid) or self.store.next_version(cid)
        self._next_version[cid] = version + 1
        snap = to_snapshot(cs, version, description)
        if previous is not None and reason in ("interval", "unchanged"):
            # a heartbeat: fresh provenance, the numbers users already have (and what they
            # were fitted on: a restart must not take this version's larger count for it)
            snap = msgspec.structs.replace(
                snap, alpha=previous.alpha, beta=previous.beta, fitted_on=fitted_on
            )
        else:
            snap = msgspec.structs.replace(snap, fitted_on=learned)
            self._fitted_on[cid] = learned
        self._last[cid] = snap
        self.freshness.handed(cid, version, p.first_arrival, p.first_step_arrival)
        self.writer.submit_snapshot(snap)
        self.published += 1
        p.first_arrival = p.first_step_arrival = None
        ls = self.registry.get(cid)
        p.last_published_version = ls.version if ls is not None else -1
        for i, val in enumerate(snap.alpha):
            self.metrics.coefficient.labels(cid, "alpha", str(i)).set(val)
        for i, val in enumerate(snap.beta):
            self.metrics.coefficient.labels(cid, "beta", str(i)).set(val)

    def _fitted_on_disk(self, latest: Snapshot) -> int | None:
        """The β observations behind the numbers of ``latest`` (the newest on disk).

        Its ``fitted_on``; in a snapshot written before that was recorded, the
        ``observations`` of the oldest retained version in the run of versions that ends
        at ``latest`` with the same numbers: the one that published them (a heartbeat's
        own count is larger, and would hold back the first ``refined`` version).
        """
        if latest.fitted_on is not None:
            return latest.fitted_on
        assert self.store is not None
        origin = latest
        for snap in reversed(self.store.history(latest.config_id)):
            if snap.version > latest.version:
                continue
            if (snap.alpha, snap.beta) != (latest.alpha, latest.beta):
                break
            origin = snap
        return origin.observations.get("beta")

    def publish_fleet(self, now: float, force: bool = False) -> None:
        """Refit the fleet model on its own cadence and publish it (snapshot ``fleet``)."""
        if self.fleet is None:
            return
        snap = self.fleet.tick(now, self.store, force=force)
        if snap is None:
            return
        self.writer.submit_snapshot(snap)
        self.published += 1
        for name, values in (("alpha", snap.alpha), ("beta", snap.beta)):
            for i, val in enumerate(values):
                self.metrics.coefficient.labels(snap.config_id, name, str(i)).set(val)
