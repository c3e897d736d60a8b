"""The compiled decoder (``_wire.c``) against the pure-Python one, its reference: the same
records, reject/ignore counts and reasons (in the same order) on good and bad input, and
no crash on any bytes.

Inputs are built as raw protobuf here, so that what a message API cannot write (a key
twice, a status twice, a value field twice, the wrong wire type, fields out of order,
unknown fields, groups, nested garbage, truncations) is covered too.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from otlp_builders import override

from bench.ingest import build_api_request, build_core_request, build_step_request
from coeffd.receivers.otlp import native
from coeffd.receivers.otlp.decode import Decoder
from coeffd.receivers.otlp.jsonbody import parse_json_request

# Only an explicit COEFFD_PURE_DECODE=1 skips these: an install that failed to build the
# extension fails test_the_extension_is_built instead of passing unnoticed.
pytestmark = pytest.mark.skipif(
    native.UNAVAILABLE == "COEFFD_PURE_DECODE is set", reason=native.UNAVAILABLE
)


def test_the_extension_is_built() -> None:
    assert native.AVAILABLE, native.UNAVAILABLE
    assert Decoder().native and not Decoder(native=False).native


T = 1767225600_000_000_000
M = 5000_000_000_000


# ------------------------------------------------------------------ raw protobuf


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vi(num: int, v: int) -> bytes:
    return varint(num << 3) + varint(v)


def ld(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(num << 3 | 2) + varint(len(data)) + data


def f64(num: int, v: int) -> bytes:
    return varint(num << 3 | 1) + struct.pack("<Q", v & ((1 << 64) - 1))


def dbl(num: int, v: float) -> bytes:
    return varint(num << 3 | 1) + struct.pack("<d", v)


def av(v: Any) -> bytes:
    """An AnyValue: str, bool, int, float, or raw bytes (taken as already encoded)."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, bool):
        return vi(2, int(v))
    if isinstance(v, int):
        return vi(3, v)
    if isinstance(v, float):
        return dbl(4, v)
    return ld(1, v)


def kv(key: str, v: Any) -> bytes:
    return ld(1, key) + ld(2, av(v))


def attrs(num: int, d: dict[str, Any] | Iterable[tuple[str, Any]]) -> bytes:
    items = d.items() if isinstance(d, dict) else d
    return b"".join(ld(num, kv(k, v)) for k, v in items if v is not None)  # None: absent


def event(name: str, a: Any, t: int = T + 5, extra: bytes = b"") -> bytes:
    return f64(1, t) + ld(2, name) + attrs(3, a) + extra


def span(
    name: str,
    a: Any,
    events: Iterable[bytes] = (),
    *,
    ids: tuple[bytes, bytes, bytes] = (b"t" * 16, b"s" * 8, b""),
    times: tuple[int, int] = (T, T + 10**9),
    extra: bytes = b"",
) -> bytes:
    head = ld(1, ids[0]) + ld(2, ids[1]) + (ld(4, ids[2]) if ids[2] else b"") + ld(5, name)
    body = f64(7, times[0]) + f64(8, times[1]) + attrs(9, a)
    return head + body + b"".join(ld(11, e) for e in events) + extra


def scope_spans(scope: str, *spans: bytes, extra: bytes = b"") -> bytes:
    return ld(1, ld(1, scope)) + b"".join(ld(2, s) for s in spans) + extra


def request(*scopes: bytes, resource: bytes | None = None, extra: bytes = b"") -> bytes:
    res = attrs(1, {"service.name": "t"}) if resource is None else resource
    return ld(1, ld(1, res) + b"".join(ld(2, s) for s in scopes) + extra)


# --------------------------------------------------------------------- vLLM kinds


def summary(step: int = 1042, **over: Any) -> dict[str, Any]:
    a: dict[str, Any] = {
        "step.id": step,
        "step.ts_start_ns": M + 100,
        "step.ts_end_ns": M + 400,
        "step.duration_us": 300,
        "queue.running_depth": 3,
        "queue.waiting_depth": 1,
        "batch.num_prefill_reqs": 1,
        "batch.num_decode_reqs": 2,
        "batch.scheduled_tokens": 42,
        "batch.prefill_tokens": 40,
        "batch.decode_tokens": 2,
        "batch.num_finished": 0,
        "batch.num_preempted": 0,
        "kv.usage_gpu_ratio": 0.25,
        "kv.blocks_total_gpu": 8192,
        "kv.blocks_free_gpu": 6144,
    }
    return override(a, over)


def journey(**over: Any) -> dict[str, Any]:
    a: dict[str, Any] = {
        "event.type": "QUEUED",
        "ts.monotonic": (M + 77) / 1e9,
        "ts.monotonic_ns": M + 77,
        "scheduler.step": 1041,
        "phase": "WAITING",
        "prefill.done_tokens": 0,
        "prefill.total_tokens": 40,
        "decode.done_tokens": 0,
        "decode.max_tokens": 3,
        "num_preemptions": 0,
        "schedule.kind": "FIRST",
    }
    return override(a, over)


STEP_SPAN = {
    "scheduler.span_sequence": 11,
    "scheduler.step_range_start": 1001,
    "scheduler.closure_interval": 100,
}
REQ_SPAN = {
    "gen_ai.request.id": "r-1",
    "http.route": "/v1/completions",
    "gen_ai.usage.prompt_tokens": 40,
    "gen_ai.request.temperature": 1,
}


def steps(*events: bytes, **kw: Any) -> bytes:
    return request(
        scope_spans("vllm.scheduler.step", span("scheduler_steps_11", STEP_SPAN, events, **kw))
    )


def core(*events: bytes, **kw: Any) -> bytes:
    return request(
        scope_spans("vllm.scheduler", span("llm_core", {"gen_ai.request.id": "r"}, events, **kw))
    )


def api(*events: bytes, span_attrs: Any = None, **kw: Any) -> bytes:
    sp = span("llm_request", REQ_SPAN if span_attrs is None else span_attrs, events, **kw)
    return request(scope_spans("vllm.api", sp))


BAD_VALUES: tuple[Any, ...] = (
    None, 0, -1, 1 << 48, (1 << 48) + 1, (1 << 63) - 1, -(1 << 63), 0.0, -0.0, 2.0, 1.5,
    -2.0, 2.0**48, 2.0**63, 1e300, math.nan, math.inf, -math.inf, 9.2e9, 9.3e9, "", "x",
    True, b"", ld(5, b""), ld(6, ld(1, kv("a", 1))), ld(7, b"\x00"), vi(8, 3),
    vi(3, 5) + ld(1, "late string"), ld(1, "s") + vi(3, 7),
)  # fmt: skip


def _summary_cases() -> Iterable[bytes]:
    for key in summary():
        for v in BAD_VALUES:
            yield steps(event("step.BATCH_SUMMARY", summary(**{key.replace(".", "__"): v})))


def _journey_cases() -> Iterable[bytes]:
    for key in journey():
        for v in BAD_VALUES:
            a = journey(**{key.replace(".", "__"): v})
            yield core(event("journey.SCHEDULED", a))
            yield core(event("journey.FINISHED", {**a, "ts.monotonic_ns": None}))
    for mono in BAD_VALUES:  # the ts.monotonic fallback
        a = journey(ts__monotonic_ns=None, ts__monotonic=mono)
        yield core(event("journey.QUEUED", a), event("journey.FIRST_TOKEN", journey()))


def _api_cases() -> Iterable[bytes]:
    for v in BAD_VALUES:
        yield api(event("api.ARRIVED", {"event.ts.monotonic": v, "reason": v, "error": "e"}))
        for key in REQ_SPAN:
            yield api(
                event("api.DEPARTED", {"event.ts.monotonic": 5000.5}),
                span_attrs={**REQ_SPAN, key: v},
            )
    status = ld(15, vi(3, 2))
    yield api(event("api.ABORTED", {"event.ts.monotonic": 1.0}), extra=status)
    yield api(extra=ld(15, vi(3, (1 << 32) + 2) + ld(2, "boom")))


def _structure_cases() -> Iterable[bytes]:
    ok_s = event("step.BATCH_SUMMARY", summary())
    ok_j = event("journey.QUEUED", journey())
    yield steps(ok_s, event("step.UNKNOWN", {}), event("", summary()))
    yield steps(
        event("step.REQUEST_SNAPSHOT", {"step.id": 5, "request.id": "r", "request.phase": "DECODE"})
    )
    yield request(scope_spans("other.scope", span("llm_core", {}, [ok_j])))
    yield request(scope_spans("vllm.scheduler", span("not_core", {}, [ok_j, ok_j])))
    for ids in (
        (b"t" * 15, b"s" * 8, b""),
        (b"t" * 16, b"s" * 9, b""),
        (b"t" * 16, b"s" * 8, b"p" * 4),
    ):
        yield core(ok_j, ok_j, ids=ids)
    for times in ((0, T), (T, 0), (1 << 63, T), (T, (1 << 64) - 1)):
        yield core(ok_j, times=times)
    for t in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        yield core(event("journey.QUEUED", journey(), t=t), ok_j)
    yield core(ok_j, extra=vi(12, 7))  # dropped_events_count
    yield core(ok_j, extra=vi(12, (1 << 32) + 3))
    # keys twice (the last wins), a value field twice (merged), key or value missing
    yield steps(event("step.BATCH_SUMMARY", [*summary().items(), ("step.id", 7), ("step.id", 9)]))
    yield steps(
        event(
            "step.BATCH_SUMMARY",
            summary(),
            extra=ld(3, ld(1, "step.id") + ld(2, vi(3, 4)) + ld(2, dbl(4, 2.0))),
        )
    )
    yield steps(
        event(
            "step.BATCH_SUMMARY",
            summary(),
            extra=ld(3, ld(2, vi(3, 4))) + ld(3, ld(1, "kv.usage_gpu_ratio")),
        )
    )
    # fields out of the usual order; unknown fields of every wire type at every level
    unk = vi(99, 1) + f64(98, 2) + ld(97, b"zz") + varint(96 << 3 | 5) + b"abcd"
    yield request(
        ld(2, span("scheduler_steps_1", STEP_SPAN, [ok_s]))
        + ld(1, ld(1, "vllm.scheduler.step"))
        + unk,
        extra=unk,
    )
    yield steps(event("step.BATCH_SUMMARY", summary(), extra=unk), extra=unk)
    yield (
        ld(
            1,
            ld(
                2,
                scope_spans("vllm.scheduler", span("llm_core", {"gen_ai.request.id": "r"}, [ok_j])),
            )
            + ld(1, attrs(1, {"a": "b"})),
        )
        + unk
    )
    yield steps(
        event(
            "step.BATCH_SUMMARY",
            summary(),
            extra=ld(3, kv("x", ld(5, ld(1, ld(5, ld(1, ld(5, b""))))))),
        )
    )
    yield request(
        scope_spans("vllm.scheduler", span("llm_core", {"gen_ai.request.id": "r"}, [ok_j])),
        resource=b"",
    )
    yield request() + ld(1, b"")
    # more attributes than the walker reads in one pass (64), the needed ones last
    many = [(f"x.{i}", i) for i in range(70)]
    yield steps(event("step.BATCH_SUMMARY", [*many, *summary(step=9).items(), ("step.id", 1.5)]))
    yield core(event("journey.QUEUED", [*many, *journey().items()]))
    # several resources and scopes in one request
    yield core(ok_j) + steps(ok_s) + api(event("api.ARRIVED", {"event.ts.monotonic": 1.5}))


def _odd_cases() -> Iterable[bytes]:
    """What the C walker hands to the Python decoder (or upb refuses)."""
    ok_j = event("journey.QUEUED", journey())
    # a singular message twice (protobuf merges them)
    yield api(extra=ld(15, vi(3, 2)) + ld(15, ld(2, "m")))
    yield request(
        scope_spans(
            "vllm.scheduler",
            span("llm_core", {"gen_ai.request.id": "r"}, [ok_j]),
            extra=ld(1, ld(2, "v1")),
        )
    )
    yield request(
        scope_spans("vllm.scheduler", span("llm_core", {"gen_ai.request.id": "r"}, [ok_j])),
        extra=ld(1, attrs(1, {"b": 1})),
    )
    # a known field with another wire type; a group; a name that is not UTF-8
    yield core(ok_j, extra=vi(5, 3))
    yield core(event("journey.QUEUED", journey(), extra=vi(2, 1)))
    yield core(ok_j, extra=varint(90 << 3 | 3) + vi(1, 1) + varint(90 << 3 | 4))
    yield core(event("journey.QUEUED", {**journey(), "phase": b"\x0a\x02\xff\xfe"}))
    yield steps(event("step.BATCH_SUMMARY", summary(step=vi(7, 1))))


CASES = [*_summary_cases(), *_journey_cases(), *_api_cases(), *_structure_cases()]
ODD = list(_odd_cases())


def outcome(native_: bool, data: bytes, setup: Callable[[Decoder], None] = lambda d: None) -> Any:
    dec = Decoder(native=native_)
    setup(dec)
    try:
        r = dec.decode_bytes(data)
    except DecodeError:
        return "DecodeError", dec
    got = (r.records, r.rejected, list(r.reasons.items()), r.ignored, r.rejected_spans)
    return (*got, r.dropped_upstream, r.sampled_out), dec


def assert_same(
    cases: Iterable[bytes], setup: Callable[[Decoder], None] = lambda d: None
) -> tuple[int, int]:
    """Both decoders agree on every case. Returns how many cases upb accepted and how
    many of those the C walker decoded itself (not handing them to Python)."""
    accepted = walked = 0
    for i, data in enumerate(cases):
        py, _ = outcome(False, data, setup)
        c, dec = outcome(True, data, setup)
        assert c == py, f"case {i}: {data.hex()}"
        accepted += py != "DecodeError"
        walked += py != "DecodeError" and not dec.handed_back
    return accepted, walked


def test_same_records_and_reasons_on_good_and_bad_input() -> None:
    accepted, walked = assert_same(CASES)
    assert walked == accepted > 0.9 * len(CASES)  # the C walker's own work, not its fallback
    accepted, walked = assert_same(ODD)
    assert walked == 0 and accepted > 0.5 * len(ODD)


def test_same_under_shedding_and_engine_sampling() -> None:
    shed = [steps(*(event("step.BATCH_SUMMARY", summary(step=n, **over)) for n in range(1, 9)))
            for over in ({}, {"batch__num_finished": None}, {"kv__usage_gpu_ratio": 1.5},
                         {"queue__waiting_depth": "x"}, {"step__id": 4.0})]  # fmt: skip
    shed.append(steps(event("step.BATCH_SUMMARY", summary(step=1 << 49))))

    def keep_odd(d: Decoder) -> None:
        d.step_filter = lambda n: n % 2 == 1

    assert assert_same(shed, keep_odd) == (len(shed), len(shed))
    both = [core(event("journey.QUEUED", journey())) + api(), core() + steps()]

    def sample(d: Decoder) -> None:
        d.source_filter = lambda s: s.get("service.name") != "t"

    assert assert_same(both, sample) == (len(both), len(both))


def test_same_on_vllm_shaped_requests() -> None:
    rng = random.Random(7)
    reqs = [build_step_request(rng), build_core_request(rng), build_api_request(rng)]
    example = Path(__file__).parents[1] / "data" / "vllm-example-traces.jsonl"
    reqs += [parse_json_request(line) for line in example.read_bytes().splitlines()]
    data = [r.SerializeToString() for r in reqs]
    assert assert_same(data) == (len(data), len(data))
    dec = Decoder(native=True)
    assert dec.decode(reqs[-1]).records == Decoder(native=False).decode(reqs[-1]).records


def test_truncated_and_mutated_bytes() -> None:
    rng = random.Random(34)
    seed = core(event("journey.QUEUED", journey())) + steps(event("step.BATCH_SUMMARY", summary()))
    cases = [seed[:n] for n in range(0, len(seed), 7)]
    for _ in range(300):
        b = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    assert_same(cases)


def test_the_walker_never_crashes_on_unchecked_bytes() -> None:
    """Bytes upb would refuse, given to the C walker directly (the receivers never do):
    it returns a result or None, and nothing else happens."""
    rng = random.Random(3)
    seed = core(event("journey.QUEUED", journey())) + steps(event("step.BATCH_SUMMARY", summary()))
    source = Decoder().source(Resource())
    results = set()
    for i in range(2000):
        b = bytearray(seed[: rng.randrange(len(seed) + 1)] if i % 3 == 0 else seed)
        for _ in range(rng.randint(1, 6)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        got = native.wire.decode(bytes(b), native.PLAN, lambda raw: source, None, None, {})
        results.add(type(got))
    assert results <= {tuple, type(None)} and tuple in results
