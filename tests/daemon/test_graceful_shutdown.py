"""SIGTERM to a real `coeffd serve` → stop accepting, drain, close, exit 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "data" / "vllm-example-traces.jsonl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_drains_and_exits_zero(tmp_path: Path) -> None:
    http_port, otlp_http = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "coeffd", "serve",
            "--log-format", "json",
            "--http-endpoint", f"127.0.0.1:{http_port}",
            "--otlp-http-endpoint", f"127.0.0.1:{otlp_http}",
            "--otlp-grpc-endpoint", "127.0.0.1:0",
            "--snapshot-dir", str(tmp_path / "snapshots"),
            "--state-dir", str(tmp_path / "state"),
            # The example is a qwen2.5-7b sidecar trace without coeffd.* attributes.
            "--model-config", "qwen2.5-7b-instruct",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COEFFD_PIPELINE__DRAIN_TIMEOUT_SECONDS": "20"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (
                "daemon did not become ready"
            )
            time.sleep(0.1)
        for line in EXAMPLE.read_bytes().splitlines():
            req = urllib.request.Request(
                f"http://127.0.0.1:{otlp_http}/v1/traces",
                data=line,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    names = [e["event"] for e in events]
    assert "signal received; shutting down" in names
    stopped = [e for e in events if e["event"] == "coeffd stopped"]
    assert stopped and stopped[0]["drained"] is True
    closed = [e for e in events if e["event"] == "learning consumer closed"]
    assert closed and closed[0]["records"] == 15  # everything accepted was consumed
    # The example's one complete request becomes one alpha observation, learned before exit.
    assert closed[0]["observations"] >= 1
    assert (tmp_path / "state" / "checkpoint.bin").stat().st_size > 0
    assert all(e["level"] in ("info", "debug") for e in events), events
