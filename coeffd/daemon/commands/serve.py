"""``coeffd serve``: run the daemon (receivers → pipeline → learning consumer) until a signal.

The consumer joins the records into observations, learns per-configuration coefficients,
and publishes snapshots under ``publish.snapshot_dir`` (served on ``/v1/...``); learner
state is checkpointed under ``state.state_dir`` and restored at start-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from coeffd.daemon import api
from coeffd.daemon.app import App
from coeffd.daemon.commands.common import EXIT_USAGE, add_settings_arguments, settings_from_args
from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.learning import ConfigResolver, LearningConsumer, ServeMetrics
from coeffd.daemon.learning.checkpoints import CheckpointStore
from coeffd.daemon.load import LoadController
from coeffd.daemon.publish.policy import PublishPolicy
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.settings import Settings
from coeffd.joiner import Joiner, JoinerMetrics
from coeffd.learners.features.config import BasisResolver
from coeffd.learners.registry import LearnerRegistry

__all__ = ["add_parser", "build_app", "build_consumer", "run"]

log = structlog.get_logger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the daemon: receivers, joiner, learners, snapshots, /metrics and /v1 API",
        description="Receive vLLM telemetry (OTLP/gRPC, OTLP/HTTP, ZMQ KV events), learn "
        "BLIS coefficients per serving configuration, publish snapshots.",
    )
    add_settings_arguments(p, serve=True)
    p.set_defaults(run=run)
    return p


def build_consumer(
    settings: Settings, registry: CollectorRegistry, *, live: bool = True
) -> tuple[LearningConsumer, SnapshotStore]:
    """The learning consumer and its snapshot store, metrics on ``registry``.

    ``live``: telemetry arrives now (serve, demo); False for replays of recorded files.
    """
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
    load = LoadController.from_settings(settings.pipeline, registry)
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
    )
    if checkpoints is not None and settings.state.restore:
        consumer.restore()
    return consumer, store


def build_app(
    settings: Settings, registry: CollectorRegistry | None = None, *, live: bool = True
) -> App:
    """A ready-to-start daemon: receivers + learning consumer + ``/v1`` API routes."""
    registry = registry if registry is not None else CollectorRegistry()
    if settings.pipeline.consumer == "counting":
        return App(settings, registry=registry)
    consumer, store = build_consumer(settings, registry, live=live)
    app = App(settings, consumer=consumer, registry=registry)
    pipeline = app.pipeline
    # the load controller's signals, and what the receivers ask it
    load = consumer.load
    load.backlog = lambda: pipeline.depth / pipeline.capacity
    load.receivers_full = app.grpc_occupancy.full_share
    load.decoders.append(app.decoder)
    app.decoder.source_filter = load.source_filter
    app.kv_engine_filter = load.engine_filter
    api.mount(app.router, store, consumer.fleet)
    # Failed writes make /readyz fail (an operator alerts on it) until a write works.
    app.add_readiness_check("checkpoints", consumer.checkpoint_problem)
    app.add_readiness_check("snapshots", consumer.snapshot_problem)
    return app


def run(args: argparse.Namespace) -> int:
    """Run until a signal; exit 0 after a graceful drain, 2 on bad settings, 1 on bind errors."""
    settings = settings_from_args(args)
    if settings is None:
        return EXIT_USAGE
    try:
        app = build_app(settings)
    except (OSError, ValueError) as e:  # unreadable state/snapshot dir, bad static config
        log.error("cannot start", error=str(e))
        return 1
    try:
        code = app.run()
    except OSError:  # a listener could not bind; App.start logged which one
        return 1
    consumer = app.consumer
    if isinstance(consumer, LearningConsumer) and consumer.checkpoint_problem() is not None:
        # the last state did not reach the disk: not a clean exit (a restart loses it)
        log.error("exiting without a final checkpoint", error=consumer.checkpoint_problem())
        return 1
    return code
