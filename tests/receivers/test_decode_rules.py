"""Decoder rules: type leniency, rejection with reasons, ignoring unknowns, Source ids."""

from __future__ import annotations

import math
from typing import Any

import pytest
from otlp_builders import core_span, journey, request, span, step_span, summary_attrs

from coeffd.receivers.otlp.attrs import MAX_COUNT
from coeffd.receivers.otlp.decode import Decoder, decode_request, source_for_resource
from coeffd.records.events import BatchSummary, CoreSpan, JourneyEvent


def test_numeric_attrs_accept_int_or_double_and_string_ints() -> None:
    # kv ratio sent as an int (a Python value typed by vLLM), a count as an integral double
    res = decode_request(
        request(
            (
                "vllm.scheduler.step",
                [step_span(summary_attrs(kv__usage_gpu_ratio=0, batch__num_finished=2.0))],
            )
        )
    )
    assert res.rejected == 0
    b = res.records[1]
    assert isinstance(b, BatchSummary)
    assert b.kv_usage_gpu_ratio == 0.0 and isinstance(b.kv_usage_gpu_ratio, float)
    assert b.num_finished == 2 and isinstance(b.num_finished, int)


def test_journey_falls_back_to_ts_monotonic_seconds() -> None:
    res = decode_request(request(("vllm.scheduler", [core_span(journey(ts__monotonic_ns=None))])))
    assert res.rejected == 0
    ev = res.records[1]
    assert isinstance(ev, JourneyEvent) and ev.mono_ns == 5000003911206


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"scheduler__step": None}, "missing:scheduler.step"),
        ({"scheduler__step": "1041"}, "type:scheduler.step"),
        ({"scheduler__step": -1}, "range:scheduler.step"),
        ({"prefill__total_tokens": MAX_COUNT + 1}, "range:prefill.total_tokens"),
        ({"decode__done_tokens": 1.5}, "type:decode.done_tokens"),
        ({"decode__done_tokens": math.nan}, "nonfinite:decode.done_tokens"),
        ({"phase": 3}, "type:phase"),
        ({"ts__monotonic_ns": None, "ts__monotonic": None}, "missing:ts.monotonic_ns"),
        ({"ts__monotonic_ns": None, "ts__monotonic": math.inf}, "nonfinite:ts.monotonic"),
    ],
)
def test_bad_journey_event_rejected_rest_kept(override: dict[str, object], reason: str) -> None:
    good = journey("SCHEDULED", **{"schedule.kind": "FIRST"})
    res = decode_request(
        request(("vllm.scheduler", [core_span(journey(**override), good)]))  # type: ignore[arg-type]
    )
    assert res.rejected == 1 and res.rejected_spans == 1
    assert res.reasons == {reason: 1}
    assert [type(r).__name__ for r in res.records] == ["CoreSpan", "JourneyEvent"]
    ev = res.records[1]
    assert isinstance(ev, JourneyEvent) and ev.schedule_kind == "FIRST"


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"kv__usage_gpu_ratio": math.nan}, "nonfinite:kv.usage_gpu_ratio"),
        ({"kv__usage_gpu_ratio": 7.5}, "range:kv.usage_gpu_ratio"),
        ({"step__ts_start_ns": None}, "missing:step.ts_start_ns"),
        ({"batch__scheduled_tokens": 2**62}, "range:batch.scheduled_tokens"),
        ({"queue__waiting_depth": -3}, "range:queue.waiting_depth"),
    ],
)
def test_bad_summary_rejected(override: dict[str, Any], reason: str) -> None:
    res = decode_request(
        request(
            ("vllm.scheduler.step", [step_span(summary_attrs(**override), summary_attrs(1043))])
        )  # type: ignore[arg-type]
    )
    assert res.reasons == {reason: 1}
    assert [getattr(r, "step", None) for r in res.records] == [None, 1043]


def test_span_missing_required_attr_rejects_span_and_events() -> None:
    bad = span("llm_core", {}, [journey(), journey("SCHEDULED")])
    res = decode_request(
        request(("vllm.scheduler", [bad, core_span(journey(), span_id="00000000000000aa")]))
    )
    assert res.rejected == 3 and res.rejected_spans == 1
    assert res.reasons == {"missing:gen_ai.request.id": 1, "parent_rejected": 2}
    assert [type(r).__name__ for r in res.records] == ["CoreSpan", "JourneyEvent"]
    assert (
        isinstance(res.records[0], CoreSpan)
        and res.records[0].span.span_id.hex() == "00000000000000aa"
    )


def test_unknown_scopes_spans_events_are_ignored() -> None:
    res = decode_request(
        request(
            (
                "vllm.llm_engine",
                [span("llm_request", {"gen_ai.request.id": "x"}, [("api.ARRIVED", {})])],
            ),
            (
                "vllm.scheduler",
                [span("something_else", {}, []), core_span(("journey.TELEPORTED", {}), journey())],
            ),
        )
    )
    assert res.rejected == 0
    assert res.ignored == 2 + 1 + 1  # unknown scope (span+event), unknown span, unknown event
    assert [type(r).__name__ for r in res.records] == ["CoreSpan", "JourneyEvent"]


def test_empty_request() -> None:
    res = decode_request(request())
    assert (res.records, res.rejected, res.ignored) == ([], 0, 0)


def test_source_id_stable_and_cached() -> None:
    req = request(("vllm.scheduler", [core_span(journey())]))
    res1 = Decoder().decode(req)
    d = Decoder()
    res2 = d.decode(req)
    res3 = d.decode(req)
    s1, s2, s3 = (r.records[0].span.source for r in (res1, res2, res3))  # type: ignore[union-attr]
    assert s1 == s2 and s2 is s3  # equal across decoders, identical within one
    assert len(s1.id) == 12 and s1.get("service.name") == "t"
    # order of resource attributes does not matter
    r = req.resource_spans[0].resource
    kv = r.attributes.add()
    kv.key, kv.value.string_value = "a.first", "1"
    other = type(r)()
    other.attributes.add().CopyFrom(kv)
    other.attributes.add().CopyFrom(r.attributes[0])
    assert source_for_resource(r).id == source_for_resource(other).id != s1.id


@pytest.mark.parametrize(
    ("field", "value"),
    [("traceId", "abcd"), ("spanId", "00"), ("parentSpanId", "0102"), ("startTimeUnixNano", "0")],
)
def test_bad_ids_or_times_reject_the_span(field: str, value: str) -> None:
    s = core_span(journey())
    s[field] = value
    res = decode_request(request(("vllm.scheduler", [s])))
    assert res.records == [] and res.rejected == 2
    assert set(res.reasons) == {
        "ids" if field != "startTimeUnixNano" else "range:span_time",
        "parent_rejected",
    }


# ------------------------------------------------------- partial decode under shedding
_PARTIAL_FIELDS = (
    "step", "start_mono_ns", "end_mono_ns", "running_depth", "waiting_depth",
    "num_prefill_reqs", "num_decode_reqs", "scheduled_tokens", "kv_usage_gpu_ratio",
)  # fmt: skip


def _summaries(dec: Decoder, *steps: dict[str, Any]) -> list[Any]:
    res = dec.decode(request(("vllm.scheduler.step", [step_span(*steps)])))
    return [r for r in res.records if isinstance(r, BatchSummary)]


def test_shed_steps_decode_partially_and_kept_steps_fully() -> None:
    """A decoder with a step filter reads only the joiner's bookkeeping fields of the
    steps it rejects, and the others exactly as without a filter."""
    steps = [summary_attrs(n, batch__num_finished=n % 3) for n in (1042, 1043, 1044, 1045)]
    full = _summaries(Decoder(), *steps)
    dec = Decoder()
    dec.step_filter = lambda n: n % 2 == 0
    got = _summaries(dec, *steps)
    assert [s.step for s in got] == [1042, 1043, 1044, 1045]
    for f, g in zip(full, got, strict=True):
        assert not f.partial
        if g.step % 2 == 0:
            assert g == f
            continue
        assert g.partial
        for name in _PARTIAL_FIELDS:
            assert getattr(g, name) == getattr(f, name), name
        assert g.prefill_tokens == g.num_finished == g.kv_blocks_total_gpu == 0
        assert f.prefill_tokens > 0 and f.kv_blocks_total_gpu > 0
    dec.step_filter = None  # shedding over: full decodes again
    assert _summaries(dec, *steps) == full


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"step__id": None}, "missing:step.id"),
        ({"step__id": -5}, "range:step.id"),
        ({"step__id": "1043"}, "type:step.id"),
        ({"kv__usage_gpu_ratio": 7.5}, "range:kv.usage_gpu_ratio"),
        ({"step__ts_end_ns": None}, "missing:step.ts_end_ns"),
    ],
)
def test_partial_decode_rejects_like_the_full_one(override: dict[str, Any], reason: str) -> None:
    """Bad values in the fields a shed step still needs are rejected with the same reason."""
    dec = Decoder()
    dec.step_filter = lambda n: False  # shed everything
    res = dec.decode(
        request(
            ("vllm.scheduler.step", [step_span(summary_attrs(**override), summary_attrs(1043))])
        )
    )
    assert res.reasons == {reason: 1}
    assert [getattr(r, "step", None) for r in res.records] == [None, 1043]
    assert res.records[1].partial  # type: ignore[union-attr]
