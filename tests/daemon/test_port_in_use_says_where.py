"""A port in use stops ``serve`` and ``demo`` with one plain stderr line naming the
listener, its endpoint and how to move it (issue 33, item 6). In-process, no fixed port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from coeffd.daemon import cli


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        yield busy.getsockname()[1]


def _flags(tmp_path: Path, port: int) -> list[str]:
    return [
        "--log-level", "error", "--http-endpoint", f"127.0.0.1:{port}",
        "--otlp-grpc-endpoint", "127.0.0.1:0", "--otlp-http-endpoint", "127.0.0.1:0",
        "--state-dir", str(tmp_path / "state"), "--snapshot-dir", str(tmp_path / "snap"),
    ]  # fmt: skip


def test_serve_says_which_port_on_stderr(
    tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["serve", *_flags(tmp_path, busy_port)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "coeffd serve" in ln]
    assert code == 1
    assert err == [
        f"coeffd serve: cannot start: http endpoint 127.0.0.1:{busy_port}: Address already in "
        "use; move it with --http-endpoint HOST:PORT"
    ]


def test_demo_says_which_port_and_the_make_run_args(
    tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["demo", *_flags(tmp_path, busy_port), "--set", "kv.endpoints="])
    err = capsys.readouterr().err
    assert code == 1
    assert f"http endpoint 127.0.0.1:{busy_port}: Address already in use" in err
    assert f'make run ARGS="--http-endpoint 127.0.0.1:{busy_port + 1}"' in err
