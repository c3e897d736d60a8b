"""The CLI imports only the chosen command's module (issue 33, item 11): ``coeffd
--version`` and ``coeffd -h`` answered in 2.1 s because every command module, and with them
numpy, River and gRPC, was imported up front."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from coeffd.daemon.cli import build_parser, chosen_command, main
from coeffd.daemon.commands import COMMANDS

PROBE = """
import sys
import coeffd.daemon.cli as cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print("HEAVY", *sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "river", "grpc"}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["-h"], ["no-such-command"]])
def test_version_and_help_import_no_heavy_library(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "HEAVY", done.stdout + done.stderr


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"coeffd {metadata.version('coeffd')}"


def test_each_command_module_gives_the_help_the_table_lists() -> None:
    for name, summary in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"coeffd.daemon.commands.{name}").add_parser(sub)
        (action,) = sub._choices_actions
        assert (action.dest, action.help) == (name, summary)


def test_the_chosen_command_gets_its_full_parser_the_others_a_placeholder() -> None:
    assert chosen_command(["pull", "--config", "x"]) == "pull"
    assert chosen_command(["-h", "serve"]) == "serve"
    assert chosen_command(["--", "serve"]) is None
    assert chosen_command(["nope"]) is None
    args = build_parser(load=("configurations",)).parse_args(["configurations"])
    assert callable(args.run)
    placeholder = build_parser(load=()).parse_args(["basis"])
    assert not hasattr(placeholder, "run")


def test_an_unknown_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and all(name in err for name in COMMANDS)


def test_every_command_module_is_in_the_table() -> None:
    """A command module without its line in ``COMMANDS`` would never be reachable."""
    from pathlib import Path

    import coeffd.daemon.commands as commands

    modules = {p.stem for p in Path(commands.__file__).parent.glob("*.py")}
    assert modules - {"__init__", "common"} == set(COMMANDS)
