"""Replay of the spec §6 worked example decodes to exactly the spec's numbers."""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from coeffd.daemon.app import App
from coeffd.daemon.commands.replay import run_replay
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.receivers.otlp.decode import decode_json
from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    RequestSnapshot,
    RequestSpan,
    StepSpan,
)

EXAMPLE = Path(__file__).parent.parent / "data" / "vllm-example-traces.jsonl"
ROOT = Path(__file__).resolve().parents[2]


def example_records() -> list[Any]:
    out: list[Any] = []
    for line in EXAMPLE.read_bytes().splitlines():
        res = decode_json(line)
        assert (res.rejected, res.ignored) == (0, 0)
        out.extend(res.records)
    return out


def check_example(records: Sequence[Any]) -> None:
    """Assert every record of the worked example field by field (spec §6.1)."""
    kinds = [type(r).__name__ for r in records]
    assert kinds == [
        "CoreSpan", "JourneyEvent", "JourneyEvent", "JourneyEvent", "JourneyEvent",
        "StepSpan", "BatchSummary", "RequestSnapshot", "RequestSnapshot", "BatchSummary",
        "RequestSpan", "ApiEvent", "ApiEvent", "ApiEvent", "ApiEvent",
    ]  # fmt: skip
    core, q, s, ft, fin, steps, b42, snap_r2, snap_r1, b43, req, arr, hand, first, dep = records

    assert isinstance(core, CoreSpan)
    assert core.request_id == "chatcmpl-3f2a9c1e5b7d4a60-7c1d2e3f"
    assert core.span.trace_id.hex() == "5d1e4a7f0c9b48e2a3f6b1c27d8e9f40"
    assert core.span.span_id.hex() == "e4f1a9c07b2d5368"
    assert core.span.parent_span_id.hex() == "3c9e7d12a0f45b86"
    assert (core.span.name, core.span.scope) == ("llm_core", "vllm.scheduler")
    assert (core.span.start_wall_ns, core.span.end_wall_ns) == (
        1767225600003861420,
        1767225600053421770,
    )
    assert core.span.source.get("service.name") == "unknown_service"

    assert isinstance(q, JourneyEvent) and q.kind is JourneyKind.QUEUED
    assert (q.wall_ns, q.mono_ns, q.step, q.phase) == (
        1767225600003911540,
        5000003911206,
        1041,
        "WAITING",
    )
    assert (q.prefill_done_tokens, q.prefill_total_tokens) == (0, 40)
    assert (q.decode_done_tokens, q.decode_max_tokens, q.num_preemptions) == (0, 3, 0)
    assert (q.schedule_kind, q.finish_status) == (None, None)
    # wall − mono offset of the EngineCore (spec table)
    assert q.wall_ns - q.mono_ns == 1767220600000000334
    assert isinstance(s, JourneyEvent) and s.kind is JourneyKind.SCHEDULED
    assert (s.mono_ns, s.step, s.phase, s.schedule_kind) == (
        5000004212655,
        1042,
        "PREFILL",
        "FIRST",
    )
    assert isinstance(ft, JourneyEvent) and ft.kind is JourneyKind.FIRST_TOKEN
    assert (ft.mono_ns, ft.step, ft.phase, ft.prefill_done_tokens, ft.decode_done_tokens) == (
        5000028803559, 1042, "DECODE", 40, 1,
    )  # fmt: skip
    assert isinstance(fin, JourneyEvent) and fin.kind is JourneyKind.FINISHED
    assert (fin.mono_ns, fin.step, fin.decode_done_tokens, fin.finish_status) == (
        5000053398204, 1044, 3, "length",
    )  # fmt: skip
    assert fin.span is core.span  # one SpanInfo shared by a span's records

    assert isinstance(steps, StepSpan)
    assert (steps.sequence, steps.range_start, steps.closure_interval, steps.range_end) == (
        11,
        1001,
        100,
        1100,
    )
    assert steps.span.parent_span_id == b""
    assert steps.span.scope == "vllm.scheduler.step"

    assert isinstance(b42, BatchSummary) and isinstance(b43, BatchSummary)
    assert (b42.step, b42.start_mono_ns, b42.end_mono_ns, b42.duration_us) == (
        1042, 5000003998412, 5000004377901, 379,
    )  # fmt: skip
    assert (b42.running_depth, b42.waiting_depth, b42.num_prefill_reqs, b42.num_decode_reqs) == (
        2,
        0,
        1,
        1,
    )
    assert (b42.scheduled_tokens, b42.prefill_tokens, b42.decode_tokens) == (25, 24, 1)
    assert (b42.num_finished, b42.num_preempted) == (0, 0)
    assert (b42.kv_usage_gpu_ratio, b42.kv_blocks_total_gpu, b42.kv_blocks_free_gpu) == (
        0.00146484375,
        8192,
        8180,
    )
    assert b42.wall_ns == 1767225600004381050
    assert (b43.step, b43.start_mono_ns, b43.end_mono_ns, b43.duration_us) == (
        1043, 5000016502377, 5000016790118, 287,
    )  # fmt: skip
    assert (b43.scheduled_tokens, b43.prefill_tokens, b43.decode_tokens) == (2, 1, 1)
    # P(1042) = S(1043) − S(1042) = 12.504 ms (spec)
    assert b43.start_mono_ns - b42.start_mono_ns == 12503965

    assert isinstance(snap_r2, RequestSnapshot) and isinstance(snap_r1, RequestSnapshot)
    assert (snap_r2.step, snap_r2.request_id, snap_r2.phase) == (
        1042,
        "cmpl-9a0b1c2d3e4f5061-0-5e6f7a8b",
        "DECODE",
    )
    assert (
        snap_r2.num_prompt_tokens, snap_r2.num_computed_tokens, snap_r2.num_output_tokens,
        snap_r2.num_preemptions, snap_r2.scheduled_tokens, snap_r2.kv_blocks_allocated_gpu,
        snap_r2.kv_blocks_cached_gpu, snap_r2.effective_prompt_len,
    ) == (100, 137, 37, 0, 1, 9, 8, 100)  # fmt: skip
    assert (snap_r1.request_id, snap_r1.phase, snap_r1.num_computed_tokens, snap_r1.scheduled_tokens) == (
        "chatcmpl-3f2a9c1e5b7d4a60-7c1d2e3f", "PREFILL", 16, 24,
    )  # fmt: skip
    assert (
        snap_r1.kv_blocks_allocated_gpu,
        snap_r1.kv_blocks_cached_gpu,
        snap_r1.effective_prompt_len,
    ) == (3, 2, 24)

    assert isinstance(req, RequestSpan)
    assert (req.request_id, req.route, req.model) == (
        "chatcmpl-3f2a9c1e5b7d4a60", "/v1/chat/completions", "qwen2.5-7b-instruct",
    )  # fmt: skip
    assert (req.prompt_tokens, req.completion_tokens, req.max_tokens, req.n) == (40, 3, 3, 1)
    assert (req.temperature, req.top_p, req.is_error) == (0.7, 1.0, False)
    assert req.span.span_id == core.span.parent_span_id and req.span.trace_id == core.span.trace_id
    assert (req.span.start_wall_ns, req.span.end_wall_ns) == (
        1767225600000000000,
        1767225600054330015,
    )

    api = [
        (e.kind, e.wall_ns, e.mono_ns) for e in (arr, hand, first, dep) if isinstance(e, ApiEvent)
    ]
    assert api == [
        (ApiKind.ARRIVED, 1767225600000062190, 5000000061840),
        (ApiKind.HANDOFF_TO_CORE, 1767225600001183400, 5000001183020),
        (ApiKind.FIRST_RESPONSE_FROM_CORE, 1767225600029447690, 5000029447310),
        (ApiKind.DEPARTED, 1767225600054312240, 5000054311884),
    ]
    # spec: arrival → queued 3.849 ms, finished → departed 0.914 ms (mono, cross-process)
    assert q.mono_ns - arr.mono_ns == 3849366
    assert dep.mono_ns - fin.mono_ns == 913680


def test_decode_example_file() -> None:
    check_example(example_records())


def test_replay_into_pipeline_gz_and_concatenated(tmp_path: Path) -> None:
    lines = EXAMPLE.read_bytes().splitlines()
    # A collector may put several requests on one line; and files may be gzipped.
    merged = tmp_path / "merged.jsonl"
    merged.write_bytes(lines[0] + b" " + lines[1] + b"\n\n")
    gz = tmp_path / "traces.json.gz"
    gz.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    for path in (merged, gz):
        consumer = CountingConsumer.keeping()
        settings_app = App(_pipeline_only(), consumer=consumer)
        settings_app.start()
        summary = run_replay(settings_app, [str(path)], show_progress=False)
        settings_app.stop()
        assert summary.requests == 2 and summary.bad_lines == 0
        assert summary.records == 15 and summary.rejected == 0
        assert summary.records_by_kind["BatchSummary"] == 2
        assert consumer.records is not None
        check_example(consumer.records)
        assert consumer.closed


def _pipeline_only():  # type: ignore[no-untyped-def]
    from coeffd.daemon.settings import Settings

    return Settings.model_validate(
        {
            "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
            "http": {"enabled": False},
        }
    )


def test_replay_cli_summary_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(EXAMPLE.read_bytes() + b"this is not json\n" + b'{"resourceSpans": 5}\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coeffd",
            "replay",
            str(path),
            "--log-format",
            "json",
            "--snapshot-dir",
            str(tmp_path / "snap"),
            "--state-dir",
            str(tmp_path / "state"),
            "--model-config",
            "qwen2.5-7b-instruct",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "requests: 2  bad lines: 2" in proc.stdout
    assert "records: 15  rejected: 0  ignored: 0" in proc.stdout
    assert "  JourneyEvent.QUEUED: 1" in proc.stdout
    assert "undecodable export request" in proc.stdout  # logged, not crashed
    # the example's one complete request is learned (alpha targets), for the sidecar's model
    assert "learned 1 observations for 1 configuration(s)" in proc.stdout
    assert (tmp_path / "state" / "checkpoint.bin").exists()


@pytest.mark.parametrize("missing", ["nope.jsonl"])
def test_replay_cli_missing_file(tmp_path: Path, missing: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "coeffd", "replay", str(tmp_path / missing)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no such file" in proc.stderr
