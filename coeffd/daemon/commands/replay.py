"""``coeffd replay FILE...``: learn from recorded OTLP traces through the same pipeline.

Records go through the joiner and the learners exactly as live ones do; snapshots land in
``publish.snapshot_dir`` and learner state in ``state.state_dir`` (both said on start and
in the summary; add ``--serve`` to keep the API up while replaying).

Reads the Collector file exporter's formats (see ``receivers.replay.reader``), waits
for the pipeline instead of dropping when it is full, then drains and prints a summary.
Observations whose traces name no configuration (no ``coeffd.model``/``coeffd.gpu``
resource attributes: vLLM run without ``OTEL_RESOURCE_ATTRIBUTES``) are skipped; the
summary then says so and how to name it: ``--mode sidecar --model-config NAME|config.json
--hardware GPU --tp N``, as for a sidecar.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import structlog

from coeffd.daemon.app import App
from coeffd.daemon.assemble import build_app
from coeffd.daemon.commands.common import EXIT_USAGE, add_settings_arguments, settings_from_args
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.settings import Settings
from coeffd.receivers.otlp.ingest import Ingestor
from coeffd.receivers.replay.reader import RECEIVER, ReplaySummary, replay_files

__all__ = ["add_parser", "run"]

log = structlog.get_logger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``replay``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="replay OTLP trace files (Collector file exporter) through the pipeline",
        description="Replay recorded OTLP traces into the pipeline: JSON lines (plain, .gz,\n"
        ".zst) or the Collector file exporter's length-prefixed protobuf/zstd frames.\n"
        "Snapshots go to --snapshot-dir (default snapshots/), learner state to\n"
        "--state-dir (default state/; '' for none).\n\n"
        "Traces without coeffd.* resource attributes name no configuration; say what\n"
        "they came from, as for a sidecar:\n"
        "  --mode sidecar --model-config NAME|config.json --hardware GPU --tp N\n"
        "Then coeffd configurations --snapshot-dir DIR and coeffd pull --snapshot-dir DIR\n"
        "work offline.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="OTLP/JSON lines or Collector file exporter output, optionally gzip/zstd",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="also run the receivers and /metrics while replaying (default: pipeline only)",
    )
    add_settings_arguments(p, serve=True)
    p.set_defaults(run=run)
    return p


def run_replay(app: App, files: list[str], show_progress: bool | None = None) -> ReplaySummary:
    """Replay ``files`` into a started ``app``; wait until the worker consumed them."""
    ingestor = Ingestor.for_host(app, RECEIVER)

    if show_progress is None:
        show_progress = sys.stderr.isatty()
    if show_progress:
        from tqdm import tqdm

        total = sum(os.path.getsize(f) for f in files)
        with tqdm(total=total, unit="B", unit_scale=True, desc="replay", file=sys.stderr) as bar:

            def advance(n: int) -> None:
                bar.update(n)

            summary = replay_files(files, ingestor, advance)
    else:
        summary = replay_files(files, ingestor)
    app.pipeline.wait_idle(app.settings.pipeline.drain_timeout_seconds)
    return summary


def replay_settings(settings: Settings, *, serve: bool) -> Settings:
    """The daemon's settings for a replay: no load shedding or engine sampling (a replay
    waits for queue room instead of being pushed back, so a full queue is no reason to
    learn less), and without ``--serve`` no listeners."""
    settings = settings.model_copy(deep=True)
    settings.pipeline.shed_learning = False
    settings.pipeline.sample_engines = False
    if not serve:
        settings.receivers.otlp_grpc.enabled = False
        settings.receivers.otlp_http.enabled = False
        settings.http.enabled = False
    return settings


def _where(settings: Settings) -> str:
    state = settings.state.state_dir
    return f"snapshots in {os.path.abspath(settings.publish.snapshot_dir)}/; " + (
        f"learner state in {os.path.abspath(state)}/" if state else "no learner state kept"
    )


#: Why observations were skipped (``coeffd_observations_unconfigured_total{reason}``) →
#: what to do about it.
_SKIP_HINTS = {
    "no_configuration": "the traces name no configuration (resource attributes coeffd.model, "
    "coeffd.gpu missing): say what they came from, coeffd replay --mode sidecar "
    "--model-config NAME|config.json --hardware GPU --tp N FILE…",
    "invalid_configuration": "a coeffd.* resource attribute does not parse (e.g. a TP the "
    "model cannot be split by): fix the attributes, or override them with --mode sidecar "
    "--model-config … --hardware … --tp …",
    "unknown_model": "the traces name a model coeffd does not have: --set "
    "catalog.models_dir=DIR (DIR/NAME/config.json), or --mode sidecar --model-config "
    "config.json --hardware GPU --tp N",
    "unknown_gpu": "the traces name a GPU coeffd does not have: --set "
    "catalog.hardware_dir=DIR (DIR/NAME.json), or --mode sidecar --hardware sheet.json",
}


def skipped_hints(app: App) -> list[str]:
    """One line per reason observations were skipped as unconfigured, with what to do."""
    out = []
    for reason, hint in _SKIP_HINTS.items():
        n = app.registry.get_sample_value(
            "coeffd_observations_unconfigured_total", {"reason": reason}
        )
        if n:
            out.append(f"coeffd replay: {int(n)} observation(s) skipped ({reason}): {hint}")
    return out


def run(args: argparse.Namespace) -> int:
    """Replay, print the summary; 0 on success, 1 if nothing could be read, 2 on usage."""
    settings = settings_from_args(args)
    if settings is None:
        return EXIT_USAGE
    missing = [f for f in args.files if not os.path.isfile(f)]
    if missing:
        print(f"coeffd: no such file: {missing[0]}", file=sys.stderr)
        return EXIT_USAGE
    settings = replay_settings(settings, serve=args.serve)
    try:
        app = build_app(settings, live=False)
    except (OSError, ValueError) as e:
        print(f"coeffd: cannot start: {e}", file=sys.stderr)
        return 1
    consumer = app.consumer
    restored = isinstance(consumer, LearningConsumer) and consumer.restored
    print(
        f"coeffd replay: {_where(settings)}"
        + (" (continuing from the state found there)" if restored else ""),
        file=sys.stderr,
    )
    app.start()
    try:
        summary = run_replay(app, list(args.files))
    except OSError as e:
        log.error("replay failed", error=str(e))
        app.stop()
        return 1
    app.stop()
    for line in summary.lines():
        print(line)
    if isinstance(consumer, LearningConsumer):
        print(
            f"learned {consumer.observations} observations for "
            f"{len(consumer.registry)} configuration(s); "
            f"{consumer.published} snapshot(s); {_where(settings)}"
        )
        for line in skipped_hints(app):
            print(line, file=sys.stderr)
    if summary.requests == 0 and summary.bad_lines:
        print(
            f"coeffd replay: no OTLP trace request could be read from {', '.join(args.files)}",
            file=sys.stderr,
        )
        return 1
    return 0
