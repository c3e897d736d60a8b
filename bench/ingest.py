"""``python -m bench ingest``: OTLP decode throughput on one core, vs a naive baseline.

Workload (vLLM-shaped, see ``vllm-telemetry.md``): one EngineCore export request with a
``scheduler_steps`` span carrying 100 ``step.BATCH_SUMMARY`` events, and one with 100
``llm_core`` spans of 5 journey events each (QUEUED, SCHEDULED, PREEMPTED, SCHEDULED,
FINISHED... realistic values, all distinct).

Measured in the same run, on CPU time of this process (so other load on the machine
matters less):

* **coeffd**: wire bytes → ``FastExportRequest.FromString`` → ``Decoder.decode`` → records
  (what the receivers do per request);
* **baseline**: wire bytes → ``ExportTraceServiceRequest.FromString`` →
  ``json_format.MessageToDict`` → walk the dicts in Python → the same records.

Targets: ≥ 250,000 events/s and ≥ 3× the baseline.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from coeffd.receivers.otlp.decode import Decoder
from coeffd.receivers.otlp.fastproto import FastExportRequest
from coeffd.records.events import (
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    Record,
    Source,
    SpanInfo,
    StepSpan,
)

__all__ = ["baseline_decode", "build_core_request", "build_step_request", "main"]

T0 = 1767225600_000_000_000
M0 = 5000_000_000_000


def _kv(span_or_event: Any, key: str, value: Any) -> None:
    kv: KeyValue = span_or_event.attributes.add()
    kv.key = key
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.int_value = value


def _request(scope: str, spans: list[Span]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in (
        ("telemetry.sdk.language", "python"),
        ("telemetry.sdk.name", "opentelemetry"),
        ("telemetry.sdk.version", "1.26.0"),
        ("service.name", "vllm-bench"),
    ):
        _kv(rs.resource, k, v)
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    ss.spans.extend(spans)
    return req


def build_step_request(rng: random.Random, n_steps: int = 100) -> ExportTraceServiceRequest:
    """One ``scheduler_steps_N`` span with ``n_steps`` BATCH_SUMMARY events."""
    span = Span(
        trace_id=rng.randbytes(16),
        span_id=rng.randbytes(8),
        name="scheduler_steps_7",
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 10**9,
        flags=256,
    )
    for k, v in (
        ("scheduler.span_sequence", 7),
        ("scheduler.step_range_start", 601),
        ("scheduler.closure_interval", 100),
        ("scheduler.step_range_end", 700),
    ):
        _kv(span, k, v)
    start = M0
    for i in range(n_steps):
        ev = span.events.add()
        ev.name = "step.BATCH_SUMMARY"
        dur = rng.randint(150_000, 600_000)
        ev.time_unix_nano = T0 + (start - M0) + dur + 3000
        prefill = rng.choice([0, 0, 1, 2])
        decode = rng.randint(1, 64)
        ptok = prefill * rng.randint(16, 1024)
        free = rng.randint(1000, 8000)
        summary: tuple[tuple[str, int | float], ...] = (
            ("step.id", 601 + i),
            ("step.ts_start_ns", start),
            ("step.ts_end_ns", start + dur),
            ("step.duration_us", dur // 1000),
            ("queue.running_depth", prefill + decode),
            ("queue.waiting_depth", rng.randint(0, 20)),
            ("batch.num_prefill_reqs", prefill),
            ("batch.num_decode_reqs", decode),
            ("batch.scheduled_tokens", ptok + decode),
            ("batch.prefill_tokens", ptok),
            ("batch.decode_tokens", decode),
            ("batch.num_finished", rng.randint(0, 2)),
            ("batch.num_preempted", 0),
            ("kv.usage_gpu_ratio", 1 - free / 8192),
            ("kv.blocks_total_gpu", 8192),
            ("kv.blocks_free_gpu", free),
        )
        for key, val in summary:
            _kv(ev, key, val)
        start += rng.randint(8_000_000, 30_000_000)
    return _request("vllm.scheduler.step", [span])


_JOURNEY = ("QUEUED", "SCHEDULED", "PREEMPTED", "SCHEDULED", "FINISHED")


def build_core_request(rng: random.Random, n_spans: int = 100) -> ExportTraceServiceRequest:
    """``n_spans`` ``llm_core`` spans with 5 journey events each."""
    spans = []
    for i in range(n_spans):
        mono = M0 + rng.randint(0, 10**12)
        span = Span(
            trace_id=rng.randbytes(16),
            span_id=rng.randbytes(8),
            parent_span_id=rng.randbytes(8),
            name="llm_core",
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=T0 + (mono - M0),
            end_time_unix_nano=T0 + (mono - M0) + 10**9,
            flags=768,
        )
        _kv(span, "gen_ai.request.id", f"chatcmpl-{rng.getrandbits(64):016x}-{i:08x}")
        step = rng.randint(1, 10**6)
        prompt = rng.randint(16, 4096)
        max_tokens = rng.randint(1, 2048)
        preempt = 0
        for j, kind in enumerate(_JOURNEY):
            ev = span.events.add()
            ev.name = "journey." + kind
            mono += rng.randint(10_000, 50_000_000)
            step += j
            preempt += kind == "PREEMPTED"
            ev.time_unix_nano = T0 + (mono - M0) + 334
            attrs: list[tuple[str, Any]] = [
                ("event.type", kind),
                ("ts.monotonic", mono / 1e9),
                ("ts.monotonic_ns", mono),
                ("scheduler.step", step),
                ("phase", "WAITING" if kind == "QUEUED" else "DECODE"),
                ("prefill.done_tokens", 0 if j == 0 else prompt),
                ("prefill.total_tokens", prompt),
                ("decode.done_tokens", j * 3),
                ("decode.max_tokens", max_tokens),
                ("num_preemptions", preempt),
            ]
            if kind == "SCHEDULED":
                attrs.append(("schedule.kind", "FIRST" if j == 1 else "RESUME"))
            if kind == "FINISHED":
                attrs.append(("finish.status", "stopped"))
            for k, v in attrs:
                _kv(ev, k, v)
        spans.append(span)
    return _request("vllm.scheduler", spans)


# ----------------------------------------------------------------------- baseline


def _val(v: dict[str, Any]) -> Any:
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "stringValue" in v:
        return v["stringValue"]
    return next(iter(v.values()), None)


def baseline_decode(data: bytes) -> list[Record]:
    """The naive way: MessageToDict, then walk dicts (same records, little validation)."""
    d = json_format.MessageToDict(ExportTraceServiceRequest.FromString(data))
    out: list[Record] = []
    for rs in d.get("resourceSpans", []):
        rattrs = tuple(
            sorted(
                (a["key"], _val(a["value"])) for a in rs.get("resource", {}).get("attributes", [])
            )
        )
        source = Source(str(hash(rattrs)), rattrs)
        for ss in rs.get("scopeSpans", []):
            scope = ss.get("scope", {}).get("name", "")
            for sp in ss.get("spans", []):
                a = {x["key"]: _val(x["value"]) for x in sp.get("attributes", [])}
                info = SpanInfo(
                    bytes.fromhex(sp["traceId"]) if len(sp["traceId"]) == 32 else b"",
                    b"",
                    b"",
                    sp["name"],
                    scope,
                    source,
                    int(sp["startTimeUnixNano"]),
                    int(sp["endTimeUnixNano"]),
                )
                if sp["name"] == "llm_core":
                    out.append(CoreSpan(info, a["gen_ai.request.id"]))
                else:
                    out.append(
                        StepSpan(
                            info,
                            a["scheduler.span_sequence"],
                            a["scheduler.step_range_start"],
                            a["scheduler.closure_interval"],
                            a.get("scheduler.step_range_end"),
                        )
                    )
                for ev in sp.get("events", []):
                    e = {x["key"]: _val(x["value"]) for x in ev.get("attributes", [])}
                    wall = int(ev["timeUnixNano"])
                    name = ev["name"]
                    if name == "step.BATCH_SUMMARY":
                        out.append(
                            BatchSummary(
                                info, wall, e["step.id"], e["step.ts_start_ns"], e["step.ts_end_ns"],
                                e["step.duration_us"], e["queue.running_depth"], e["queue.waiting_depth"],
                                e["batch.num_prefill_reqs"], e["batch.num_decode_reqs"],
                                e["batch.scheduled_tokens"], e["batch.prefill_tokens"],
                                e["batch.decode_tokens"], e["batch.num_finished"], e["batch.num_preempted"],
                                float(e["kv.usage_gpu_ratio"]), e["kv.blocks_total_gpu"], e["kv.blocks_free_gpu"],
                            )
                        )  # fmt: skip
                    elif name.startswith("journey."):
                        out.append(
                            JourneyEvent(
                                info, JourneyKind(name[8:]), wall, e["ts.monotonic_ns"], e["scheduler.step"],
                                e["phase"], e["prefill.done_tokens"], e["prefill.total_tokens"],
                                e["decode.done_tokens"], e["decode.max_tokens"], e["num_preemptions"],
                                e.get("schedule.kind"), e.get("finish.status"),
                            )
                        )  # fmt: skip
    return out


# ---------------------------------------------------------------------- measuring


def _cpu_rate(fn: Callable[[], int], min_seconds: float, repeats: int) -> float:
    """Best-of-``repeats`` items per CPU second of ``fn`` (returns items per call)."""
    best = 0.0
    for _ in range(repeats):
        n = 0
        t0 = time.process_time()
        while True:
            n += fn()
            dt = time.process_time() - t0
            if dt >= min_seconds:
                break
        best = max(best, n / dt)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print events/s and ratios."""
    p = argparse.ArgumentParser(prog="python -m bench ingest", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per measurement")
    p.add_argument("--repeats", type=int, default=3, help="best of N measurements")
    args = p.parse_args(argv)

    rng = random.Random(42)
    workloads = {
        "scheduler_steps (100 BATCH_SUMMARY)": build_step_request(rng).SerializeToString(),
        "llm_core x100 (5 journey events)": build_core_request(rng).SerializeToString(),
    }
    decoder = Decoder()
    print(f"{'workload':40s} {'coeffd ev/s':>12s} {'baseline ev/s':>14s} {'ratio':>6s}")
    totals = {"coeffd": [0, 0.0], "baseline": [0, 0.0]}
    for name, data in workloads.items():
        res = decoder.decode(FastExportRequest.FromString(data))
        assert res.rejected == 0 and res.ignored == 0, res.reasons
        n_events = sum(1 for r in res.records if not isinstance(r, CoreSpan | StepSpan))
        ours_records = res.records
        base_records = baseline_decode(data)
        # Same output, so the comparison is fair (ids are not carried by the baseline).
        assert [type(r) for r in ours_records] == [type(r) for r in base_records]
        assert all(
            getattr(a, "step", None) == getattr(b, "step", None)
            for a, b in zip(ours_records, base_records, strict=True)
        )

        def ours(data: bytes = data, n: int = n_events) -> int:
            decoder.decode(FastExportRequest.FromString(data))
            return n

        def base(data: bytes = data, n: int = n_events) -> int:
            baseline_decode(data)
            return n

        r_ours = _cpu_rate(ours, args.seconds, args.repeats)
        r_base = _cpu_rate(base, args.seconds, args.repeats)
        for key, rate in (("coeffd", r_ours), ("baseline", r_base)):
            totals[key][0] += n_events
            totals[key][1] += n_events / rate
        print(f"{name:40s} {r_ours:12,.0f} {r_base:14,.0f} {r_ours / r_base:5.1f}x")
    ours_all = totals["coeffd"][0] / totals["coeffd"][1]
    base_all = totals["baseline"][0] / totals["baseline"][1]
    print(
        f"{'both (equal event counts)':40s} {ours_all:12,.0f} {base_all:14,.0f} {ours_all / base_all:5.1f}x"
    )
    print(
        f"targets: >= 250,000 events/s ({'met' if ours_all >= 250_000 else 'MISSED'}), "
        f">= 3x baseline ({'met' if ours_all >= 3 * base_all else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
