"""``coeffd replay`` of traces that name no configuration says why nothing was learned and
how to name it (issue 33, item 8), and the flags it names do learn."""

from __future__ import annotations

from pathlib import Path

import pytest

from coeffd.daemon import cli

TRACES = Path(__file__).resolve().parents[1] / "data" / "vllm-example-traces.jsonl"


def _replay(tmp_path: Path, *flags: str) -> None:
    code = cli.main(
        [
            "replay", "--log-level", "error", "--snapshot-dir", str(tmp_path / "snaps"),
            "--state-dir", "", *flags, str(TRACES),
        ]
    )  # fmt: skip
    assert code == 0


def test_replay_without_a_configuration_says_why_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _replay(tmp_path)
    out = capsys.readouterr()
    assert "learned 0 observations for 0 configuration(s)" in out.out
    why = [ln for ln in out.err.splitlines() if "skipped (no_configuration)" in ln]
    assert len(why) == 1 and "coeffd.model" in why[0]
    assert "--mode sidecar --model-config" in why[0] and "--hardware" in why[0]
    # the fix it names
    _replay(
        tmp_path / "fixed", "--mode", "sidecar", "--model-config", "llama-3.1-8b-instruct",
        "--hardware", "H100", "--tp", "1",
    )  # fmt: skip
    out = capsys.readouterr()
    assert "for 1 configuration(s)" in out.out and "skipped" not in out.err


def test_replay_help_documents_the_sidecar_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["replay", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--mode sidecar --model-config NAME|config.json --hardware GPU --tp N" in text
