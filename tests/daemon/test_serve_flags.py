"""Bad daemon flags stop start-up with one clear line naming the key (nothing is started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coeffd", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["serve", "--kv-endpoint", "http://vllm:5557"], 2, "invalid setting kv.endpoints.0="),
        (["serve", "--tp", "2"], 2, "invalid setting configuration.model: required"),
        (["serve", "--mode", "edge"], 2, "invalid setting mode='edge'"),
        (["serve", "--model-config", "llama-3.1-8b-instruct", "--tp", "0"], 2, "configuration.tp"),
        (["demo", "--sample-rates", "1,2"], 2, "--sample-rates"),
        # the journey-step and loop-wait settings (issue 14)
        (["serve", "--set", "joiner.loop_wait_delay_s=-1"], 2, "joiner.loop_wait_delay_s"),
        (["serve", "--set", "joiner.max_span_steps=abc"], 2, "joiner.max_span_steps"),
        (["serve", "--set", "joiner.journey_steps=maybe"], 2, "joiner.journey_steps"),
        (["serve", "--set", "learners.queueing_forgetting=1.5"], 2, "queueing_forgetting"),
    ],
)
def test_bad_flags_exit_with_one_line(
    tmp_path: Path, argv: list[str], code: int, expected: str
) -> None:
    proc = _run(*argv, "--snapshot-dir", str(tmp_path / "s"), "--state-dir", str(tmp_path / "t"),
                cwd=ROOT)  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()  # nothing was started


def test_missing_model_config_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "config.json"
    proc = _run(
        "serve", "--model-config", str(missing), "--log-format", "json",
        "--snapshot-dir", str(tmp_path / "s"), "--state-dir", str(tmp_path / "t"),
        "--http-endpoint", "127.0.0.1:0", "--otlp-grpc-endpoint", "127.0.0.1:0",
        "--otlp-http-endpoint", "127.0.0.1:0",
        cwd=ROOT,
    )  # fmt: skip
    # a settings error like any other: exit 2, one plain line on stderr, nothing on stdout
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("coeffd: invalid setting ")
    assert "configuration.model=" in proc.stderr and str(missing) in proc.stderr
