"""Every span and event simfleet emits has vLLM's names, keys and value types (spec §2)."""

from __future__ import annotations

import collections
import json

from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import (
    ApiEvent,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    RequestSnapshot,
    RequestSpan,
    StepSpan,
)
from coeffd.simfleet.telemetry import request_to_json

S, INT, D = "string_value", "int_value", "double_value"

# The spec's tables, written out so a renamed key or a changed type fails here.
SPAN_ATTRS: dict[str, tuple[dict[str, str], set[str]]] = {
    # name: ({key: type}, optional keys)
    "llm_request": (
        {
            "gen_ai.request.id": S,
            "http.route": S,
            "gen_ai.response.model": S,
            "gen_ai.usage.prompt_tokens": INT,
            "gen_ai.request.temperature": D,
            "gen_ai.request.top_p": D,
            "gen_ai.request.max_tokens": INT,
            "gen_ai.request.n": INT,
            "gen_ai.usage.completion_tokens": INT,
        },
        {"gen_ai.usage.completion_tokens"},
    ),
    "llm_core": ({"gen_ai.request.id": S}, set()),
    "scheduler_steps": (
        {
            "scheduler.span_sequence": INT,
            "scheduler.step_range_start": INT,
            "scheduler.closure_interval": INT,
            "scheduler.step_range_end": INT,
        },
        set(),
    ),
}
JOURNEY_COMMON = {
    "event.type": S,
    "ts.monotonic": D,
    "ts.monotonic_ns": INT,
    "scheduler.step": INT,
    "phase": S,
    "prefill.done_tokens": INT,
    "prefill.total_tokens": INT,
    "decode.done_tokens": INT,
    "decode.max_tokens": INT,
    "num_preemptions": INT,
}
EVENT_ATTRS: dict[str, tuple[dict[str, str], set[str]]] = {
    "api.ARRIVED": ({"event.ts.monotonic": D}, set()),
    "api.HANDOFF_TO_CORE": ({"event.ts.monotonic": D}, set()),
    "api.FIRST_RESPONSE_FROM_CORE": ({"event.ts.monotonic": D}, set()),
    "api.DEPARTED": ({"event.ts.monotonic": D}, set()),
    "api.ABORTED": ({"event.ts.monotonic": D, "reason": S, "error": S}, {"error"}),
    "journey.QUEUED": (JOURNEY_COMMON, set()),
    "journey.SCHEDULED": ({**JOURNEY_COMMON, "schedule.kind": S}, set()),
    "journey.FIRST_TOKEN": (JOURNEY_COMMON, set()),
    "journey.PREEMPTED": (JOURNEY_COMMON, set()),
    "journey.FINISHED": ({**JOURNEY_COMMON, "finish.status": S}, set()),
    "step.BATCH_SUMMARY": (
        {
            "step.id": INT,
            "step.ts_start_ns": INT,
            "step.ts_end_ns": INT,
            "step.duration_us": INT,
            "queue.running_depth": INT,
            "queue.waiting_depth": INT,
            "batch.num_prefill_reqs": INT,
            "batch.num_decode_reqs": INT,
            "batch.scheduled_tokens": INT,
            "batch.prefill_tokens": INT,
            "batch.decode_tokens": INT,
            "batch.num_finished": INT,
            "batch.num_preempted": INT,
            "kv.usage_gpu_ratio": D,
            "kv.blocks_total_gpu": INT,
            "kv.blocks_free_gpu": INT,
        },
        set(),
    ),
    "step.REQUEST_SNAPSHOT": (
        {
            "step.id": INT,
            "request.id": S,
            "request.phase": S,
            "request.num_prompt_tokens": INT,
            "request.num_computed_tokens": INT,
            "request.num_output_tokens": INT,
            "request.num_preemptions": INT,
            "request.scheduled_tokens_this_step": INT,
            "kv.blocks_allocated_gpu": INT,
            "kv.blocks_cached_gpu": INT,
            "request.effective_prompt_len": INT,
        },
        {"request.effective_prompt_len"},
    ),
}
SCOPE_OF = {
    "llm_request": "vllm.api",
    "llm_core": "vllm.scheduler",
    "scheduler_steps": "vllm.scheduler.step",
}
KIND_OF = {"llm_request": 2, "llm_core": 1, "scheduler_steps": 1}
EVENTS_OF = {
    "llm_request": "api.",
    "llm_core": "journey.",
    "scheduler_steps": "step.",
}


def _check_attrs(where: str, attrs: object, table: tuple[dict[str, str], set[str]]) -> None:
    expected, optional = table
    got = {kv.key: kv.value.WhichOneof("value") for kv in attrs}  # type: ignore[attr-defined]
    missing = set(expected) - set(got) - optional
    assert not missing, f"{where}: missing {missing}"
    unknown = set(got) - set(expected)
    assert not unknown, f"{where}: unexpected {unknown}"
    for k, t in got.items():
        assert t == expected[k], f"{where}: {k} is {t}, spec says {expected[k]}"


def test_every_span_and_event_matches_the_spec(steady_full):
    seen = collections.Counter()
    for scope, _res, sp in steady_full.spans():
        base = "scheduler_steps" if sp.name.startswith("scheduler_steps_") else sp.name
        assert base in SPAN_ATTRS, sp.name
        assert scope == SCOPE_OF[base]
        assert sp.kind == KIND_OF[base]
        _check_attrs(sp.name, sp.attributes, SPAN_ATTRS[base])
        for ev in sp.events:
            assert ev.name.startswith(EVENTS_OF[base]), (sp.name, ev.name)
            _check_attrs(ev.name, ev.attributes, EVENT_ATTRS[ev.name])
            seen[ev.name] += 1
        seen[base] += 1
    for name in (
        "llm_request",
        "llm_core",
        "scheduler_steps",
        "api.ARRIVED",
        "api.HANDOFF_TO_CORE",
        "api.FIRST_RESPONSE_FROM_CORE",
        "api.DEPARTED",
        "journey.QUEUED",
        "journey.SCHEDULED",
        "journey.FIRST_TOKEN",
        "journey.FINISHED",
        "step.BATCH_SUMMARY",
        "step.REQUEST_SNAPSHOT",
    ):
        assert seen[name] > 0, name


def test_span_linkage_flags_and_clocks(steady_full):
    api = {}
    core = []
    for _scope, _res, sp in steady_full.spans():
        if sp.name == "llm_request":
            api[sp.span_id] = sp
            assert sp.flags == 0x100 and not sp.parent_span_id
        elif sp.name == "llm_core":
            core.append(sp)
            assert sp.flags == 0x300  # parent extracted from injected trace headers
        else:
            assert sp.flags == 0x100 and not sp.parent_span_id
    assert core
    offsets = set()
    for sp in core:
        parent = api[sp.parent_span_id]
        assert parent.trace_id == sp.trace_id
        for ev in sp.events:
            a = {kv.key: kv.value for kv in ev.attributes}
            ns = a["ts.monotonic_ns"].int_value
            assert a["ts.monotonic"].double_value == ns / 1e9
            offsets.add((ev.time_unix_nano - ns) // 1000)  # wall read right after mono
        assert sp.start_time_unix_nano <= sp.events[0].time_unix_nano
        assert sp.end_time_unix_nano >= sp.events[-1].time_unix_nano
    assert max(offsets) - min(offsets) <= 1


def test_decodes_with_the_project_receiver(steady_full):
    dec = Decoder()
    kinds = collections.Counter()
    for req in steady_full.requests:
        res = dec.decode(req)
        assert res.rejected == 0, res.reasons
        assert res.ignored == 0
        for r in res.records:
            kinds[type(r)] += 1
    finished = steady_full.result.requests_finished
    assert kinds[RequestSpan] == finished
    assert kinds[CoreSpan] == finished
    assert kinds[JourneyEvent] >= 4 * finished
    assert kinds[ApiEvent] >= 2 * finished
    assert kinds[BatchSummary] == steady_full.result.steps
    assert kinds[RequestSnapshot] > 0
    assert kinds[StepSpan] >= steady_full.result.steps // 10


def test_step_spans_close_on_multiples_of_k(steady_full):
    spans = sorted(
        (sp for _s, _r, sp in steady_full.spans() if sp.name.startswith("scheduler_steps_")),
        key=lambda sp: sp.start_time_unix_nano,
    )
    prev_end = 0
    for i, sp in enumerate(spans, start=1):
        a = {kv.key: kv.value.int_value for kv in sp.attributes}
        assert sp.name == f"scheduler_steps_{i}" and a["scheduler.span_sequence"] == i
        assert a["scheduler.step_range_start"] == prev_end + 1
        assert a["scheduler.closure_interval"] == 10
        if i < len(spans):
            assert a["scheduler.step_range_end"] % 10 == 0
        prev_end = a["scheduler.step_range_end"]
        ids = [{kv.key: kv.value.int_value for kv in ev.attributes}["step.id"] for ev in sp.events]
        assert all(a["scheduler.step_range_start"] <= n <= prev_end for n in ids)


def test_json_lines_are_collector_otlp_json(steady_full):
    ints: list[object] = []
    for req in steady_full.requests[:4]:
        line = request_to_json(req)
        assert b"\n" not in line
        d = json.loads(line)
        sp = d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert len(sp["traceId"]) == 32 and len(sp["spanId"]) == 16  # hex, not base64
        assert isinstance(sp["startTimeUnixNano"], str)
        ints += [
            a["value"]["intValue"]
            for s in d["resourceSpans"][0]["scopeSpans"]
            for x in s["spans"]
            for e in x.get("events", [])
            for a in e["attributes"]
            if "intValue" in a["value"]
        ]
    assert ints and all(isinstance(v, str) for v in ints)


def test_fast_json_renderer_equals_sdk_encoding_and_keeps_dropped_counts():
    """``spans_to_json`` (file fast path) == ``request_to_json(encode_spans(...))`` byte for
    byte, on a run whose step spans overflow vLLM's 128-event limit."""
    import io

    from coeffd import simfleet
    from coeffd.simfleet.telemetry import JsonLinesSink

    fast, slow = io.BytesIO(), io.BytesIO()
    simfleet.run(
        "overload",
        3.0,
        seed=3,
        trace_out=fast,
        trace_sinks=[JsonLinesSink(slow, fast=False)],  # __call__ path: SDK encoder + protobuf walk
        rates=simfleet.SampleRates(1.0, 1.0, 0.2, 100),
        drain_s=2.0,
    )
    assert fast.getvalue() == slow.getvalue()
    assert b'"droppedEventsCount"' in fast.getvalue()


def test_aborts_and_preemptions_match_the_spec():
    """Overload: client disconnects (api.ABORTED, FINISHED aborted) and PREEMPTED events."""
    from simfleet_support import Captured

    from coeffd import simfleet

    cap = Captured(
        scenario="overload",
        duration_s=10.0,
        seed=4,
        rates=simfleet.SampleRates(1.0, 0.1, 0.1, 10),
        drain_s=10.0,
    )
    seen: collections.Counter[str] = collections.Counter()
    for _scope, _res, sp in cap.spans():
        names = {ev.name for ev in sp.events}
        if sp.name == "llm_request" and not names & {"api.DEPARTED", "api.ABORTED"}:
            seen["no_terminal"] += 1
        for ev in sp.events:
            _check_attrs(ev.name, ev.attributes, EVENT_ATTRS[ev.name])
            seen[ev.name] += 1
            if ev.name == "journey.FINISHED":
                a = {kv.key: kv.value.string_value for kv in ev.attributes}
                seen["status:" + a["finish.status"]] += 1
    assert seen["api.ABORTED"] and seen["status:aborted"] and seen["journey.PREEMPTED"]
    assert seen["no_terminal"]  # cleanup-only ends (spec §2.2)
    dec = Decoder()
    for req in cap.requests:
        assert dec.decode(req).rejected == 0
