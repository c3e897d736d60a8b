"""``coeffd serve``: run the daemon (receivers → pipeline → learning consumer) until a signal.

The consumer joins the records into observations, learns per-configuration coefficients,
and publishes snapshots under ``publish.snapshot_dir`` (served on ``/v1/...``); learner
state is checkpointed under ``state.state_dir`` and restored at start-up. The daemon is
put together in :mod:`coeffd.daemon.assemble`; this module parses and runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import structlog

from coeffd.daemon.assemble import build_app
from coeffd.daemon.commands.common import EXIT_USAGE, add_settings_arguments, settings_from_args
from coeffd.daemon.learning import LearningConsumer

__all__ = ["add_parser", "run"]

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
    except OSError as e:  # a listener could not bind (App.start logged it too)
        print(f"coeffd serve: cannot start: {e}", file=sys.stderr)
        return 1
    consumer = app.consumer
    if isinstance(consumer, LearningConsumer) and consumer.checkpoint_problem() is not None:
        # the last state did not reach the disk: not a clean exit (a restart loses it)
        log.error("exiting without a final checkpoint", error=consumer.checkpoint_problem())
        return 1
    return code
