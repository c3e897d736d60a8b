"""``coeffd replay`` on what users actually feed it (issue 19): JSON that is not an
object, binary files, the Collector file exporter's zstd and protobuf layouts, whole-file
zstd; and it says where its snapshots and learner state go."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from test_example_replay import EXAMPLE, _pipeline_only, check_example

from coeffd.daemon.app import App
from coeffd.daemon.commands.replay import run_replay
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.receivers.otlp.jsonbody import parse_json_request

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

LINES = EXAMPLE.read_bytes().splitlines()


def _replay_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coeffd", "replay", *args, "--log-format", "json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def test_json_that_is_not_an_object_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"42\n[1,2]\nnull\n" + EXAMPLE.read_bytes())
    proc = _replay_cli(str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "requests: 2  bad lines: 3" in proc.stdout
    assert "t.jsonl:1: expected a JSON object" in proc.stdout and "got int" in proc.stdout


@pytest.mark.parametrize("content", [b"42\n", b"null\n[1,2]\n", "proto"])
def test_a_file_with_nothing_readable_fails_plainly(tmp_path: Path, content: object) -> None:
    path = tmp_path / "x.jsonl"
    if content == "proto":  # a bare protobuf request: no framing, not text
        path.write_bytes(parse_json_request(LINES[0]).SerializeToString())
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    proc = _replay_cli(str(path), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "no OTLP trace request could be read" in proc.stderr
    assert "bad lines: 0" not in proc.stdout


def _frames(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _layouts() -> dict[str, bytes]:
    protos = [parse_json_request(line).SerializeToString() for line in LINES]
    return {
        # format: proto
        "proto": _frames(protos),
        # format: proto + compression: zstd
        "proto-zstd": _frames([_zstd(p) for p in protos]),
        # format: json + compression: zstd (the exporter then frames, too)
        "json-zstd": _frames([_zstd(line) for line in LINES]),
        # a JSON lines file compressed as a whole (zstd traces.jsonl)
        "jsonl.zst": _zstd(EXAMPLE.read_bytes()),
    }


@pytest.mark.parametrize("layout", ["proto", "proto-zstd", "json-zstd", "jsonl.zst"])
def test_collector_file_exporter_layouts_replay_like_json_lines(
    tmp_path: Path, layout: str
) -> None:
    path = tmp_path / f"traces.{layout}"
    path.write_bytes(_layouts()[layout])
    consumer = CountingConsumer.keeping()
    app = App(_pipeline_only(), consumer=consumer)
    app.start()
    summary = run_replay(app, [str(path)], show_progress=False)
    app.stop()
    assert (summary.requests, summary.bad_lines, summary.records) == (2, 0, 15)
    assert consumer.records is not None
    check_example(consumer.records)


def test_truncated_frame_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "cut.bin"
    path.write_bytes(_layouts()["proto"][:-10])
    consumer = CountingConsumer.keeping()
    app = App(_pipeline_only(), consumer=consumer)
    app.start()
    summary = run_replay(app, [str(path)], show_progress=False)
    app.stop()
    assert (summary.requests, summary.bad_lines) == (1, 1)
    assert summary.first_bad is not None and "truncated" in summary.first_bad


def test_replay_says_where_it_writes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(EXAMPLE.read_bytes())
    proc = _replay_cli(str(path), "--model-config", "qwen2.5-7b-instruct", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for where in (f"snapshots in {tmp_path}/snapshots/", f"learner state in {tmp_path}/state/"):
        assert where in proc.stderr and where in proc.stdout
    assert "continuing from" not in proc.stderr
    # a second replay in the same place continues from the first one's state, and says so
    proc = _replay_cli(str(path), "--model-config", "qwen2.5-7b-instruct", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "continuing from the state found there" in proc.stderr
