"""The serve consumer: records → joiner → learners, on the pipeline worker.

It is the one :class:`~daemon.pipeline.Consumer` the pipeline worker drives, so nothing here
needs a lock: the joiner, the learner registry, the snapshot store writer and the
checkpoint writer all live on the worker thread. Readers (HTTP API, ``coeffd pull``,
BLIS) only ever see files that were written atomically.

This module routes observations to the learners; its neighbours do the rest: which
configuration a source belongs to (:mod:`.configs`), the publish cadence
(:mod:`.cadence`), checkpoints and write health (:mod:`.checkpoints`), freshness
(:mod:`.freshness`) and the metric families (:mod:`.metrics`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import structlog

from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.learning.cadence import Publisher
from coeffd.daemon.learning.checkpoints import Checkpointer, CheckpointStore, WriteHealth
from coeffd.daemon.learning.configs import ConfigResolver
from coeffd.daemon.learning.freshness import Freshness
from coeffd.daemon.learning.metrics import SOURCES, ServeMetrics, describe_configuration
from coeffd.daemon.learning.requests import RequestRing
from coeffd.daemon.load import EngineSampler, LoadController, LoadShedder
from coeffd.daemon.publish.policy import PublishPolicy
from coeffd.daemon.publish.snapshot import Snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.query.statistics import StatisticsExporter
from coeffd.daemon.writer import Writer
from coeffd.joiner import Joiner
from coeffd.learners.estimates import RequestScores, Scored, StepScores
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.registry import LearnerRegistry
from coeffd.learners.targets import ALPHA_TARGETS
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import Record
from coeffd.records.observations import (
    KVTransferObservation,
    Observation,
    RequestObservation,
    StepObservation,
)

__all__ = ["LearningConsumer"]

log = structlog.get_logger(__name__)


class LearningConsumer:
    """joiner → learner registry → snapshots / checkpoints / metrics (one worker thread)."""

    def __init__(
        self,
        *,
        joiner: Joiner,
        registry: LearnerRegistry,
        metrics: ServeMetrics,
        resolver: ConfigResolver,
        store: SnapshotStore | None = None,
        checkpoints: CheckpointStore | None = None,
        policy: PublishPolicy | None = None,
        checkpoint_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        live: bool = True,
        load: LoadController,
        fleet: FleetPublisher | None = None,
        statistics: StatisticsExporter | None = None,
        requests: RequestRing | None = None,
    ) -> None:
        self.joiner = joiner
        #: every configuration's finished requests and KV size, for ``coeffd trace``
        self.requests = requests if requests is not None else RequestRing()
        self.registry = registry
        self.metrics = metrics
        self.resolver = resolver
        # Live telemetry's wall clocks track ours, so an idle engine's last steps are
        # finalized once the window has passed in real time; a replay of old files must
        # run on the data's own time (its watermarks) or everything would expire at once.
        self.live = live
        self._clock = clock
        #: set by the demo: build :meth:`live_rows` at each tick (serve does not pay for it)
        self.live_view = False
        self._live_rows: list[dict[str, Any]] = []
        #: What is decoded, joined and learned under load: the consumer steers it from
        #: the worker and asks it which requests to learn; the joiner asks it too (it was
        #: handed the same controller at construction: ``Joiner(load=...)``).
        self.load = load
        if joiner.load is not load:
            raise ValueError("the joiner and the consumer need the same load controller")
        #: configuration id → what it stands for (checkpointed, described in snapshots)
        self._configs: dict[str, ServingConfig] = {}
        self.health = WriteHealth(metrics)
        self.freshness = Freshness(metrics)
        # File writes (fsync) happen on the writer's thread, never on the pipeline worker.
        self.writer = Writer(
            store,
            checkpoints,
            on_written=self._written,
            on_refused=lambda snap, why: self.metrics.publish_refused.labels(snap.config_id).inc(),
            on_checkpoint=self.health.checkpointed,
            on_failed=self.health.failed,
        )
        self.publisher = Publisher(
            registry=registry,
            metrics=metrics,
            store=store,
            policy=policy or PublishPolicy(interval_s=1.0, relative_threshold=0.02),
            writer=self.writer,
            freshness=self.freshness,
            configs=self._configs,
            fleet=fleet,
            engine_facts=self.requests.facts,
        )
        self.checkpointer = Checkpointer(
            store=checkpoints,
            registry=registry,
            metrics=metrics,
            configs=self._configs,
            writer=self.writer,
            interval_s=checkpoint_interval_s,
            clock=clock,
        )
        # KV transfers of engines whose spans have not been seen yet (bounded, oldest out).
        self._unresolved_kv: collections.deque[KVTransferObservation] = collections.deque(
            maxlen=10_000
        )
        self.records = 0
        self.observations = 0
        # One observation at a time (finished requests, KV transfers) is counted here and
        # put into the metric families at the tick (flush_metrics): a labelled counter's
        # and a histogram's update cost more than learning the observation's α.
        self._learned: dict[tuple[str, str], int] = {}
        self._errors: dict[tuple[str, str, str], list[float]] = {}
        #: Whether :meth:`restore` found learner state of an earlier run.
        self.restored = False
        #: The fleet model (snapshot ``fleet``, ``/v1/predict``), refitted on its cadence.
        self.fleet = fleet
        #: ``/v1/statistics`` for a query tier, rebuilt on its cadence on this thread.
        self.statistics = statistics

    # ------------------------------------------------------------------ state
    def restore(self) -> bool:
        """Load the newest good checkpoint (if any); True when state was restored."""
        if self.checkpointer.restore():
            self.restored = True
        return self.restored

    def checkpoint(self) -> None:
        """Checkpoint the learners' state now (see :class:`.checkpoints.Checkpointer`)."""
        self.checkpointer.checkpoint()

    def checkpoint_problem(self) -> str | None:
        """Readiness: why the last checkpoint write failed (None when it worked)."""
        return self.health.checkpoint_problem()

    def snapshot_problem(self) -> str | None:
        """Readiness: the configurations whose last snapshot write failed (None if none)."""
        return self.health.snapshot_problem()

    def publish_due(self, now: float, force: bool = False) -> None:
        """Publish every configuration whose learners moved and whose policy says so."""
        self.publisher.publish_due(now, force)

    @property
    def published(self) -> int:
        """Snapshots handed to the writer (configurations and the fleet model)."""
        return self.publisher.published

    def _written(self, snap: Snapshot, at: float) -> None:
        """Writer thread: a snapshot is on disk."""
        self.health.written(snap)
        self.freshness.written(snap, at)

    # ------------------------------------------------- load (the controller's)
    @property
    def shedder(self) -> LoadShedder | None:
        """The load controller's step/request share."""
        return self.load.shedder

    @property
    def sampler(self) -> EngineSampler | None:
        """The load controller's engine share."""
        return self.load.sampler

    @sampler.setter
    def sampler(self, sampler: EngineSampler | None) -> None:
        self.load.sampler = sampler

    @property
    def backlog(self) -> Callable[[], float] | None:
        """The load controller's backlog signal (queue fill 0..1)."""
        return self.load.backlog

    @backlog.setter
    def backlog(self, signal: Callable[[], float] | None) -> None:
        self.load.backlog = signal

    @property
    def decoders(self) -> list[Decoder]:
        """The decoders the load controller hands its step filter to."""
        return self.load.decoders

    @property
    def shed(self) -> int:
        """Steps neither joined nor learned (load shedding): the joiner's tally."""
        return self.load.shed_total["step"]

    @property
    def shed_requests(self) -> int:
        """Request observations built but not learned (load shedding)."""
        return self.load.shed_total["request"]

    # --------------------------------------------------------------- consumer
    def consume(self, records: Sequence[Record]) -> None:
        """Join a batch of records and learn every observation it completes."""
        self.records += len(records)
        now = self._clock()
        self.freshness.arrived(records, now, self.load.step_filter)
        self.load.steer()
        self._learn(self.joiner.push_many(records), now)
        self.load.count()

    def tick(self, now: float) -> None:
        """Expire join state, publish what is due, checkpoint on cadence."""
        t0 = time.perf_counter()
        try:
            self._tick(now)
        finally:
            self.load.observe_tick(time.perf_counter() - t0)

    def _tick(self, now: float) -> None:
        self.load.steer()
        self.load.gauge_engines()
        self._learn(self.joiner.tick(int(now * 1e9) if self.live else None), now)
        self.load.count()
        self.flush_metrics()
        self.publisher.publish_due(now)
        self.publisher.publish_fleet(now)
        if self.checkpointer.due(now):
            self.checkpointer.checkpoint()
        if self.statistics is not None:
            self.statistics.tick(now)
        if self.live_view:
            self._live_rows = self._rows_now()

    def close(self) -> None:
        """Flush the joiner, learn the rest, publish and checkpoint a last time."""
        now = self._clock()
        self.load.steer()
        self._learn(self.joiner.flush(), now)
        self.load.count()
        self.flush_metrics()
        self.publisher.publish_due(now, force=True)
        self.publisher.publish_fleet(now, force=True)
        if self.records:
            # Nothing consumed: what is on disk already is this state, and a start that
            # failed (a port in use) must leave no files behind.
            self.checkpointer.checkpoint()
        if self.statistics is not None:
            self.statistics.tick(now, force=True)
        if self.live_view:
            self._live_rows = self._rows_now()
        self.writer.close()
        log.info(
            "learning consumer closed",
            records=self.records,
            observations=self.observations,
            snapshots_published=self.published,
            configurations=len(self.registry),
            unresolved_kv=len(self._unresolved_kv),
        )

    # ---------------------------------------------------------------- learning
    def learn(self, observations: Iterable[Observation], now: float) -> None:
        """Learn the joiner's output (what :meth:`consume` and :meth:`tick` do with it):
        route each observation to its configuration's learners, score, count."""
        self._learn(observations, now)

    def flush_metrics(self) -> None:
        """Bring the learning metrics up to date with what was learned one observation at
        a time since the last call (each tick and :meth:`close` do)."""
        for (cid, target), n in self._learned.items():
            self.metrics.learner_observations.labels(cid, target).inc(n)
        self._learned.clear()
        for key, values in self._errors.items():
            self.metrics.relative_error.observe_many(key, np.array(values))
        self._errors.clear()

    def _learn(self, observations: Iterable[Observation], now: float) -> None:
        resolved_any = False
        # Step observations come in bursts (a joiner sweep): each configuration's are
        # learned in one vectorised call, the same computation as one by one.
        steps: dict[str, tuple[ServingConfig, list[StepObservation]]] = {}
        # Finished requests likewise: each configuration's in one loop (their α and
        # queue learners are not the step learners, so the order between them is free).
        requests: dict[str, tuple[ServingConfig, list[RequestObservation]]] = {}
        keep_request = self.load.keep_request if self.load.step_filter is not None else None
        resolve = self.resolver.resolve
        # A sweep's observations come in runs of one engine's (one Source object): its
        # configuration is resolved once a run (nothing else is resolved in between, so
        # the answer cannot change), not once an observation.
        last_source: object = None
        last_cfg: ServingConfig | None = None
        for obs in observations:
            source = obs.source
            if source is last_source:
                cfg = last_cfg
            else:
                cfg = resolve(source)
                last_source, last_cfg = (source, cfg) if cfg is not None else (None, None)
            if cfg is None:
                if isinstance(obs, KVTransferObservation):
                    if len(self._unresolved_kv) == self._unresolved_kv.maxlen:
                        self.metrics.unresolved.labels("kv_engine_unknown").inc()
                    self._unresolved_kv.append(obs)
                else:
                    self.metrics.unresolved.labels(self.resolver.reason(obs.source)).inc()
                continue
            resolved_any = True
            cid = cfg.id
            if cid not in self._configs:
                self._configs[cid] = cfg
                describe_configuration(self.metrics, cfg)
            if isinstance(obs, StepObservation):
                # the request ring notes the steps' KV size per burst (observe_steps)
                group = steps.get(cid)
                if group is None:
                    group = steps[cid] = (cfg, [])
                group[1].append(obs)
                continue
            self.requests.observe(cfg, obs)  # kept for coeffd trace, learned or shed
            if isinstance(obs, RequestObservation):
                if keep_request is None or keep_request(obs.request_id):
                    rgroup = requests.get(cid)
                    if rgroup is None:
                        rgroup = requests[cid] = (cfg, [])
                    rgroup[1].append(obs)
                continue
            scored = self.registry.learn(cfg, obs)
            if scored:
                self.observations += 1
                self.publisher.pending(cid, now)
                for s in scored:
                    self._record(cid, s)
        for cid, (cfg, reqs) in requests.items():
            rscores = self.registry.learn_request_scores(cfg, reqs)
            if rscores.learned:
                self.observations += rscores.learned
                self.publisher.pending(cid, now)
                self._record_requests(cid, rscores)
        for cid, (cfg, batch) in steps.items():
            self.requests.observe_steps(cfg, batch)  # kept for coeffd trace, learned or shed
            skipped = self.registry.approximate_skipped
            scores = self.registry.learn_step_scores(cfg, batch)
            self.metrics.approximate.inc(self.registry.approximate_skipped - skipped)
            if scores is None or not len(scores):
                continue
            self.observations += len(scores)
            p = self.publisher.pending(cid, now)
            t = self.freshness.first_step_arrival(batch)
            if t is not None and (p.first_step_arrival is None or t < p.first_step_arrival):
                p.first_step_arrival = t
            self._record_steps(cid, scores)
        self.metrics.configurations.set(len(self.registry))
        if resolved_any and self._unresolved_kv:
            self._retry_kv(now)

    def _retry_kv(self, now: float) -> None:
        pending = list(self._unresolved_kv)
        self._unresolved_kv.clear()
        ready: list[KVTransferObservation] = []
        for o in pending:
            if self.resolver.resolve(o.source) is not None:
                ready.append(o)
            else:
                self._unresolved_kv.append(o)
        if ready:
            self._learn(ready, now)

    def _record(self, cid: str, s: Scored) -> None:
        key = (cid, s.target)
        self._learned[key] = self._learned.get(key, 0) + 1
        y = s.y
        if not (y > 0 and math.isfinite(y)):
            return
        for source, yhat in s.predictions.items():
            if source not in SOURCES or yhat is None or not math.isfinite(yhat):
                continue
            errors = self._errors.get((cid, s.target, source))
            if errors is None:
                errors = self._errors[(cid, s.target, source)] = []
            errors.append(abs(y - yhat) / y)

    def _record_requests(self, cid: str, scores: RequestScores) -> None:
        """:meth:`_record` for a burst of finished requests' scores (tuples, not
        :class:`Scored`: the same counts and errors, in the same order). A burst holds
        a few targets: each one's count and error lists are found once, not per row."""
        counts, errors = self._learned, self._errors
        isfinite = math.isfinite
        by_target: dict[str, tuple[list[int], list[float], list[float]]] = {}
        for target, y, learned, default in scores.rows:
            ent = by_target.get(target)
            if ent is None:
                ent = by_target[target] = ([0], [], [])
            ent[0][0] += 1
            if not (y > 0 and isfinite(y)):
                continue
            if learned is not None and isfinite(learned):
                ent[1].append(abs(y - learned) / y)
            if default is not None and isfinite(default):
                ent[2].append(abs(y - default) / y)
        for target, (n, rel_learned, rel_default) in by_target.items():
            key = (cid, target)
            counts[key] = counts.get(key, 0) + n[0]
            for source, rel in (("learned", rel_learned), ("blis_default", rel_default)):
                if rel:
                    rows = errors.get((cid, target, source))
                    if rows is None:
                        errors[(cid, target, source)] = rel
                    else:
                        rows.extend(rel)

    def _record_steps(self, cid: str, scored: StepScores) -> None:
        """:meth:`_record` for a burst of step scores (one histogram update per source)."""
        self.metrics.learner_observations.labels(cid, "step_period").inc(len(scored))
        y = scored.y
        good = (y > 0) & np.isfinite(y)
        for source in SOURCES:
            yhat = scored.predictions.get(source)
            if yhat is None:
                continue
            ok = good & np.isfinite(yhat)
            if ok.any():
                rel = np.abs(y[ok] - yhat[ok]) / y[ok]
                self.metrics.relative_error.observe_many((cid, "step_period", source), rel)

    # ---------------------------------------------------------------- views
    def live_rows(self) -> list[dict[str, Any]]:
        """One row per configuration for a compact live view (demo), as of the last tick
        (or close) with ``live_view`` set. Any thread may call this: the rows are built on
        the worker thread, which owns the registry (reading it from another thread raced
        with learning: "dictionary changed size during iteration")."""
        return self._live_rows

    def _rows_now(self) -> list[dict[str, Any]]:
        rows = []
        ev = self.registry.evaluator
        for cid in self.registry.ids():
            ls = self.registry.get(cid)
            if ls is None:
                continue
            drift = sum(m.drift.detections for m in ls.learners.values() if m.drift is not None)
            alpha = self.registry.estimate(cid).alpha
            rows.append(
                {
                    "config": cid,
                    "label": ls.config.short_label,
                    "observations": ls.observations,
                    "step_mape": ev.mape(cid, "step_period", "learned"),
                    "step_mape_default": ev.mape(cid, "step_period", "blis_default"),
                    "alpha_mape": [ev.mape(cid, t, "learned") for t in ALPHA_TARGETS],
                    "alpha": list(alpha),
                    "drift": drift,
                }
            )
        return rows
