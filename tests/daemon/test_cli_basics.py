"""What a new user types first: ``coeffd --version`` and ``-h`` of every command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`coeffd basis … | head -0`: the reader has closed the pipe before coeffd writes;
    coeffd stops quietly (no BrokenPipeError traceback on stderr) with SIGPIPE's status."""
    batch = tmp_path / "batch.json"
    batch.write_text(
        json.dumps(
            [{"input_len": 512, "progress_index": 0, "num_new_tokens": 512, "output_len": 8}]
        )
    )
    argv = ["basis", "--model-config", "llama-3.1-8b-instruct", "--hardware", "H100"]
    argv += ["--tp", "1", "--batch", str(batch)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "coeffd", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader leaves before the first byte
    err = proc.stderr.read() if proc.stderr else b""
    assert proc.wait(timeout=120) == 128 + 13, err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
