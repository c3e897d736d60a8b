"""A start that fails (a port in use) leaves no checkpoint behind (issue 19.7)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_port_in_use_writes_no_checkpoint(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "coeffd", "serve", "--log-format", "json",
             "--model-config", "llama-3.1-8b-instruct", "--mode", "sidecar",
             "--http-endpoint", f"127.0.0.1:{port}",
             "--otlp-grpc-endpoint", "127.0.0.1:0", "--otlp-http-endpoint", "127.0.0.1:0",
             "--state-dir", str(tmp_path / "state"), "--snapshot-dir", str(tmp_path / "snap")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert '"cannot start listener"' in proc.stdout
    assert not (tmp_path / "state").exists()
