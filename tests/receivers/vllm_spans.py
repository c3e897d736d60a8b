"""The spec §6 worked example, emitted through the real OpenTelemetry SDK.

Two TracerProviders stand in for vLLM's two processes (EngineCore and API server),
each with its own exporter, exactly as vLLM sets them up. Span ids are fixed with an
IdGenerator so that the exported spans equal the example file's, and every timestamp is
explicit so that the decoded records equal the example's numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

TRACE_R1 = 0x5D1E4A7F0C9B48E2A3F6B1C27D8E9F40
TRACE_STEPS = 0x9F8E2B6C1D0A47F3B5C8E1A2D4F60B7E
SPAN_REQUEST = 0x3C9E7D12A0F45B86
SPAN_CORE = 0xE4F1A9C07B2D5368
SPAN_STEPS = 0x71C3E0D9A2B4F586
T0 = 1767225600000000000  # wall ns ⇔ mono 5000 s


class FixedIds(IdGenerator):
    def __init__(self, spans: list[int], traces: list[int]) -> None:
        self._spans: Iterator[int] = iter(spans)
        self._traces: Iterator[int] = iter(traces)

    def generate_span_id(self) -> int:
        return next(self._spans)

    def generate_trace_id(self) -> int:
        return next(self._traces)


def journey_attrs(
    etype: str, mono_ns: int, step: int, phase: str, pd: int, dd: int, **extra: str
) -> dict[str, Any]:
    return {
        "event.type": etype,
        "ts.monotonic": mono_ns / 1e9,
        "ts.monotonic_ns": mono_ns,
        "scheduler.step": step,
        "phase": phase,
        "prefill.done_tokens": pd,
        "prefill.total_tokens": 40,
        "decode.done_tokens": dd,
        "decode.max_tokens": 3,
        "num_preemptions": 0,
        **extra,
    }


def summary(step: int, start: int, end: int, sched: int, prefill: int) -> dict[str, Any]:
    return {
        "step.id": step,
        "step.ts_start_ns": start,
        "step.ts_end_ns": end,
        "step.duration_us": (end - start) // 1000,
        "queue.running_depth": 2,
        "queue.waiting_depth": 0,
        "batch.num_prefill_reqs": 1,
        "batch.num_decode_reqs": 1,
        "batch.scheduled_tokens": sched,
        "batch.prefill_tokens": prefill,
        "batch.decode_tokens": 1,
        "batch.num_finished": 0,
        "batch.num_preempted": 0,
        "kv.usage_gpu_ratio": 0.00146484375,
        "kv.blocks_total_gpu": 8192,
        "kv.blocks_free_gpu": 8180,
    }


def snapshot(
    rid: str,
    phase: str,
    prompt: int,
    computed: int,
    out: int,
    sched: int,
    alloc: int,
    cached: int,
    eff: int,
) -> dict[str, Any]:
    return {
        "step.id": 1042,
        "request.id": rid,
        "request.phase": phase,
        "request.num_prompt_tokens": prompt,
        "request.num_computed_tokens": computed,
        "request.num_output_tokens": out,
        "request.num_preemptions": 0,
        "request.scheduled_tokens_this_step": sched,
        "kv.blocks_allocated_gpu": alloc,
        "kv.blocks_cached_gpu": cached,
        "request.effective_prompt_len": eff,
    }


R1_INTERNAL = "chatcmpl-3f2a9c1e5b7d4a60-7c1d2e3f"
R2_INTERNAL = "cmpl-9a0b1c2d3e4f5061-0-5e6f7a8b"


def emit_engine(exporter: SpanExporter, resource: Resource) -> TracerProvider:
    """EngineCore: llm_core (child of the API's llm_request) and scheduler_steps_11."""
    provider = TracerProvider(
        resource=resource, id_generator=FixedIds([SPAN_STEPS, SPAN_CORE], [TRACE_STEPS])
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    core_tracer = provider.get_tracer("vllm.scheduler")
    step_tracer = provider.get_tracer("vllm.scheduler.step")

    steps = step_tracer.start_span(
        "scheduler_steps_11",
        kind=SpanKind.INTERNAL,
        start_time=1767225599483987520,
        attributes={
            "scheduler.span_sequence": 11,
            "scheduler.step_range_start": 1001,
            "scheduler.closure_interval": 100,
        },
    )
    parent = SpanContext(TRACE_R1, SPAN_REQUEST, is_remote=True, trace_flags=TraceFlags(1))
    core = core_tracer.start_span(
        "llm_core",
        context=trace.set_span_in_context(NonRecordingSpan(parent)),
        kind=SpanKind.INTERNAL,
        start_time=1767225600003861420,
        attributes={"gen_ai.request.id": R1_INTERNAL},
    )
    core.add_event(
        "journey.QUEUED",
        journey_attrs("QUEUED", 5000003911206, 1041, "WAITING", 0, 0),
        1767225600003911540,
    )
    core.add_event(
        "journey.SCHEDULED",
        journey_attrs(
            "SCHEDULED", 5000004212655, 1042, "PREFILL", 0, 0, **{"schedule.kind": "FIRST"}
        ),
        1767225600004213010,
    )
    steps.add_event(
        "step.BATCH_SUMMARY",
        summary(1042, 5000003998412, 5000004377901, 25, 24),
        1767225600004381050,
    )
    steps.add_event(
        "step.REQUEST_SNAPSHOT",
        snapshot(R2_INTERNAL, "DECODE", 100, 137, 37, 1, 9, 8, 100),
        1767225600004402700,
    )
    steps.add_event(
        "step.REQUEST_SNAPSHOT",
        snapshot(R1_INTERNAL, "PREFILL", 40, 16, 0, 24, 3, 2, 24),
        1767225600004421900,
    )
    steps.add_event(
        "step.BATCH_SUMMARY", summary(1043, 5000016502377, 5000016790118, 2, 1), 1767225600016793400
    )
    core.add_event(
        "journey.FIRST_TOKEN",
        journey_attrs("FIRST_TOKEN", 5000028803559, 1042, "DECODE", 40, 1),
        1767225600028803910,
    )
    core.add_event(
        "journey.FINISHED",
        journey_attrs(
            "FINISHED", 5000053398204, 1044, "DECODE", 40, 3, **{"finish.status": "length"}
        ),
        1767225600053398560,
    )
    core.end(end_time=1767225600053421770)
    steps.set_attribute("scheduler.step_range_end", 1100)
    steps.end(end_time=1767225600723955112)
    return provider


def emit_api(exporter: SpanExporter, resource: Resource) -> TracerProvider:
    """API server: llm_request with its four api events."""
    provider = TracerProvider(resource=resource, id_generator=FixedIds([SPAN_REQUEST], [TRACE_R1]))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.api")
    span = tracer.start_span(
        "llm_request",
        kind=SpanKind.SERVER,
        start_time=T0,
        attributes={
            "gen_ai.request.id": "chatcmpl-3f2a9c1e5b7d4a60",
            "http.route": "/v1/chat/completions",
            "gen_ai.response.model": "qwen2.5-7b-instruct",
            "gen_ai.usage.prompt_tokens": 40,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 1.0,
            "gen_ai.request.max_tokens": 3,
            "gen_ai.request.n": 1,
        },
    )
    for name, wall, mono in (
        ("api.ARRIVED", 1767225600000062190, 5000.00006184),
        ("api.HANDOFF_TO_CORE", 1767225600001183400, 5000.00118302),
        ("api.FIRST_RESPONSE_FROM_CORE", 1767225600029447690, 5000.02944731),
    ):
        span.add_event(name, {"event.ts.monotonic": mono}, wall)
    span.set_attribute("gen_ai.usage.completion_tokens", 3)
    span.add_event("api.DEPARTED", {"event.ts.monotonic": 5000.054311884}, 1767225600054312240)
    span.end(end_time=1767225600054330015)
    return provider
