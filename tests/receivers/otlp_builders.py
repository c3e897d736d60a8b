"""Build ExportTraceServiceRequests by hand (for malformed-input tests and the bench)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from vllm_spans import journey_attrs, summary

from coeffd.receivers.otlp.jsonbody import parse_json_request


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


def override(a: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Apply ``key__part=value`` overrides (``.`` spelled ``__``); ``None`` removes a key."""
    for k, v in over.items():
        key = k.replace("__", ".")
        if v is None:
            a.pop(key, None)
        else:
            a[key] = v
    return a


def journey(kind: str = "QUEUED", **over: Any) -> tuple[str, dict[str, Any]]:
    """A spec-shaped journey event (R1's QUEUED numbers), with overrides."""
    return "journey." + kind, override(
        journey_attrs(kind, 5000003911206, 1041, "WAITING", 0, 0), over
    )


def summary_attrs(step: int = 1042, **over: Any) -> dict[str, Any]:
    """A spec-shaped BATCH_SUMMARY (step 1042's numbers), with overrides."""
    return override(summary(step, 5000003998412, 5000004377901, 25, 24), over)


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
