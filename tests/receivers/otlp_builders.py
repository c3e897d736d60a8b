"""Build ExportTraceServiceRequests by hand (for malformed-input tests and the bench)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from receivers.otlp.decode import parse_json_request


def av(v: Any) -> dict[str, Any]:
    """An OTLP/JSON AnyValue for a Python value (ints as decimal strings, like OTLP/JSON)."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if v != v:
            return {"doubleValue": "NaN"}  # proto JSON spelling of non-finite doubles
        if abs(v) == float("inf"):
            return {"doubleValue": "Infinity" if v > 0 else "-Infinity"}
        return {"doubleValue": v}
    return {"stringValue": v}


def attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": av(v)} for k, v in d.items()]


def span(
    name: str,
    span_attrs: dict[str, Any],
    events: list[tuple[str, dict[str, Any]]],
    span_id: str = "e4f1a9c07b2d5368",
) -> dict[str, Any]:
    return {
        "traceId": "5d1e4a7f0c9b48e2a3f6b1c27d8e9f40",
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": "1767225600003861420",
        "endTimeUnixNano": "1767225600053421770",
        "attributes": attrs(span_attrs),
        "events": [
            {"timeUnixNano": str(1767225600003911540 + i), "name": n, "attributes": attrs(a)}
            for i, (n, a) in enumerate(events)
        ],
    }


def request(*scopes: tuple[str, list[dict[str, Any]]]) -> ExportTraceServiceRequest:
    return parse_json_request(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": attrs({"service.name": "t"})},
                    "scopeSpans": [{"scope": {"name": s}, "spans": sp} for s, sp in scopes],
                }
            ]
        }
    )


def journey(kind: str = "QUEUED", **over: Any) -> tuple[str, dict[str, Any]]:
    a: dict[str, Any] = {
        "event.type": kind,
        "ts.monotonic": 5000.003911206,
        "ts.monotonic_ns": 5000003911206,
        "scheduler.step": 1041,
        "phase": "WAITING",
        "prefill.done_tokens": 0,
        "prefill.total_tokens": 40,
        "decode.done_tokens": 0,
        "decode.max_tokens": 3,
        "num_preemptions": 0,
    }
    for k, v in over.items():
        key = k.replace("__", ".")
        if v is None:
            a.pop(key, None)
        else:
            a[key] = v
    return "journey." + kind, a


def summary_attrs(step: int = 1042, **over: Any) -> dict[str, Any]:
    a: dict[str, Any] = {
        "step.id": step,
        "step.ts_start_ns": 5000003998412,
        "step.ts_end_ns": 5000004377901,
        "step.duration_us": 379,
        "queue.running_depth": 2,
        "queue.waiting_depth": 0,
        "batch.num_prefill_reqs": 1,
        "batch.num_decode_reqs": 1,
        "batch.scheduled_tokens": 25,
        "batch.prefill_tokens": 24,
        "batch.decode_tokens": 1,
        "batch.num_finished": 0,
        "batch.num_preempted": 0,
        "kv.usage_gpu_ratio": 0.00146484375,
        "kv.blocks_total_gpu": 8192,
        "kv.blocks_free_gpu": 8180,
    }
    for k, v in over.items():
        key = k.replace("__", ".")
        if v is None:
            a.pop(key, None)
        else:
            a[key] = v
    return a


def core_span(
    *events: tuple[str, dict[str, Any]], span_id: str = "e4f1a9c07b2d5368"
) -> dict[str, Any]:
    return span("llm_core", {"gen_ai.request.id": "r-1"}, list(events), span_id)


def step_span(*summaries: dict[str, Any]) -> dict[str, Any]:
    return span(
        "scheduler_steps_11",
        {
            "scheduler.span_sequence": 11,
            "scheduler.step_range_start": 1001,
            "scheduler.closure_interval": 100,
        },
        [("step.BATCH_SUMMARY", s) for s in summaries],
        span_id="71c3e0d9a2b4f586",
    )
