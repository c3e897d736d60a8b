"""Helpers shared by commands: the settings flags every daemon-like command takes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from coeffd.daemon.log import configure_logging
from coeffd.daemon.settings import (
    Settings,
    SettingsError,
    check_startup,
    load_settings,
    set_override,
)

__all__ = ["EXIT_USAGE", "add_settings_arguments", "settings_from_args"]

#: Exit code for invalid settings (same as argparse's usage errors).
EXIT_USAGE = 2

# (flag, dotted settings key, type, help)
_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--log-level", "log.level", str, "debug, info, warning or error"),
    ("--log-format", "log.format", str, "auto, json or console"),
    (
        "--otlp-grpc-endpoint",
        "receivers.otlp_grpc.endpoint",
        str,
        "HOST:PORT (default 0.0.0.0:4317)",
    ),
    (
        "--otlp-http-endpoint",
        "receivers.otlp_http.endpoint",
        str,
        "HOST:PORT (default 0.0.0.0:4318)",
    ),
    (
        "--http-endpoint",
        "http.endpoint",
        str,
        "HOST:PORT of /metrics, /healthz, /readyz, API (default 0.0.0.0:9464)",
    ),
    ("--queue-capacity", "pipeline.queue_capacity", str, "pipeline queue capacity in records"),
)

# Flags of the daemon proper (serve, demo): output, state and the static configuration of
# a sidecar's vLLM, mirroring vLLM's own argument names.
_SERVE_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    (
        "--mode",
        "mode",
        str,
        "standalone (fleet service), sidecar (receivers on localhost) or query (merged view "
        "of --peers)",
    ),
    (
        "--peers",
        "query.peers",
        str,
        "query: coeffd instances to merge, comma-separated http(s)://HOST:PORT and/or "
        "dns+HEADLESS-SERVICE:PORT",
    ),
    ("--kv-endpoint", "kv.endpoints", str, "ZMQ KV-event endpoint(s), comma-separated"),
    ("--snapshot-dir", "publish.snapshot_dir", str, "where coefficient snapshots are written"),
    ("--state-dir", "state.state_dir", str, "where learner checkpoints are written"),
    ("--model-config", "configuration.model", str, "sidecar: config.json path or bundled model"),
    ("--hardware", "configuration.hardware", str, "sidecar: GPU name or hardware JSON path"),
    ("--tp", "configuration.tp", str, "sidecar: tensor parallel size"),
    ("--dp", "configuration.dp", str, "sidecar: data parallel size"),
    (
        "--max-num-batched-tokens",
        "configuration.max_num_batched_tokens",
        str,
        "sidecar: vLLM --max-num-batched-tokens",
    ),
    ("--max-num-seqs", "configuration.max_num_seqs", str, "sidecar: vLLM --max-num-seqs"),
    ("--max-model-len", "configuration.max_model_len", str, "sidecar: vLLM --max-model-len"),
    ("--cpu-offload-gib", "configuration.cpu_offload_gib", str, "sidecar: KV offload size"),
)


def add_settings_arguments(p: argparse.ArgumentParser, *, serve: bool = False) -> None:
    """Add ``--config``, ``--set KEY=VALUE`` and the per-key flags (``serve``: daemon ones)."""
    p.add_argument("--config", metavar="FILE", help="TOML settings file (default: $COEFFD_CONFIG)")
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="set_values",
        help="override any setting by dotted key, e.g. --set pipeline.queue_capacity=1000 (repeatable)",
    )
    for flag, key, typ, text in _FLAGS + (_SERVE_FLAGS if serve else ()):
        p.add_argument(
            flag,
            metavar="VALUE",
            type=typ,
            default=None,
            dest="opt_" + key.replace(".", "__"),
            help=text,
        )


def settings_from_args(args: argparse.Namespace) -> Settings | None:
    """Load settings (defaults ← TOML ← env ← flags) and configure logging.

    On invalid settings (values, or what :func:`~daemon.settings.check_startup` finds on
    disk: a sidecar's model and GPU, writable directories), prints the one-line error to
    stderr and returns None; the command then exits with :data:`EXIT_USAGE`.
    """
    overrides: dict[str, Any] = {}
    try:
        for item in args.set_values:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SettingsError(f"invalid setting {item!r}: expected KEY=VALUE")
            set_override(overrides, key.strip(), value)
        for _flag, key, _typ, _text in _FLAGS + _SERVE_FLAGS:
            value = getattr(args, "opt_" + key.replace(".", "__"), None)
            if value is not None:
                set_override(overrides, key, value)
        settings = load_settings(args.config, overrides)
        check_startup(settings)
    except SettingsError as e:
        print(f"coeffd: {e}", file=sys.stderr)
        return None
    configure_logging(settings.log.level, settings.log.format)
    return settings
