"""``coeffd trace`` (issue 31): the requests the daemon saw, as a BLIS TraceV2 pair.

simfleet telemetry (known true arrivals, first responses, departures) goes through the
real learning consumer; its request ring is served over real HTTP; ``coeffd trace``
writes the pair; a TraceV2 reader written here from the rules of BLIS's
``sim/workload/tracev2.go`` (column order, conditional columns, integer timestamps,
strict header keys) reads it back. With the real BLIS binary, ``blis replay`` accepts
the pair and ``blis calibrate`` writes its report.
"""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from blis_support import blis_binary
from prometheus_client import CollectorRegistry

from coeffd.base.http import HttpServer
from coeffd.daemon import api, requests_api
from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.commands import pull, trace
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.learning.requests import FinishedRequest, RequestRing
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder
from coeffd.simfleet import SampleRates, run

# --------------------------------------------------------------- reader (Go's rules)

#: ``traceV2Columns`` (tracev2.go), the 27 base columns in order.
BASE = (  # noqa: SIM905 - read as the Go source lists them
    "request_id client_id tenant_id slo_class session_id round_index prefix_group "
    "prefix_length streaming input_tokens output_tokens text_tokens image_tokens "
    "audio_tokens video_tokens reason_ratio model deadline_us server_input_tokens "
    "arrival_time_us send_time_us first_chunk_time_us last_chunk_time_us num_chunks "
    "status error_message finish_reason"
).split()
#: ``TraceHeader`` / ``TraceServerConfig`` yaml keys (decoded with KnownFields(true)).
HEADER_KEYS = {
    "trace_version", "time_unit", "created_at", "mode", "warm_up_requests", "workload_seed",
    "workload_spec", "session_context_growth", "server", "network", "goodput_slo_targets",
    "kv_offload", "observed_kv_metrics",
}  # fmt: skip
SERVER_KEYS = {
    "type", "model", "tensor_parallel", "max_num_seqs", "block_size",
    "gpu_memory_utilization", "max_model_len",
}  # fmt: skip


def _go_int(text: str) -> int:
    """strconv.Atoi / ParseInt(10): optional sign and ASCII digits only (no 1e3, no 1.0)."""
    body = text[1:] if text[:1] in "+-" else text
    assert body.isascii() and body.isdigit(), f"not a Go integer: {text!r}"
    return int(text)


def _go_bool(text: str) -> bool:
    go = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
          "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}  # fmt: skip
    assert text in go, f"not a Go bool: {text!r}"
    return go[text]


@dataclass
class Record:
    request_id: int
    prefix_group: str
    streaming: bool
    input_tokens: int
    output_tokens: int
    server_input_tokens: int
    arrival_time_us: int
    send_time_us: int
    first_chunk_time_us: int
    last_chunk_time_us: int
    status: str
    error_message: str
    finish_reason: str


def load_tracev2(header: Path, data: Path) -> tuple[dict[str, Any], list[Record]]:
    """LoadTraceV2 + parseTraceRecord, as far as a trace without session data needs."""
    head = yaml.safe_load(header.read_text())
    assert set(head) <= HEADER_KEYS, set(head) - HEADER_KEYS
    assert set(head.get("server") or {}) <= SERVER_KEYS
    with data.open(newline="") as f:
        rows = list(csv.reader(f))
    cols = rows[0]
    offset = 1 if "vllm_priority" in cols else 0
    slo = 1 if "slo_target_us" in cols else 0
    trailing = sum(c in cols for c in ("x_request_id", "adapter", "think_time_us"))
    expected = list(BASE)
    if offset:
        expected.insert(4, "vllm_priority")
    if slo:
        expected.insert(expected.index("deadline_us") + 1, "slo_target_us")
    assert cols[: len(expected)] == expected
    out = []
    for row in rows[1:]:
        assert len(row) >= len(BASE) + offset + slo + trailing
        o = offset
        for i in (5, 7, 9, 10, 11, 12, 13, 14):  # round, prefix length, token counts
            assert _go_int(row[i + o]) >= 0
        assert 0.0 <= float(row[15 + o]) <= 1.0
        assert _go_int(row[17 + o]) >= 0  # deadline
        s = o + slo
        out.append(
            Record(
                request_id=_go_int(row[0]),
                prefix_group=row[6 + o],
                streaming=_go_bool(row[8 + o]),
                input_tokens=_go_int(row[9 + o]),
                output_tokens=_go_int(row[10 + o]),
                server_input_tokens=_go_int(row[18 + s]),
                arrival_time_us=_go_int(row[19 + s]),
                send_time_us=_go_int(row[20 + s]),
                first_chunk_time_us=_go_int(row[21 + s]),
                last_chunk_time_us=_go_int(row[22 + s]),
                status=row[24 + s],
                error_message=row[25 + s].strip(),
                finish_reason=row[26 + s].strip(),
            )
        )
    return head, out


# --------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[LearningConsumer, Any, Path]:
    """30 simulated s of one engine through the real consumer (snapshots on disk)."""
    tmp = tmp_path_factory.mktemp("trace")
    dec = Decoder()
    batches: list[Any] = []
    result = run(
        "steady",
        30,
        3,
        rates=SampleRates(1.0, 1.0, 0.02, 100),
        trace_sinks=[lambda r: batches.append(dec.decode(r).records)],
        max_events=100_000,
        drain_s=5,
        record_latencies=True,
    )
    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp / "snaps")}, "state": {"state_dir": ""}},
        environ={},
    )
    consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
    for b in batches:
        consumer.consume(b)
    consumer.close()
    return consumer, result, tmp / "snaps"


@pytest.fixture(scope="module")
def server(fleet: tuple[LearningConsumer, Any, Path]) -> Iterator[str]:
    consumer, _, snaps = fleet
    http = HttpServer("127.0.0.1", 0, name="test-trace")
    api.mount(http.router, SnapshotStore(snaps))
    requests_api.mount(http.router, consumer.requests)
    http.start()
    try:
        yield f"http://127.0.0.1:{http.port}"
    finally:
        http.stop()


def _config(fleet: tuple[LearningConsumer, Any, Path]) -> str:
    (cid,) = fleet[0].requests.configurations()
    return cid


def _trace(url: str, cid: str, tmp: Path, *extra: str) -> tuple[Path, Path]:
    header, data = tmp / "t.yaml", tmp / "t.csv"
    argv = ["--server", url, "--config", cid, "--trace-header", str(header)]
    code = trace.main([*argv, "--trace-data", str(data), *extra])
    assert code == 0
    return header, data


# --------------------------------------------------------------- tests


def test_the_ring_holds_every_request_with_its_true_times(
    fleet: tuple[LearningConsumer, Any, Path],
) -> None:
    consumer, result, _ = fleet
    rows = consumer.requests.requests(_config(fleet))
    truth = result.engines[0].latencies
    assert len(rows) == len(truth) == result.requests_finished > 100
    wall0, mono0 = result.truth["wall_start_ns"], result.truth["mono_start_ns"]

    def us(mono_ns: int) -> float:
        return (wall0 + mono_ns - mono0) / 1000

    for r, (_, t, fr, dep) in zip(rows, sorted(truth, key=lambda x: x[1]), strict=True):
        assert abs(r.arrival_us - us(t)) <= 1
        assert abs(r.departure_us - us(dep)) <= 2
        # streaming: the measured first response; otherwise the first token (α2 unseen)
        assert -100 <= r.first_response_us - us(fr) <= 2
    assert consumer.requests.description(_config(fleet))["kv_blocks_total_gpu"] > 0  # type: ignore[index]


def test_the_pair_round_trips_through_a_tracev2_reader(
    fleet: tuple[LearningConsumer, Any, Path], server: str, tmp_path: Path
) -> None:
    cid = _config(fleet)
    rows = fleet[0].requests.requests(cid)
    header, data = _trace(server, cid, tmp_path)
    head, records = load_tracev2(header, data)
    assert head["trace_version"] == 3 and head["time_unit"] == "us" and head["mode"] == "real"
    assert head["warm_up_requests"] == 0
    assert head["server"] == {
        "type": "vllm", "model": "llama-3.1-8b-instruct", "tensor_parallel": 1,
        "max_num_seqs": 256, "block_size": 16, "max_model_len": 8192,
    }  # fmt: skip
    assert [r.request_id for r in records] == list(range(len(rows)))
    t0 = rows[0].arrival_us
    for r, rec in zip(rows, records, strict=True):
        assert rec.arrival_time_us == rec.send_time_us == r.arrival_us - t0
        assert rec.first_chunk_time_us - rec.send_time_us == r.first_response_us - r.arrival_us
        assert rec.last_chunk_time_us - rec.send_time_us == r.departure_us - r.arrival_us
        assert rec.input_tokens == rec.server_input_tokens == r.input_tokens
        assert (rec.output_tokens, rec.streaming, rec.status) == (
            r.output_tokens, r.streaming, r.status,
        )  # fmt: skip
        assert rec.prefix_group == ""  # not carried (docs)
    # the sim's own writer would quote nothing here: no field holds a comma or quote
    assert '"' not in data.read_text()


def test_since_keeps_the_newest_requests(
    fleet: tuple[LearningConsumer, Any, Path], server: str, tmp_path: Path
) -> None:
    cid = _config(fleet)
    everything = load_tracev2(*_trace(server, cid, tmp_path))[1]
    recent = load_tracev2(*_trace(server, cid, tmp_path, "--since", "10s"))[1]
    newest = max(r.last_chunk_time_us for r in everything)
    kept = [r for r in everything if r.arrival_time_us >= newest - 10_000_000]
    assert 0 < len(recent) == len(kept) < len(everything)
    assert [r.input_tokens for r in recent] == [r.input_tokens for r in kept]


def test_aborted_and_unfinished_requests_keep_their_status(tmp_path: Path) -> None:
    from coeffd.daemon.publish.tracev2 import ServerBlock, write_tracev2

    base = 1_767_225_600_000_000
    reqs = [
        FinishedRequest(base, base + 40_000, base + 900_000, 100, 20, "ok", "stopped", True),
        FinishedRequest(base + 5, base + 50_000, base + 60_000, 100, 2, "error", "aborted", True),
        FinishedRequest(base + 9, 0, 0, 300, 0, "incomplete", "", False),
    ]
    header, data = tmp_path / "h.yaml", tmp_path / "d.csv"
    assert write_tracev2(header, data, reqs, ServerBlock(model="m")) == 3
    _, recs = load_tracev2(header, data)
    assert [(r.status, r.error_message, r.finish_reason) for r in recs] == [
        ("ok", "", "stopped"), ("error", "aborted", "aborted"), ("incomplete", "", ""),
    ]  # fmt: skip
    assert (recs[2].first_chunk_time_us, recs[2].last_chunk_time_us) == (0, 0)


def test_the_ring_is_bounded_by_count_and_age() -> None:
    ring = RequestRing(max_requests=3, max_age_seconds=10.0)

    def req(t_s: float) -> FinishedRequest:
        t = int(t_s * 1e6)
        return FinishedRequest(t, t + 1000, t + 2000, 1, 1, "ok", "stopped", False)

    for t in (0, 1, 2, 3):
        ring.add("c", req(t))
    assert [r.arrival_us for r in ring.requests("c")] == [1_000_000, 2_000_000, 3_000_000]
    ring.add("c", req(30))  # the others departed more than 10 s before it
    assert [r.arrival_us for r in ring.requests("c")] == [30_000_000]
    off = RequestRing(max_requests=0)
    off.add("c", req(1))
    assert off.requests("c") == []


def test_unknown_configuration_and_bad_since_are_errors(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--server", server, "--trace-header", str(tmp_path / "h"), "--trace-data"]
    assert trace.main([*argv, str(tmp_path / "d"), "--config", "0123456789ab"]) == 1
    assert "no requests seen" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()
    with pytest.raises(SystemExit):
        trace.main([*argv, str(tmp_path / "d"), "--config", "x", "--since", "-5m"])


def test_blis_replays_and_calibrates_the_pair(
    fleet: tuple[LearningConsumer, Any, Path],
    server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blis, why = blis_binary()
    if blis is None:
        pytest.skip(why)
    cid = _config(fleet)
    header, data = _trace(server, cid, tmp_path)
    assert pull.main(["--server", server, "--config", cid, "--format", "blis-args"]) == 0
    args = shlex.split(capsys.readouterr().out)
    sim, report = tmp_path / "sim.json", tmp_path / "report.json"
    replay = subprocess.run(
        [str(blis), "replay", "--trace-header", str(header), "--trace-data", str(data),
         *args, "--results-path", str(sim)],
        capture_output=True, text=True, timeout=300, check=False, cwd=blis.parent,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert len(json.loads(sim.read_text())) > 100
    cal = subprocess.run(
        [str(blis), "calibrate", "--trace-header", str(header), "--trace-data", str(data),
         "--sim-results", str(sim), "--report", str(report)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert cal.returncode == 0, cal.stderr[-2000:]
    doc = json.loads(report.read_text())
    assert doc["trace_info"]["matched_pairs"] > 100
    for metric in ("ttft", "e2e"):
        m = doc["metrics"][metric]
        assert m["count"] > 100 and m["request_level"]["mape"] >= 0
        assert m["workload_level"]["real_mean"] > 0 and m["workload_level"]["sim_mean"] > 0


def test_the_endpoint_answers_bad_queries_with_400(
    fleet: tuple[LearningConsumer, Any, Path], server: str
) -> None:
    import urllib.error
    import urllib.request

    cid = _config(fleet)
    for query in (f"{cid}?since=-1", f"{cid}?since=nan", "..%2Fetc?since=5"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"{server}/v1/requests/{query}", timeout=10)
        assert exc.value.code == 400
        assert json.loads(exc.value.read())["error"]["status"] == 400


def test_coeffd_serve_mounts_the_endpoint_and_bounds_the_ring(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from coeffd.daemon.assemble import build_app

    settings = load_settings(
        overrides={
            "http": {"endpoint": "127.0.0.1:0"},
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                "otlp_http": {"enabled": False},
            },
            "publish": {"snapshot_dir": str(tmp_path / "s")},
            "state": {"state_dir": ""},
            "trace": {"max_requests": 7, "max_age_seconds": 60},
        },
        environ={},
    )
    app = build_app(settings, live=False)
    app.start()
    try:
        ring = app.consumer.requests  # type: ignore[attr-defined]
        assert (ring.max_requests, ring.max_age_us) == (7, 60_000_000)
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{app.http_port}/v1/requests/abc", timeout=10)
        assert exc.value.code == 404 and b"no requests seen" in exc.value.read()
    finally:
        app.stop()
