"""The serve consumer: records → joiner → learners → snapshots, checkpoints, metrics.

It is the one :class:`~daemon.app.Consumer` the pipeline worker drives, so nothing here
needs a lock: the joiner, the learner registry, the snapshot store writer and the
checkpoint writer all live on the worker thread. Readers (HTTP API, ``coeffd pull``,
BLIS) only ever see files that were written atomically.

Which configuration an observation belongs to is decided per telemetry source: a sidecar
has one static configuration (settings), a fleet reads it from each stream's OTLP
resource attributes (``coeffd.*``). A stream that names no configuration is counted and
skipped, never guessed.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from coeffd.daemon.batchhist import BatchHistogram
from coeffd.daemon.checkpoint import CheckpointContentError, CheckpointStore
from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.publish.snapshot import (
    ConfigurationRef,
    DriftEvent,
    ErrorStats,
    PublishPolicy,
    Snapshot,
    SnapshotStore,
)
from coeffd.daemon.sampling import EngineSampler
from coeffd.daemon.shedding import LoadShedder
from coeffd.daemon.writer import Writer
from coeffd.learners.features.config import ENGINE_ATTRIBUTE, ServingConfig, ServingConfigError
from coeffd.learners.registry import ALPHA_TARGETS, ConfigSnapshot, LearnerRegistry, Scored
from coeffd.learners.steady import TERM_HINTS
from coeffd.receivers.joiner import Joiner
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import BatchSummary, Record, Source
from coeffd.records.observations import (
    KVTransferObservation,
    Observation,
    RequestObservation,
    StepObservation,
)

__all__ = ["ConfigResolver", "LearningConsumer", "ServeMetrics", "to_snapshot"]

log = structlog.get_logger(__name__)

#: Relative errors of step periods sit around the noise (a few %); defaults are often
#: off by 30-300 %: buckets cover both ends.
_ERROR_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
_FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Prediction sources exported as the ``coefficients`` label (bounded).
_SOURCES = ("learned", "blis_default", "batch_refit", "learned_extended")
#: Shedding below this keep ratio is worth a warning; above it, it is routine trimming.
_SHED_WARN_BELOW = 0.5
_CHECKPOINT = "\0checkpoint"  # key of the checkpoint's write error (never a config id)
_ARRIVAL_SAMPLE_MASK = 15  # step freshness is measured on every 16th step (see __init__)


#: ``http.error_histograms``: per-configuration error histogram buckets (``off``: none).
ERROR_HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "full": _ERROR_BUCKETS,
    "coarse": (0.02, 0.05, 0.1, 0.3),
}


class _NoHistogram:
    """``http.error_histograms = "off"``: the rolling MAPE gauges only."""

    def observe(self, key: tuple[str, ...], value: float) -> None:
        pass

    def observe_many(self, key: tuple[str, ...], values: Any) -> None:
        pass


class ServeMetrics:
    """Learning-side metric families (names: CONTRIBUTING.md), on the app's registry.

    ``error_histograms`` (``full``, ``coarse``, ``off``) sizes the per-configuration
    prediction-error histograms, most of a configuration's series (README, Settings).
    """

    def __init__(self, registry: CollectorRegistry, error_histograms: str = "full") -> None:
        self.relative_error: BatchHistogram | _NoHistogram = _NoHistogram()
        if error_histograms != "off":
            self.relative_error = BatchHistogram(
                "coeffd_prediction_relative_error",
                "|measured - predicted| / measured of every observation, predicted before "
                "learning.",
                ["config", "target", "coefficients"],
                ERROR_HISTOGRAM_BUCKETS[error_histograms],
                registry,
            )
        self.configuration_info = Info(
            "coeffd_configuration",
            "What each configuration id stands for (model, GPU, TP, knobs), for dashboards.",
            ["config"],
            registry=registry,
        )
        self.mape = Gauge(
            "coeffd_prediction_mape",
            "Rolling mean absolute percentage error (fraction) per configuration and target.",
            ["config", "target", "coefficients"],
            registry=registry,
        )
        self.step_time_std = Gauge(
            "coeffd_step_time_standard_error_ratio",
            "Estimated error of the published beta against the noiseless truth: relative "
            "standard error of its predicted step time on a fixed set of batches per regime.",
            ["config", "regime"],
            registry=registry,
        )
        self.coefficient = Gauge(
            "coeffd_coefficient_value",
            "Published coefficient values (BLIS order and units).",
            ["config", "vector", "index"],
            registry=registry,
        )
        self.learner_observations = Counter(
            "coeffd_learner_observations_total",
            "Observations learned, per configuration and target.",
            ["config", "target"],
            registry=registry,
        )
        self.drift = Counter(
            "coeffd_drift_detections_total",
            "Drift detections on learner residuals.",
            ["config", "target"],
            registry=registry,
        )
        self.unresolved = Counter(
            "coeffd_observations_unconfigured_total",
            "Observations skipped because their source names no usable configuration.",
            ["reason"],
            registry=registry,
        )
        self.configurations = Gauge(
            "coeffd_configurations", "Configurations with live learners.", registry=registry
        )
        self.freshness = Histogram(
            "coeffd_snapshot_freshness_seconds",
            "Time from an observation's arrival to the first snapshot that includes it.",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.step_freshness = Histogram(
            "coeffd_step_freshness_seconds",
            "Time from a step summary's arrival to the first snapshot learned from it "
            "(includes the joiner's wait for the journey events around the step).",
            buckets=(*_FRESHNESS_BUCKETS, 120.0, 300.0),
            registry=registry,
        )
        self.publish_refused = Counter(
            "coeffd_snapshot_refused_total",
            "Snapshots not published because the vector was invalid for BLIS.",
            ["config"],
            registry=registry,
        )
        self.checkpoints = Counter(
            "coeffd_checkpoints_total", "Checkpoints written.", registry=registry
        )
        self.checkpoint_failures = Counter(
            "coeffd_checkpoint_failures_total",
            "Checkpoint writes that failed (disk full, read-only, permissions): learning "
            "since the last good one is lost on a restart.",
            registry=registry,
        )
        self.snapshot_write_failures = Counter(
            "coeffd_snapshot_write_failures_total",
            "Snapshot writes that failed (disk full, read-only, permissions); refusals of "
            "invalid vectors are coeffd_snapshot_refused_total.",
            ["config"],
            registry=registry,
        )
        self.checkpoint_unusable = Counter(
            "coeffd_checkpoint_unusable_total",
            "Checkpoint files found unusable at start-up, by file (latest, previous) and "
            "reason (unreadable, corrupt, invalid_content); the next one was tried.",
            ["file", "reason"],
            registry=registry,
        )
        self.shed = Counter(
            "coeffd_observations_shed_total",
            "Observations not learned because learning fell behind, by kind: steps are "
            "shed before joining, requests before learning (pipeline.shed_learning).",
            ["kind"],
            registry=registry,
        )
        self.keep_ratio = Gauge(
            "coeffd_learning_keep_ratio",
            "Share of step and request observations being learned (1 = all; below 1 = "
            "shedding load).",
            registry=registry,
        )
        self.keep_ratio.set(1.0)
        self.engine_share = Gauge(
            "coeffd_engine_sample_share",
            "Share of each configuration's engines whose telemetry is decoded and joined "
            "(1 = all; below 1 = engine sampling, pipeline.sample_engines).",
            registry=registry,
        )
        self.engine_share.set(1.0)
        self.engines = Gauge(
            "coeffd_engines",
            "Engines heard from within the sampler's idle time, by state: joined or "
            "sampled_out (engine sampling).",
            ["state"],
            registry=registry,
        )


def describe_configuration(metrics: ServeMetrics, cfg: ServingConfig) -> None:
    """Export ``coeffd_configuration_info{config, model, gpu, tp, …} 1`` for ``cfg``."""
    labels = {k: v for k, v in cfg.labels.items() if k != "config"}
    metrics.configuration_info.labels(cfg.id).info(labels)


class ConfigResolver:
    """Source → :class:`ServingConfig`: the static one, or from resource attributes.

    A KV-event stream carries no resource: its source only names the engine
    (``coeffd.engine``, from the ZMQ topic). It resolves to the configuration that engine's
    spans announced, once they have been seen.

    ``check`` (the learners' :meth:`~learners.features.config.BasisResolver.problem`)
    vets a configuration the first time it is seen: one whose model or GPU names nothing
    known is unconfigured, its source skipped with that reason (:meth:`reason`), logged
    once. Telemetry only *names* models and GPUs; a name is never opened as a path.
    """

    #: Sources remembered (they come from the network: bounded).
    MAX_SOURCES = 100_000

    def __init__(
        self,
        static: ServingConfig | None = None,
        check: Callable[[ServingConfig], str | None] | None = None,
    ) -> None:
        self.static = static
        self.check = check
        self._cache: dict[str, ServingConfig | None] = {}
        self._reasons: dict[str, str] = {}  # source id → why it names no configuration
        self._engines: dict[str, ServingConfig] = {}
        self._warned: set[str] = set()

    def reason(self, source: Source) -> str:
        """Why ``source`` resolved to no configuration (a bounded metric label)."""
        return self._reasons.get(source.id, "no_configuration")

    def resolve(self, source: Source) -> ServingConfig | None:
        """The configuration of ``source`` (None if it names none, or not yet)."""
        if self.static is not None:
            return self.static
        sid = source.id
        if sid in self._cache:
            return self._cache[sid]
        engine = source.get(ENGINE_ATTRIBUTE)
        if engine is not None and source.get("coeffd.model") is None:
            linked = self._engines.get(str(engine))
            if linked is not None:  # not cached before: the engine may show up later
                self._cache[sid] = linked
            return linked
        try:
            cfg = ServingConfig.from_resource(source)
        except (ServingConfigError, ValueError, KeyError) as e:
            self._warn_once(sid, source, str(e))
            return None
        problem = self.check(cfg) if self.check is not None else None
        if problem is not None:
            # The learners logged the details once per configuration; say which source.
            self._warn_once(sid, source, f"{problem}: model {cfg.model!r}, gpu {cfg.gpu!r}")
            if len(self._cache) < self.MAX_SOURCES:
                self._cache[sid] = None
                self._reasons[sid] = problem
            return None
        if len(self._cache) < self.MAX_SOURCES:
            self._cache[sid] = cfg
            if engine is not None:
                self._engines[str(engine)] = cfg
        return cfg

    def _warn_once(self, sid: str, source: Source, error: str) -> None:
        if sid in self._warned or len(self._warned) >= 10_000:
            return
        self._warned.add(sid)
        log.warning(
            "telemetry source names no usable configuration; its observations are skipped",
            source=sid,
            error=error,
            attributes={k: _short(v) for k, v in source.attributes},
        )


def _short(value: object) -> object:
    # Attributes come from the network: a log line quotes at most 200 characters of one.
    return value if not isinstance(value, str) or len(value) <= 200 else value[:200] + "..."


@dataclass
class _Pending:
    """Per configuration: what the next snapshot will include."""

    first_arrival: float | None = None  # of the oldest observation not yet published
    first_step_arrival: float | None = None  # of that observation's step summary
    last_published_version: int = -1
    drift_seen: dict[str, int] = field(default_factory=dict)


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
        shedder: LoadShedder | None = None,
        sampler: EngineSampler | None = None,
        fleet: FleetPublisher | None = None,
    ) -> None:
        self.joiner = joiner
        self.registry = registry
        self.metrics = metrics
        self.resolver = resolver
        self.store = store
        self.checkpoints = checkpoints
        self.policy = policy or PublishPolicy(interval_s=1.0, relative_threshold=0.02)
        self.checkpoint_interval_s = checkpoint_interval_s
        # Live telemetry's wall clocks track ours, so an idle engine's last steps are
        # finalized once the window has passed in real time; a replay of old files must
        # run on the data's own time (its watermarks) or everything would expire at once.
        self.live = live
        self._clock = clock
        # Load shedding: ``backlog`` (queue fill 0..1) is wired by the app to its pipeline.
        self.shedder = shedder
        # one bound method, so the decoders see the same filter and skip rebuilding
        self._keep = shedder.keep if shedder is not None else None
        self.backlog: Callable[[], float] | None = None
        #: Decoders of the app's receivers, wired like ``backlog``: they decode the steps
        #: being shed partially (half the decode cost of the commonest record).
        self.decoders: list[Decoder] = []
        self._shedding = False
        self._shed_warned = False  # a "learning behind" warning awaits its "caught up"
        #: Engine sampling (past shedding): the app's decoders and KV subscribers consult
        #: it for every source (it also keeps count of the engines heard from).
        self.sampler = sampler
        self._engine_share = 1.0
        self._pending: dict[str, _Pending] = {}
        self._configs: dict[str, ServingConfig] = {}
        self._last_checkpoint = clock()
        # File writes (fsync) happen on the writer's thread, never on the pipeline worker.
        # Writes failing now, by configuration id (or _CHECKPOINT): readiness reads it.
        self._write_errors: dict[str, str] = {}
        self.writer = Writer(
            store,
            checkpoints,
            on_written=self._written,
            on_refused=lambda snap, why: self.metrics.publish_refused.labels(snap.config_id).inc(),
            on_checkpoint=self._checkpointed,
            on_failed=self._write_failed,
        )
        self._last: dict[str, Snapshot] = {}  # last snapshot handed to the writer
        self._next_version: dict[str, int] = {}
        # Per configuration: (version, oldest observation arrival, oldest step arrival) of
        # snapshots handed to the writer and not yet on disk (freshness ends on disk).
        self._unwritten: dict[str, list[tuple[int, float | None, float | None]]] = {}
        self._unwritten_lock = threading.Lock()
        # KV transfers of engines whose spans have not been seen yet (bounded, oldest out).
        self._unresolved_kv: collections.deque[KVTransferObservation] = collections.deque(
            maxlen=10_000
        )
        # Arrival time of every 16th step summary (``step % 16 == 0``, unrelated to timing,
        # so the freshness histogram stays unbiased), until its observation is learned.
        # Bounded: many summaries never become observations; the oldest are forgotten.
        # (Keeping every summary's arrival cost ~80 B each for 30 s: 8 MB at 100 engines.)
        self._summary_arrival: collections.OrderedDict[tuple[str, int], float] = (
            collections.OrderedDict()
        )
        self.records = 0
        self.shed_requests = 0  # request observations built but not learned
        self._shed_exported = {"step": 0, "request": 0}  # what the counter shows
        self.observations = 0
        self.published = 0
        #: Whether :meth:`restore` found learner state of an earlier run.
        self.restored = False
        #: The fleet model (snapshot ``fleet``, ``/v1/predict``), refitted on its cadence.
        self.fleet = fleet

    # ------------------------------------------------------------------ state
    def restore(self) -> bool:
        """Load the newest good checkpoint (if any); True when state was restored."""
        if self.checkpoints is None:
            return False
        restored = self.checkpoints.restore(validate=self._check_state)
        for file, reason, _ in self.checkpoints.problems:
            self.metrics.checkpoint_unusable.labels(file, reason).inc()
        if restored is None:
            return False
        state = restored.state
        self.restored = True
        self.registry.load_state(state.get("registry", {}))
        for cid, cfg in state.get("configs", {}).items():
            try:
                self._configs[cid] = ServingConfig.from_dict(cfg)
            except (ServingConfigError, ValueError, KeyError, TypeError):
                continue
            describe_configuration(self.metrics, self._configs[cid])
        log.info(
            "learner state restored",
            path=restored.path,
            fell_back=restored.fell_back,
            configurations=len(state.get("registry", {}).get("sets", {})),
        )
        return True

    def _check_state(self, state: Any) -> None:
        """Raise :class:`CheckpointContentError` unless ``state`` is what
        :meth:`checkpoint` writes and every learner set in it rebuilds."""
        if not isinstance(state, dict):
            raise CheckpointContentError(f"expected a map, got {type(state).__name__}")
        configs = state.get("configs", {})
        if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
            raise CheckpointContentError("configs: expected a map of configuration maps")
        try:
            self.registry.check_state(state.get("registry", {}))
        except ValueError as e:
            raise CheckpointContentError(f"registry: {e}") from e

    # ------------------------------------------------------------ write health
    def _checkpointed(self) -> None:
        self._write_errors.pop(_CHECKPOINT, None)
        self.metrics.checkpoints.inc()

    def _write_failed(self, snap: Snapshot | None, error: str) -> None:
        """Writer thread: a snapshot or checkpoint did not reach the disk."""
        if snap is None:
            self._write_errors[_CHECKPOINT] = error
            self.metrics.checkpoint_failures.inc()
        else:
            self._write_errors[snap.config_id] = error
            self.metrics.snapshot_write_failures.labels(snap.config_id).inc()

    def checkpoint_problem(self) -> str | None:
        """Readiness: why the last checkpoint write failed (None when it worked)."""
        error = self._write_errors.get(_CHECKPOINT)
        return None if error is None else f"last checkpoint write failed: {error}"

    def snapshot_problem(self) -> str | None:
        """Readiness: the configurations whose last snapshot write failed (None if none)."""
        failing = [(k, v) for k, v in list(self._write_errors.items()) if k != _CHECKPOINT]
        if not failing:
            return None
        return f"snapshot writes failing for {len(failing)} configuration(s): {failing[0][1]}"

    def checkpoint(self) -> None:
        """Checkpoint the learners' state now (written atomically by the writer thread;
        the previous good copy is kept)."""
        if self.checkpoints is None:
            return
        state = {
            "version": 1,
            "registry": self.registry.state_dict(),
            "configs": {cid: c.to_dict() for cid, c in self._configs.items()},
        }
        self.writer.submit_checkpoint(state)
        self._last_checkpoint = self._clock()

    # --------------------------------------------------------------- consumer
    def consume(self, records: Sequence[Record]) -> None:
        """Join a batch of records and learn every observation it completes."""
        self.records += len(records)
        now = self._clock()
        arrival = self._summary_arrival
        # only steps that can become observations: under load the others would crowd
        # the bounded map and push out the kept ones before their window has passed
        keep = self._keep if self._shedding else None
        for r in records:
            if (
                type(r) is BatchSummary
                and not r.step & _ARRIVAL_SAMPLE_MASK
                and not r.partial
                and (keep is None or keep(r.step))
            ):
                arrival[(r.span.source.id, r.step)] = now
        while len(arrival) > 20_000:
            arrival.popitem(last=False)
        self._shed_check()
        self._learn(self.joiner.push_many(records), now)
        self._shed_count()

    def tick(self, now: float) -> None:
        """Expire join state, publish what is due, checkpoint on cadence."""
        t0 = time.perf_counter()
        try:
            self._tick(now)
        finally:
            if self.shedder is not None:
                self.shedder.observe_tick(time.perf_counter() - t0)

    def _tick(self, now: float) -> None:
        self._shed_check()
        self._engine_gauges()
        self._learn(self.joiner.tick(int(now * 1e9) if self.live else None), now)
        self._shed_count()
        self.publish_due(now)
        self._publish_fleet(now)
        if (
            self.checkpoints is not None
            and now - self._last_checkpoint >= self.checkpoint_interval_s
        ):
            self.checkpoint()

    def close(self) -> None:
        """Flush the joiner, learn the rest, publish and checkpoint a last time."""
        now = self._clock()
        self._shed_check()
        self._learn(self.joiner.flush(), now)
        self._shed_count()
        self.publish_due(now, force=True)
        self._publish_fleet(now, force=True)
        if self.records:
            # Nothing consumed: what is on disk already is this state, and a start that
            # failed (a port in use) must leave no files behind.
            self.checkpoint()
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
    def _learn(self, observations: Iterable[Observation], now: float) -> None:
        resolved_any = False
        # Step observations come in bursts (a joiner sweep): each configuration's are
        # learned in one vectorised call, the same computation as one by one.
        steps: dict[str, tuple[ServingConfig, list[StepObservation]]] = {}
        keep = self._keep if self._shedding else None
        for obs in observations:
            cfg = self.resolver.resolve(obs.source)
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
                steps.setdefault(cid, (cfg, []))[1].append(obs)
                continue
            # crc32: a hash stable across processes (str hashes are salted), so a replay
            # at the same share learns the same requests
            if (
                keep is not None
                and isinstance(obs, RequestObservation)
                and not keep(zlib.crc32(obs.request_id.encode()))
            ):
                self.shed_requests += 1
                continue
            scored = self.registry.learn(cfg, obs)
            if scored:
                self.observations += 1
                self._pending_for(cid, now)
                for s in scored:
                    self._record(cid, s)
        for cid, (cfg, batch) in steps.items():
            scored = self.registry.learn_steps(cfg, batch)
            if not scored:
                continue
            self.observations += len(scored)
            p = self._pending_for(cid, now)
            arrival = self._summary_arrival
            for obs in batch:
                if obs.step & _ARRIVAL_SAMPLE_MASK:
                    continue
                t = arrival.pop((obs.source.id, obs.step), None)
                if t is not None and (p.first_step_arrival is None or t < p.first_step_arrival):
                    p.first_step_arrival = t
            self._record_steps(cid, scored)
        self.metrics.configurations.set(len(self.registry))
        if resolved_any and self._unresolved_kv:
            self._retry_kv(now)

    def _shed_check(self) -> None:
        """Set the shedder's share from the backlog; the decoders, the joiner and
        :meth:`_learn` skip the steps and requests it drops. Then steer engine sampling
        from the backlog and that share (without a shedder, step learning is whole)."""
        if self.backlog is None:
            return
        backlog = self.backlog()
        ratio = self._shed_steps(backlog) if self.shedder is not None else 1.0
        if self.sampler is not None:
            self._sample_check(self.sampler, backlog, ratio)

    def _shed_steps(self, backlog: float) -> float:
        assert self.shedder is not None
        ratio = self.shedder.update(backlog)
        self.metrics.keep_ratio.set(ratio)
        shedding = ratio < 1.0
        keep = self._keep if shedding else None
        self.joiner.step_filter = keep
        for d in self.decoders:
            d.step_filter = keep
        self._shedding = shedding
        # Warn only when learning is really behind: a long tick alone (a checkpoint, a
        # burst of publishes) trims the share to ~0.98 with an empty queue, which is
        # routine and visible in coeffd_learning_keep_ratio; catching up is good news.
        if ratio < _SHED_WARN_BELOW and not self._shed_warned:
            self._shed_warned = True
            log.warning(
                "learning behind: shedding step and request observations",
                keep_ratio=round(ratio, 3),
                backlog=round(backlog, 3),
                shed_total=self.shed,
            )
        elif not shedding and self._shed_warned:
            self._shed_warned = False
            log.info(
                "learning caught up: learning every observation",
                backlog=round(backlog, 3),
                shed_total=self.shed,
            )
        return ratio

    def _sample_check(self, sampler: EngineSampler, backlog: float, ratio: float) -> None:
        """Steer engine sampling (the receivers consult the sampler itself)."""
        share = sampler.update(backlog, ratio)
        if share == self._engine_share:
            return
        self.metrics.engine_share.set(share)
        (log.warning if share < self._engine_share else log.info)(
            "learning at its floor and still behind: joining a share of the engines"
            if share < self._engine_share
            else "caught up: joining more engines",
            engine_share=share,
            previous=self._engine_share,
            backlog=round(backlog, 3),
            keep_ratio=round(ratio, 3),
        )
        self._engine_share = share
        self._engine_gauges()

    def _engine_gauges(self) -> None:
        if self.sampler is None:
            return
        kept, known = self.sampler.engines()
        self.metrics.engines.labels("joined").set(kept)
        self.metrics.engines.labels("sampled_out").set(known - kept)

    @property
    def shed(self) -> int:
        """Steps neither joined nor learned (load shedding): the joiner's own tally."""
        return self.joiner.metrics.outcomes[("step", "shed")]

    def _shed_count(self) -> None:
        """Bring ``coeffd_observations_shed_total`` up to the steps and requests shed."""
        for kind, total in (("step", self.shed), ("request", self.shed_requests)):
            done = self._shed_exported[kind]
            if total > done:
                self.metrics.shed.labels(kind).inc(total - done)
                self._shed_exported[kind] = total

    def _pending_for(self, cid: str, now: float) -> _Pending:
        p = self._pending.get(cid)
        if p is None:
            p = self._pending[cid] = _Pending()
        if p.first_arrival is None:
            p.first_arrival = now
        return p

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
        self.metrics.learner_observations.labels(cid, s.target).inc()
        y = s.y
        if not (y > 0 and math.isfinite(y)):
            return
        for source, yhat in s.predictions.items():
            if source not in _SOURCES or yhat is None or not math.isfinite(yhat):
                continue
            self.metrics.relative_error.observe((cid, s.target, source), abs(y - yhat) / y)

    def _record_steps(self, cid: str, scored: list[Scored]) -> None:
        """:meth:`_record` for a batch of step scores (one histogram update per source)."""
        target = scored[0].target
        if any(s.target != target for s in scored):
            for s in scored:
                self._record(cid, s)
            return
        self.metrics.learner_observations.labels(cid, target).inc(len(scored))
        y = np.array([s.y for s in scored])
        good = (y > 0) & np.isfinite(y)
        for source in _SOURCES:
            yhat = np.array([s.predictions.get(source, math.nan) for s in scored])
            ok = good & np.isfinite(yhat)
            if ok.any():
                rel = np.abs(y[ok] - yhat[ok]) / y[ok]
                self.metrics.relative_error.observe_many((cid, target, source), rel)

    # -------------------------------------------------------------- publishing
    def publish_due(self, now: float, force: bool = False) -> None:
        """Publish every configuration whose learners moved and whose policy says so."""
        for cid in self.registry.ids():
            ls = self.registry.get(cid)
            p = self._pending.get(cid)
            if ls is None or p is None or ls.version == p.last_published_version:
                continue
            cs = self.registry.snapshot(cid)
            self._export_gauges(cs, p)
            if self.store is not None:
                self._publish(cs, p, now, force)

    def _export_gauges(self, cs: ConfigSnapshot, p: _Pending) -> None:
        cid = cs.config_id
        for target, summary in cs.errors.items():
            for source, regimes in summary.items():
                s = regimes.get("all")
                if source in _SOURCES and s and math.isfinite(s.get("mape", math.nan)):
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

    def _publish(self, cs: ConfigSnapshot, p: _Pending, now: float, force: bool) -> None:
        assert self.store is not None
        cid = cs.config_id
        previous = self._last.get(cid)
        if previous is None and cid not in self._next_version:
            previous = self.store.latest(cid)  # after a restart: what is on disk
        now_ns = int(now * 1e9)
        ok, reason = self.policy.decide(
            previous, cs.alpha, cs.beta, now_ns, cs.observations, cs.recent_terms
        )
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
        cfg = self._configs.get(cid)
        description = cfg.to_dict() if cfg is not None else {}
        version = self._next_version.get(cid) or self.store.next_version(cid)
        self._next_version[cid] = version + 1
        snap = to_snapshot(cs, version, description)
        if previous is not None and reason in ("interval", "unchanged"):
            # a heartbeat: fresh provenance, the numbers users already have
            snap = msgspec.structs.replace(snap, alpha=previous.alpha, beta=previous.beta)
        self._last[cid] = snap
        with self._unwritten_lock:
            self._unwritten.setdefault(cid, []).append(
                (version, p.first_arrival, p.first_step_arrival)
            )
        self.writer.submit_snapshot(snap)
        self.published += 1
        p.first_arrival = p.first_step_arrival = None
        ls = self.registry.get(cid)
        p.last_published_version = ls.version if ls is not None else -1
        for i, val in enumerate(snap.alpha):
            self.metrics.coefficient.labels(cid, "alpha", str(i)).set(val)
        for i, val in enumerate(snap.beta):
            self.metrics.coefficient.labels(cid, "beta", str(i)).set(val)

    def _publish_fleet(self, now: float, force: bool = False) -> None:
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

    def _written(self, snap: Snapshot, at: float) -> None:
        """Writer thread: a snapshot is on disk; it and every older one replaced by it
        while pending are now fresh."""
        self._write_errors.pop(snap.config_id, None)
        with self._unwritten_lock:
            pending = self._unwritten.get(snap.config_id, [])
            done = [e for e in pending if e[0] <= snap.version]
            self._unwritten[snap.config_id] = [e for e in pending if e[0] > snap.version]
        for _, first, first_step in done:
            if first is not None:
                self.metrics.freshness.observe(max(0.0, at - first))
            if first_step is not None:
                self.metrics.step_freshness.observe(max(0.0, at - first_step))

    # ---------------------------------------------------------------- views
    def live_rows(self) -> list[dict[str, Any]]:
        """One row per configuration for a compact live view (demo)."""
        rows = []
        ev = self.registry.evaluator
        for cid in self.registry.ids():
            ls = self.registry.get(cid)
            if ls is None:
                continue
            drift = sum(m.drift.detections for m in ls.learners.values() if m.drift is not None)
            alpha = self.registry.snapshot(cid).alpha
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
