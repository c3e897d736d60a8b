"""What a new user types first: ``coeffd --version`` and ``-h`` of every command."""

from __future__ import annotations

import pytest

from coeffd.daemon.cli import build_parser, main
from coeffd.daemon.publish.snapshot import coeffd_version


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([flag])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"coeffd {coeffd_version()}"


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text: str = sub.choices[command].format_help()  # type: ignore[attr-defined]
    return text


@pytest.mark.parametrize(
    "command", ["serve", "demo", "replay", "simfleet", "pull", "configurations", "basis"]
)
def test_help_is_plain_text_with_the_real_port(command: str) -> None:
    """No reStructuredText markup, no "see docs", no port the daemon does not use."""
    text = _help(command)
    assert "``" not in text and "(see docs)" not in text
    assert ":8080" not in text


def test_readme_says_which_commands_take_config_and_set() -> None:
    """The README's claim matches the parsers (it once said every command did)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = re.search(r"\n((?:`\w+`,? (?:and )?)+)take `--config FILE` and `--set", readme)
    assert said is not None
    claimed = set(re.findall(r"`(\w+)`", said.group(1)))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    # the settings file flag (pull's --config is a configuration id, its --set a knob)
    takes = {
        name
        for name, p in sub.choices.items()  # type: ignore[attr-defined]
        if any("--config" in a.option_strings and a.metavar == "FILE" for a in p._actions)
    }
    assert claimed == takes
