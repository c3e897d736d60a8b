"""Command-line entry point: ``coeffd <command>`` / ``python -m coeffd <command>``.

Each command is a module in ``daemon/commands/`` exposing ``add_parser(subparsers)`` and
``run(args) -> int``; adding a command is one line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from coeffd.daemon.commands import basis, configurations, demo, pull, replay, serve, simfleet
from coeffd.daemon.publish.snapshot import coeffd_version

__all__ = ["COMMANDS", "build_parser", "main"]

#: The command modules, in help order. Add yours here (one line).
COMMANDS: tuple[ModuleType, ...] = (
    serve,
    demo,
    replay,
    simfleet,
    pull,
    configurations,
    basis,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(
        prog="coeffd",
        description="Learns BLIS latency-model coefficients online from live vLLM telemetry.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"coeffd {coeffd_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # inside the try: a closed pipe fails here, not at exit
    except BrokenPipeError:
        # `coeffd pull | head`: the reader left. Python's documented recipe: point stdout
        # at devnull so the interpreter's final flush does not raise again, and exit as
        # a pipeline member whose reader closed early does (SIGPIPE's status).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
