"""The query tier: one view of every peer's learners (``coeffd serve --mode query``).

In the shape of Thanos Query over Prometheus sidecars: coeffd instances (sidecars beside
vLLM, or fleet replicas behind the Collector) keep learning where they are; the query
tier asks each of them for its learner statistics (``GET /v1/statistics``,
:mod:`.statistics`) every ``query.refresh_interval_seconds`` and serves the merged view
through the same API as any instance, so ``coeffd pull`` and BLIS have one place to ask.

Each refresh:

1. resolves the peer list (``dns+`` entries re-resolved: a headless Service's ready pods);
2. asks every peer (concurrently, bounded); a peer that answers garbage or another
   format version is skipped, counted (``coeffd_query_peer_errors_total{reason}``) and
   named in one log line when its state changes — it never fails the answer;
3. merges members of the same configuration id exactly (:mod:`learners.merge`: the
   information-form sums of their learners, each member's own forgetting applied) into a
   registry of its own, and publishes each merged estimate through the same
   ``to_snapshot`` and BLIS validation as an instance does, into its own snapshot store;
4. fits the fleet model over every configuration of every peer (rows pooled), publishes
   the ``fleet`` snapshot and answers ``/v1/predict`` for setups nobody deployed.

A peer that stops answering keeps its last statistics for ``query.peer_ttl_seconds``
(default 1 h), marked stale in every answer (``instances``), then leaves the view. The
last statistics of every peer are kept in the query tier's state directory, so a restart
of the query tier keeps the stale members too.

Two query replicas that see the same peers give the same answer: members are merged in
the order of their URLs and nothing depends on when a peer was first seen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import numpy as np
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coeffd.daemon.fleet import AnsweredSources, fleet_snapshot
from coeffd.daemon.learning.checkpoints import CheckpointError, CheckpointStore
from coeffd.daemon.publish.snapshot import ErrorStats, Snapshot, to_snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.query.config import QuerySettings
from coeffd.daemon.query.peers import (
    PeerClient,
    PeerError,
    parse_peers,
    resolve_peers,
)
from coeffd.daemon.query.statistics import (
    ConfigStatistics,
    PeerStatistics,
    StatisticsError,
    parse_statistics,
)
from coeffd.learners.config import LearnersConfig
from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.fleet.members import member_stats
from coeffd.learners.fleet.model import FleetModel
from coeffd.learners.fleet.results import FLEET_ID, Prediction
from coeffd.learners.merge import MergeError, merge_set_states
from coeffd.learners.prior import PooledPrior
from coeffd.learners.registry import LearnerRegistry

__all__ = ["FleetView", "Instance"]

log = structlog.get_logger(__name__)

STATISTICS_PATH = "/v1/statistics"


@dataclass(frozen=True)
class Instance:
    """One peer as the view knows it."""

    url: str
    last_seen_wall_ns: int
    stale: bool
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "peer": self.url,
            "last_seen_wall_ns": self.last_seen_wall_ns,
            "stale": self.stale,
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class _Answer:
    body: bytes
    stats: PeerStatistics


@dataclass
class _Peer:
    url: str
    body: bytes
    stats: PeerStatistics
    last_seen: float  # wall s of the last good answer
    error: str | None = None  # why the last ask failed (None: answered)

    def stale(self, now: float, live_s: float) -> bool:
        """Its statistics are not fresh: the last ask failed, or it answered too long ago."""
        return self.error is not None or now - self.last_seen > live_s


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry
        self.peers = Gauge(
            "coeffd_query_peers", "Peers in the query tier's view", ["state"], registry=r
        )
        self.errors = Counter(
            "coeffd_query_peer_errors_total",
            "Peer answers skipped (unreachable, http_error, too_large, invalid, version)",
            ["reason"],
            registry=r,
        )
        for reason in ("unreachable", "http_error", "too_large", "invalid", "version", "dns"):
            self.errors.labels(reason)
        self.configs = Gauge(
            "coeffd_query_peer_configurations",
            "Configurations each peer reports",
            ["peer"],
            registry=r,
        )
        self.merge = Histogram(
            "coeffd_query_merge_duration_seconds",
            "One refresh's merge, publish and fleet fit (after the peers answered)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.members = Gauge(
            "coeffd_query_configuration_instances",
            "Instances contributing to each merged configuration",
            ["config"],
            registry=r,
        )


class FleetView:
    """Peers' statistics → merged learners → snapshots and fleet model (module docs)."""

    def __init__(
        self,
        settings: QuerySettings,
        learners: LearnersConfig,
        store: SnapshotStore,
        *,
        resolver: BasisResolver | None = None,
        state: CheckpointStore | None = None,
        metrics: CollectorRegistry | None = None,
        client: PeerClient | None = None,
        clock: Callable[[], float] = time.time,
        save_interval_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self.learners = learners
        self.store = store
        self.resolver = resolver or BasisResolver()
        self.sources = parse_peers(settings.peers, dns_scheme=settings.dns_scheme)
        self.client = client or PeerClient(settings.client)
        self.state = state
        self.metrics = _Metrics(metrics)
        self._clock = clock
        self._peers: dict[str, _Peer] = {}
        self._failing: dict[str, str] = {}  # url → reason, for one log line per change
        self._due = 0.0
        self.save_interval_s = save_interval_s
        self._save_due = 0.0
        #: The fleet model of the last refresh (``/v1/predict``); swapped, never mutated.
        self.model: FleetModel | None = None
        #: configuration id → the instances merged into it (read by the API's threads)
        self._instances: dict[str, tuple[Instance, ...]] = {}
        self._fleet_last: Snapshot | None = None
        self._answered = AnsweredSources()  # an unseen setup keeps its source across refits
        self.refreshes = 0

    # ------------------------------------------------------------ state across restarts
    def restore(self) -> int:
        """Load the peers' last statistics from the state dir; how many peers came back."""
        if self.state is None:
            return 0
        try:
            restored = self.state.restore()
        except (CheckpointError, OSError) as exc:
            log.warning("query state not restored", error=str(exc))
            return 0
        if restored is None:
            return 0
        scratch = self._scratch_registry()
        peers = restored.state.get("peers", {}) if isinstance(restored.state, dict) else {}
        for url, entry in peers.items():
            try:
                body = bytes(entry["body"])
                stats = parse_statistics(body, scratch)
                self._peers[url] = _Peer(url, body, stats, float(entry["last_seen"]), "restored")
            except (StatisticsError, KeyError, TypeError, ValueError) as exc:
                log.warning("query state: peer not restored", peer=url, error=str(exc)[:200])
        if self._peers:
            self._rebuild(self._clock())
        return len(self._peers)

    def _save(self) -> None:
        if self.state is None:
            return
        peers = {u: {"body": p.body, "last_seen": p.last_seen} for u, p in self._peers.items()}
        try:
            self.state.save({"peers": peers})
        except OSError as exc:
            log.warning("query state not saved", error=str(exc))

    # ------------------------------------------------------------------- refreshing
    def tick(self, now: float) -> None:
        """Refresh when due (the pipeline worker calls this about once a second)."""
        if now >= self._due:
            self._due = now + self.settings.refresh_interval_seconds
            self.refresh(now)

    def refresh(self, now: float | None = None) -> None:
        """Ask every peer, merge, publish (see module docs)."""
        now = self._clock() if now is None else now
        urls, dns_errors = resolve_peers(self.sources)
        for line in dns_errors:
            self.metrics.errors.labels("dns").inc()
            self._note_failure(line.split(":", 1)[0], "dns", line)
        scratch = self._scratch_registry()
        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            answers = list(pool.map(lambda u: self._ask(u, scratch), urls))
        for url, answer in zip(urls, answers, strict=True):
            if isinstance(answer, _Answer):
                body, stats = answer.body, answer.stats
                self._peers[url] = _Peer(url, body, stats, now)
                if self._failing.pop(url, None) is not None:
                    log.info("peer answering again", peer=url)
                for cid, why in stats.skipped.items():
                    log.warning("peer configuration skipped", peer=url, config=cid, reason=why)
            else:
                reason, detail = answer
                self.metrics.errors.labels(reason).inc()
                self._note_failure(url, reason, detail)
                if url in self._peers:
                    self._peers[url].error = f"{reason}: {detail}"[:300]
        ttl = self.settings.peer_ttl_seconds
        for url in [u for u, p in self._peers.items() if now - p.last_seen > ttl]:
            log.warning("peer expired from the view", peer=url, ttl_s=ttl)
            del self._peers[url]
            self.metrics.configs.remove(url)
        self._rebuild(now)
        if now >= self._save_due:  # a restart loses at most this much of the peers' past
            self._save_due = now + self.save_interval_s
            self._save()
        self.refreshes += 1

    def _ask(self, url: str, scratch: LearnerRegistry) -> _Answer | tuple[str, str]:
        try:
            body = self.client.get(url, STATISTICS_PATH)
            return _Answer(body, parse_statistics(body, scratch))
        except PeerError as exc:
            return exc.reason, exc.detail
        except StatisticsError as exc:
            return exc.reason, str(exc)[:300]

    def _note_failure(self, url: str, reason: str, detail: str) -> None:
        if self._failing.get(url) != reason:
            self._failing[url] = reason
            log.warning("peer skipped", peer=url, reason=reason, detail=detail[:300])

    def _scratch_registry(self) -> LearnerRegistry:
        return LearnerRegistry(self.learners, resolver=self.resolver)

    # ---------------------------------------------------------------------- merging
    def _rebuild(self, now: float) -> None:
        t0 = time.perf_counter()
        ttl_live = self.settings.refresh_interval_seconds * 2.5
        # the gauge before the answers: once an answer names a peer stale, a scrape does
        # too (set after the fleet fit, it lagged the answers by that fit's duration)
        stale = sum(1 for p in self._peers.values() if p.stale(now, ttl_live))
        self.metrics.peers.labels("up").set(len(self._peers) - stale)
        self.metrics.peers.labels("stale").set(stale)
        members: dict[str, list[tuple[str, ConfigStatistics]]] = {}
        for url in sorted(self._peers):
            peer = self._peers[url]
            self.metrics.configs.labels(url).set(len(peer.stats.configurations))
            for cid, cs in peer.stats.configurations.items():
                members.setdefault(cid, []).append((url, cs))
        registry = self._scratch_registry()
        instances: dict[str, tuple[Instance, ...]] = {}
        rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        prequential: dict[str, dict[str, dict[str, ErrorStats]]] = {}
        for cid in sorted(members):
            group = members[cid]
            try:
                merged = merge_set_states([cs.set_state for _, cs in group])
            except (MergeError, KeyError, TypeError, ValueError) as exc:
                self.metrics.errors.labels("invalid").inc()
                log.warning("configuration not merged", config=cid, error=str(exc)[:300])
                continue
            registry.load_state({"sets": {cid: merged}})
            registry.ensure(ServingConfig.from_dict(merged["config"]))
            instances[cid] = tuple(
                Instance(
                    url,
                    int(self._peers[url].last_seen * 1e9),
                    stale=self._peers[url].stale(now, ttl_live),
                    error=self._peers[url].error,
                )
                for url, _ in group
            )
            rows[cid] = (
                np.concatenate([cs.rows_x for _, cs in group]),
                np.concatenate([cs.rows_y for _, cs in group]),
            )
            prequential[cid] = merge_prequential([cs.prequential for _, cs in group])
            self.metrics.members.labels(cid).set(len(group))
        for cid in registry.ids():
            self._publish(registry, cid, prequential[cid])
        self._instances = instances
        self.model = self._fit_fleet(registry, rows)
        self.metrics.merge.observe(time.perf_counter() - t0)

    def _publish(
        self, registry: LearnerRegistry, cid: str, prequential: dict[str, dict[str, ErrorStats]]
    ) -> None:
        est = registry.estimate(cid)
        registry.pool(est)
        ls = registry.get(cid)
        description = ls.config.to_dict() if ls is not None else {}
        previous = self.store.latest(cid)
        snap = to_snapshot(est, previous.version + 1 if previous else 1, description)
        snap = msgspec.structs.replace(snap, prequential=prequential or snap.prequential)
        if previous is not None and (previous.alpha, previous.beta) == (snap.alpha, snap.beta):
            return  # the same numbers: no new version
        self.store.publish(snap)

    def _fit_fleet(
        self, registry: LearnerRegistry, rows: Mapping[str, tuple[np.ndarray, np.ndarray]]
    ) -> FleetModel | None:
        members = []
        for cid in registry.ids():
            ls = registry.get(cid)
            m = member_stats(ls) if ls is not None else None
            if m is None:
                continue
            x, y = rows.get(cid, (None, None))
            members.append(
                replace(
                    m,
                    rows_x=x if y is not None and len(y) else None,
                    rows_y=y if y is not None and len(y) else None,
                )
            )
        if not members:
            return None
        src = registry.beta_pool
        pool = PooledPrior(src.default.tolist(), src.strength, src.floor)
        pool.load_state(src.state_dict())
        s = registry.settings
        model = FleetModel(
            members,
            pool=pool,
            strength=s.prior_strength,
            quirk=s.fleet_quirk,
            floor=s.prior_scale_floor,
        )
        result = model.result()
        if len(model) >= 2:
            previous = self._fleet_last or self.store.latest(FLEET_ID)
            if previous is None or (previous.alpha, previous.beta) != (result.alpha, result.beta):
                snap = fleet_snapshot(result, previous.version + 1 if previous else 1)
                self.store.publish(snap)
                self._fleet_last = snap
        return model

    # ------------------------------------------- the pipeline's consumer (query mode)
    def consume(self, records: Sequence[Any]) -> None:
        """Nothing is received in query mode; a record that arrives is ignored."""

    def close(self) -> None:
        """Keep the peers' last statistics for the next start."""
        self._save()

    def readiness(self) -> str | None:
        """Ready once the peers were asked (even if none answered: stale views serve)."""
        return None if self.refreshes or self._peers else "peers not asked yet"

    # ------------------------------------------------------------------- answering
    def predict(self, description: Mapping[str, Any]) -> Prediction | None:
        """The fleet model's prediction (``/v1/predict``), None before the first refresh."""
        model = self.model
        return None if model is None else self._answered.predict(model, description)

    def instances(self, config_id: str) -> list[dict[str, Any]] | None:
        """Who contributed to a configuration's answer (``fleet``: every peer)."""
        if config_id == FLEET_ID:
            seen: dict[str, Instance] = {}
            for group in self._instances.values():
                for inst in group:
                    seen.setdefault(inst.url, inst)
            return [seen[u].as_dict() for u in sorted(seen)]
        found = self._instances.get(config_id)
        return None if found is None else [i.as_dict() for i in found]


def merge_prequential(
    members: Sequence[Mapping[str, Mapping[str, Mapping[str, float]]]],
) -> dict[str, dict[str, ErrorStats]]:
    """Members' prequential errors per target and source, weighted by their counts
    (MAPE: the mean of the members' means; RMSE: the root of the mean square).

    >>> merge_prequential([{"step_period": {"learned": {"mape": 0.02, "rmse": 3.0, "n": 100}}},
    ...                    {"step_period": {"learned": {"mape": 0.04, "rmse": 4.0, "n": 300}}}])
    {'step_period': {'learned': ErrorStats(mape=0.035, rmse=3.774917217635375, count=400)}}
    """
    sums: dict[tuple[str, str], list[float]] = {}
    for m in members:
        for target, sources in m.items():
            for source, s in sources.items():
                n = float(s.get("n", 0.0))
                if n <= 0:
                    continue
                acc = sums.setdefault((target, source), [0.0, 0.0, 0.0])
                acc[0] += n
                acc[1] += n * float(s.get("mape", math.nan))
                acc[2] += n * float(s.get("rmse", math.nan)) ** 2
    out: dict[str, dict[str, ErrorStats]] = {}
    for (target, source), (n, mape, sq) in sorted(sums.items()):
        mean, rmse = mape / n, math.sqrt(sq / n)
        out.setdefault(target, {})[source] = ErrorStats(
            mape=mean if math.isfinite(mean) else None,
            rmse=rmse if math.isfinite(rmse) else None,
            count=int(n),
        )
    return out
