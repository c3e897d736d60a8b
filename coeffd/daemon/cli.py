"""Command-line entry point: ``coeffd <command>`` / ``python -m coeffd <command>``.

Each command is a module in ``daemon/commands/`` exposing ``add_parser(subparsers)`` and
``run(args) -> int``; adding a command is that module and one line in
:data:`coeffd.daemon.commands.COMMANDS`. Only the chosen command's module is imported
(``coeffd --version`` and ``coeffd -h`` import none): the others are listed by their help.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence

from coeffd.daemon.commands import COMMANDS

__all__ = ["COMMANDS", "build_parser", "main"]


def _version() -> str:
    # importlib.metadata directly: coeffd.daemon.publish.snapshot (which caches it for the
    # daemon) imports the learners, i.e. numpy.
    from importlib import metadata

    try:
        return metadata.version("coeffd")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first non-option word, the top level taking no
    option values), or None: none, or one that is not a command (argparse lists them)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command: the full one (its module
    imported) for each command in ``load`` (None: all of them), a placeholder with the
    command's help for the others."""
    parser = argparse.ArgumentParser(
        prog="coeffd",
        description="Learns BLIS latency-model coefficients online from live vLLM telemetry.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"coeffd {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        if load is None or name in load:
            command = importlib.import_module(f"coeffd.daemon.commands.{name}").add_parser(sub)
            # it reports its own unknown options (``main``), with its own usage
            command.set_defaults(command_parser=command)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    words = list(argv) if argv is not None else sys.argv[1:]
    command = chosen_command(words)
    parser = build_parser(load=() if command is None else (command,))
    args, unknown = parser.parse_known_args(words)
    if unknown:  # `coeffd pull --cfg X`: pull's usage, not the top-level one
        command_parser: argparse.ArgumentParser = getattr(args, "command_parser", parser)
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
