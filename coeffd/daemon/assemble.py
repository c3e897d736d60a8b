"""The daemon put together: settings → every part, each handed what it needs when built.

One place builds the daemon (``coeffd serve``, ``demo``, ``replay``, bench and tests call
it), and nothing is wired by assignment after construction. The order:

1. the receivers' pool occupancy (:class:`~receivers.occupancy.Occupancy`), then the
   engine sampler that reads it (``pipeline.sample_engines``), then the OTLP decoder
   that asks the sampler which sources to decode: the sampler comes before the load
   controller because the controller is handed the decoders it filters;
2. the learning side (:func:`build_consumer`): snapshot store, checkpoint store, basis
   resolver, learner registry, load controller (sampler, shedder, backlog signal,
   decoders), joiner and learning consumer (both given that controller), fleet
   publisher; the learner state of an earlier run is restored here;
3. the ``/v1`` API routes on a router, and the :class:`~daemon.app.App` (pipeline,
   receivers, HTTP server) given the consumer, decoder, occupancy, KV engine filter,
   router and the readiness checks of the state writes.

``mode = query`` builds a different daemon: no receivers and no learners, a
:class:`~daemon.query.view.FleetView` over the peers as the pipeline's consumer (its
refreshes run on the worker's ticks) and the same API over the view's snapshot store.

The one cycle — the controller reads the pipeline's fill, the pipeline (the App's) drives
the consumer, the consumer steers the controller — is broken by the backlog signal, a
closure over the app (see :func:`build_app`).

Metric families are registered in this order too (the ``/metrics`` exposition follows
it): snapshot store, load control, joiner, learning, fleet, then the app's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from coeffd.base.http import Router
from coeffd.daemon import api, requests_api
from coeffd.daemon.app import App
from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.learning import ConfigResolver, LearningConsumer, ServeMetrics
from coeffd.daemon.learning.checkpoints import CheckpointStore
from coeffd.daemon.learning.requests import RequestRing
from coeffd.daemon.load import (
    EngineSampler,
    LoadController,
    LoadMetrics,
    engine_sampler,
    learning_shedder,
)
from coeffd.daemon.publish.policy import PublishPolicy
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.query.statistics import StatisticsExporter
from coeffd.daemon.query.view import FleetView
from coeffd.daemon.settings import Settings
from coeffd.joiner import Joiner, JoinerMetrics
from coeffd.learners.features.config import BasisResolver
from coeffd.learners.registry import LearnerRegistry
from coeffd.receivers.occupancy import Occupancy
from coeffd.receivers.otlp.decode import Decoder

__all__ = ["build_app", "build_consumer"]


def build_app(
    settings: Settings, registry: CollectorRegistry | None = None, *, live: bool = True
) -> App:
    """A ready-to-start daemon: receivers + learning consumer + ``/v1`` API routes.

    ``live``: telemetry arrives now (serve, demo); False for replays of recorded files.
    With ``pipeline.consumer = "counting"`` the app only counts what it receives.
    """
    registry = registry if registry is not None else CollectorRegistry()
    if settings.pipeline.consumer == "counting":
        return App(settings, registry=registry)
    if settings.mode == "query":
        return _query_app(settings, registry)
    occupancy = Occupancy(settings.receivers.otlp_grpc.workers)
    sampler = engine_sampler(settings.pipeline, receivers_full=occupancy.full_share)
    decoder = Decoder(source_filter=sampler.keep if sampler is not None else None)

    # The one construction cycle: the load controller reads the pipeline's fill, the
    # pipeline (built by the App) drives the consumer, the consumer steers the
    # controller. The signal reads ``app``, assigned below; the controller first asks it
    # on the pipeline worker, which runs only once the app has started.
    def backlog() -> float:
        pipeline = app.pipeline
        return pipeline.depth / pipeline.capacity

    consumer, store = _learning(
        settings, registry, live=live, sampler=sampler, backlog=backlog, decoders=(decoder,)
    )
    router = Router()
    exporter = consumer.statistics
    api.mount(
        router,
        store,
        consumer.fleet,
        statistics=(lambda: exporter.latest) if exporter is not None else None,
    )
    requests_api.mount(router, consumer.requests)  # GET /v1/requests/{id}: coeffd trace
    app = App(
        settings,
        consumer=consumer,
        registry=registry,
        decoder=decoder,
        grpc_occupancy=occupancy,
        kv_engine_filter=sampler.keep_engine if sampler is not None else None,
        router=router,
        # Failed writes make /readyz fail (an operator alerts on it) until a write works.
        readiness={
            "checkpoints": consumer.checkpoint_problem,
            "snapshots": consumer.snapshot_problem,
        },
    )
    return app


def _query_app(settings: Settings, registry: CollectorRegistry) -> App:
    """``mode = query``: no receivers, no learners; the merged view of ``query.peers``
    (:mod:`daemon.query.view`), refreshed on the pipeline worker's ticks."""
    static = settings.catalog
    store = SnapshotStore(
        settings.publish.snapshot_dir, settings.publish.retention, registry=registry
    )
    view = FleetView(
        settings.query,
        settings.learners,
        store,
        resolver=BasisResolver(
            models_dir=static.models_dir or None, hardware_dir=static.hardware_dir or None
        ),
        state=CheckpointStore(settings.state.state_dir) if settings.state.state_dir else None,
        metrics=registry,
        save_interval_s=settings.state.checkpoint_interval_seconds,
    )
    if settings.state.restore:
        view.restore()
    router = Router()
    api.mount(router, store, view, annotate=view.instances)
    return App(
        settings,
        consumer=view,
        registry=registry,
        router=router,
        readiness={"peers": view.readiness},
    )


def build_consumer(
    settings: Settings, registry: CollectorRegistry, *, live: bool = True
) -> tuple[LearningConsumer, SnapshotStore]:
    """The learning consumer and its snapshot store, metrics on ``registry``, without
    receivers: its load controller has no backlog signal and no decoders (nothing is
    steered until a caller sets ``consumer.backlog``: bench, tests).

    ``live``: telemetry arrives now (serve, demo); False for replays of recorded files.
    """
    return _learning(settings, registry, live=live, sampler=engine_sampler(settings.pipeline))


def _learning(
    settings: Settings,
    registry: CollectorRegistry,
    *,
    live: bool,
    sampler: EngineSampler | None,
    backlog: Callable[[], float] | None = None,
    decoders: Sequence[Decoder] = (),
) -> tuple[LearningConsumer, SnapshotStore]:
    """Snapshot store → … → learning consumer (module docstring, step 2), restored."""
    static = settings.configuration
    model_paths: dict[str, str] = {}
    hardware: str | None = None
    static_config = None
    if static is not None:
        static_config = static.serving_config()
        # A sidecar may name a config.json path or a hardware file: let the learners'
        # resolver find them under the names the configuration id uses.
        if Path(static.model).exists():
            model_paths[static_config.model] = static.model
        if Path(static.hardware).exists():
            hardware = static.hardware
    store = SnapshotStore(
        settings.publish.snapshot_dir, settings.publish.retention, registry=registry
    )
    checkpoints = CheckpointStore(settings.state.state_dir) if settings.state.state_dir else None
    bases = BasisResolver(
        model_paths=model_paths or None,
        hardware=hardware,
        models_dir=settings.catalog.models_dir or None,
        hardware_dir=settings.catalog.hardware_dir or None,
    )
    learners = LearnerRegistry(settings.learners, resolver=bases)
    load = LoadController(
        LoadMetrics(registry),
        shedder=learning_shedder(settings.pipeline),
        sampler=sampler,
        backlog=backlog,
        decoders=decoders,
    )
    consumer = LearningConsumer(
        joiner=Joiner(settings.joiner, JoinerMetrics(registry), load=load),
        registry=learners,
        metrics=ServeMetrics(registry, settings.http.error_histograms),
        # telemetry names models and GPUs: unknown names are skipped and counted
        resolver=ConfigResolver(static_config, check=bases.problem),
        store=store,
        checkpoints=checkpoints,
        policy=PublishPolicy(
            settings.publish.interval_seconds,
            settings.publish.relative_threshold,
            settings.publish.min_observations,
            settings.publish.step_time_threshold,
        ),
        checkpoint_interval_s=settings.state.checkpoint_interval_seconds,
        live=live,
        load=load,
        fleet=FleetPublisher(learners, registry),
        statistics=StatisticsExporter(learners, settings.query.statistics_interval_seconds),
        requests=RequestRing(settings.trace.max_requests, settings.trace.max_age_seconds),
    )
    if checkpoints is not None and settings.state.restore:
        consumer.restore()
    return consumer, store
