"""``coeffd demo`` (``make run``) as a new user sees it (issue 19): the URLs and a
"Ctrl-C to stop" line under every live table, ids beside names, a note when state from an
earlier run was restored, and no second "is learning" on exit."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _demo(tmp: Path) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coeffd",
            "demo",
            "--scenario",
            "steady",
            "--duration",
            "30",
            "--speed",
            "30",
            "--refresh",
            "0.5",
            "--exit-when-done",
            "--http-endpoint",
            "127.0.0.1:0",
            "--otlp-grpc-endpoint",
            "127.0.0.1:0",
            "--set",
            "receivers.otlp_http.enabled=false",
            "--kv-endpoint",
            f"tcp://127.0.0.1:{_free_port()}",
            "--snapshot-dir",
            str(tmp / "snapshots"),
            "--state-dir",
            str(tmp / "state"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_demo_keeps_urls_under_the_table_and_says_when_it_continues(tmp_path: Path) -> None:
    out = _demo(tmp_path)
    assert out.count("is learning") == 1
    assert "continuing from" not in out
    tables = out.split("coeffd demo —")[1:]
    assert len(tables) >= 2  # live views, then the final one at exit
    for view in tables[:-1]:
        assert "/metrics" in view and "coeffd configurations" in view
        assert "Ctrl-C to stop" in view and "--format blis-args" in view
    assert "coeffd stopped." in tables[-1] and "Ctrl-C" not in tables[-1]
    rows = [ln for ln in tables[-1].splitlines() if re.match(r"^[0-9a-f]{12} ", ln)]
    assert rows and all("/tp" in ln for ln in rows)  # id beside model/GPU/TP

    again = _demo(tmp_path)
    assert again.count("is learning") == 1
    note = "continuing from the learner state of an earlier run"
    assert note in again.split("coeffd demo —")[0]
    assert all(note in view for view in again.split("coeffd demo —")[1:-1])


def test_commands_under_the_table_name_the_venv_when_coeffd_is_not_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make run`` starts ``.venv/bin/coeffd``; a fresh clone has no ``coeffd`` on PATH."""
    from coeffd.daemon.commands.demo import command_name

    exe = tmp_path / ".venv" / "bin" / "coeffd"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert command_name(".venv/bin/coeffd") == ".venv/bin/coeffd"
    monkeypatch.setenv("PATH", str(exe.parent))
    assert command_name(".venv/bin/coeffd") == "coeffd"
