"""``coeffd serve``: run the daemon (receivers → pipeline → consumer) until SIGTERM/SIGINT.

Until the joiner exists the pipeline worker only counts records (``CountingConsumer``).
"""

from __future__ import annotations

import argparse
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from daemon.app import App, Consumer
from daemon.commands.common import EXIT_USAGE, add_settings_arguments, settings_from_args
from daemon.settings import Settings

__all__ = ["add_parser", "build_consumer", "run"]

log = structlog.get_logger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the daemon: OTLP receivers, pipeline, /metrics",
        description="Receive vLLM telemetry (OTLP/gRPC, OTLP/HTTP) and run the pipeline.",
    )
    add_settings_arguments(p)
    p.set_defaults(run=run)
    return p


def build_consumer(settings: Settings, registry: CollectorRegistry) -> Consumer | None:
    """The pipeline consumer of ``serve`` (joiner → learners → publisher), registering its
    metrics on ``registry``; ``None`` means the counting-only default."""
    return None


def run(args: argparse.Namespace) -> int:
    """Run until a signal; exit 0 after a graceful drain, 2 on bad settings, 1 on bind errors."""
    settings = settings_from_args(args)
    if settings is None:
        return EXIT_USAGE
    registry = CollectorRegistry()
    app = App(settings, consumer=build_consumer(settings, registry), registry=registry)
    try:
        return app.run()
    except OSError:  # a listener could not bind; App.start logged which one
        return 1
