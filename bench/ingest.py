"""``python -m bench ingest``: OTLP decode throughput on one core, vs upb and a naive baseline.

Workloads (vLLM-shaped, see ``vllm-telemetry.md``): an EngineCore export request with a
``scheduler_steps`` span carrying 100 ``step.BATCH_SUMMARY`` events; one with 100
``llm_core`` spans of 5 journey events each (QUEUED, SCHEDULED, PREEMPTED, SCHEDULED,
FINISHED... realistic values, all distinct); and vLLM's default sampling (journeys 1.0,
summaries 0.01): an API export of 100 ``llm_request`` spans with their 4 api events and an
EngineCore export of 100 ``llm_core`` spans with 4 journey events and 6 step summaries.

Measured in the same run on the same wire bytes, on CPU time of this process (so other
load on the machine matters less), best of ``--repeats``:

* **parse-only**: ``ExportTraceServiceRequest.FromString`` (upb), nothing read: the floor;
* **coeffd**: ``Decoder.decode_bytes``: wire bytes → records (what the receivers do),
  with the compiled decoder when it is built;
* **pure Python**: ``Decoder(native=False)``, the fallback (and the decoder before C);
* **MessageToDict**: ``FromString`` → ``json_format.MessageToDict`` → walk the dicts in
  Python → the same records.

Targets (issue 34), on every workload: coeffd ≥ 25 % of the parse-only rate and ≥ 25×
the ``MessageToDict`` baseline; the command exits 1 when one is missed.
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
from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    Record,
    RequestSpan,
    Source,
    SpanInfo,
    SpanRecord,
    StepSpan,
)

__all__ = [
    "baseline_decode",
    "build_api_request",
    "build_core_request",
    "build_step_request",
    "main",
]

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
#: A request's journey without preemption (spec §1.6: 4 events per ``llm_core``).
_JOURNEY_DEFAULT = ("QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED")


def build_core_request(
    rng: random.Random, n_spans: int = 100, events: tuple[str, ...] = _JOURNEY
) -> ExportTraceServiceRequest:
    """``n_spans`` ``llm_core`` spans with the journey ``events`` each."""
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
        for j, kind in enumerate(events):
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


_API = ("ARRIVED", "HANDOFF_TO_CORE", "FIRST_RESPONSE_FROM_CORE", "DEPARTED")


def build_api_request(rng: random.Random, n_spans: int = 100) -> ExportTraceServiceRequest:
    """``n_spans`` ``llm_request`` spans (scope ``vllm.api``) with their 4 api events."""
    spans = []
    for i in range(n_spans):
        mono = M0 + rng.randint(0, 10**12)
        span = Span(
            trace_id=rng.randbytes(16),
            span_id=rng.randbytes(8),
            name="llm_request",
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=T0 + (mono - M0),
            end_time_unix_nano=T0 + (mono - M0) + 10**9,
            flags=256,
        )
        prompt = rng.randint(16, 4096)
        for k, v in (
            ("gen_ai.request.id", f"chatcmpl-{rng.getrandbits(64):016x}-{i:08x}"),
            ("http.route", "/v1/chat/completions"),
            ("gen_ai.response.model", "meta-llama/Llama-3.1-8B-Instruct"),
            ("gen_ai.usage.prompt_tokens", prompt),
            ("gen_ai.usage.completion_tokens", rng.randint(1, 512)),
            ("gen_ai.request.max_tokens", 512),
            ("gen_ai.request.n", 1),
            ("gen_ai.request.temperature", 0.7),
            ("gen_ai.request.top_p", 0.95),
        ):
            _kv(span, k, v)
        for kind in _API:
            ev = span.events.add()
            ev.name = "api." + kind
            mono += rng.randint(10_000, 50_000_000)
            ev.time_unix_nano = T0 + (mono - M0) + 211
            _kv(ev, "event.ts.monotonic", mono / 1e9)
        spans.append(span)
    req = _request("vllm.api", spans)
    req.resource_spans[0].resource.attributes[3].value.string_value = "vllm-bench-api"
    return req


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
                elif sp["name"] == "llm_request":
                    out.append(
                        RequestSpan(
                            info, a["gen_ai.request.id"], a.get("http.route"),
                            a.get("gen_ai.response.model"), a.get("gen_ai.usage.prompt_tokens"),
                            a.get("gen_ai.usage.completion_tokens"), a.get("gen_ai.request.max_tokens"),
                            a.get("gen_ai.request.n"), a.get("gen_ai.request.temperature"),
                            a.get("gen_ai.request.top_p"),
                        )
                    )  # fmt: skip
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
                    elif name.startswith("api."):
                        mono = round(float(e["event.ts.monotonic"]) * 1e9)
                        out.append(ApiEvent(info, ApiKind(name[4:]), wall, mono))
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


def _workloads(rng: random.Random) -> dict[str, list[bytes]]:
    """Export requests per workload, as their wire bytes (one list is decoded per call)."""
    summaries = build_step_request(rng).SerializeToString()
    journeys = build_core_request(rng).SerializeToString()
    # vLLM's defaults (journeys 1.0, summaries 0.01): the API exporter's llm_request
    # spans and the EngineCore's llm_core spans with a scheduler_steps span of the few
    # steps sampled meanwhile (100 requests of ~200 tokens at batch ~32: ~600 steps).
    api = build_api_request(rng).SerializeToString()
    core = build_core_request(rng, events=_JOURNEY_DEFAULT)
    steps = build_step_request(rng, n_steps=6)
    core.resource_spans[0].scope_spans.extend(steps.resource_spans[0].scope_spans)
    return {
        "scheduler_steps (100 BATCH_SUMMARY)": [summaries],
        "llm_core x100 (5 journey events)": [journeys],
        "default sampling (API + EngineCore)": [api, core.SerializeToString()],
    }


def _check_same(decoder: Decoder, bodies: list[bytes]) -> int:
    """Events in ``bodies``, after checking that the baseline builds the same records."""
    n = 0
    for data in bodies:
        res = decoder.decode_bytes(data)
        assert res.rejected == 0 and res.ignored == 0, res.reasons
        base = baseline_decode(data)
        # Same output, so the comparison is fair (ids are not carried by the baseline).
        assert [type(r) for r in res.records] == [type(r) for r in base]
        assert all(
            getattr(a, "step", None) == getattr(b, "step", None)
            for a, b in zip(res.records, base, strict=True)
        )
        n += sum(1 for r in res.records if not isinstance(r, SpanRecord))
    return n


def _rates(decoder: Decoder, bodies: list[bytes], n: int, sec: float, rep: int) -> list[float]:
    """Events per CPU second: upb parse-only, coeffd, coeffd's pure-Python decoder (the
    compiled one's fallback), the ``MessageToDict`` baseline."""
    parse = ExportTraceServiceRequest.FromString
    decode = decoder.decode_bytes
    decode_py = Decoder(native=False).decode_bytes

    def parse_only() -> int:
        for data in bodies:
            parse(data)
        return n

    def ours() -> int:
        for data in bodies:
            decode(data)
        return n

    def pure() -> int:
        for data in bodies:
            decode_py(data)
        return n

    def base() -> int:
        for data in bodies:
            baseline_decode(data)
        return n

    return [_cpu_rate(fn, sec, rep) for fn in (parse_only, ours, pure, base)]


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    """``seed`` truncated, with bytes replaced, inserted or spliced from elsewhere in it."""
    b = bytearray(seed[: rng.randrange(len(seed) + 1)] if rng.random() < 0.2 else seed)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
        i = rng.randrange(len(b) + 1)
        op = rng.random()
        if op < 0.5 and i < len(b):
            b[i] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op < 0.75:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:
            j = rng.randrange(len(seed))
            b[i:i] = seed[j : j + rng.randint(1, 64)]
    return bytes(b)


def fuzz(seconds: float, seed: int = 0) -> int:
    """Mutated vLLM-shaped requests: the compiled and the pure-Python decoders agree on
    every body upb accepts (records, counts, reasons, or both DecodeError), and the C
    walker, given every body unchecked, returns (never crashes). Exit 1 on a mismatch."""
    from google.protobuf.message import DecodeError

    from coeffd.receivers.otlp import native

    if not native.AVAILABLE:
        print(f"fuzz: {native.UNAVAILABLE}")
        return 1
    rng = random.Random(seed)
    seeds = [
        build_step_request(rng, 3).SerializeToString(),
        build_core_request(rng, 2).SerializeToString(),
        build_api_request(rng, 2).SerializeToString(),
    ]
    source = Decoder().source(ExportTraceServiceRequest().resource_spans.add().resource)
    n = accepted = handed_back = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        data = _mutate(rng, rng.choice(seeds))
        native.wire.decode(data, native.PLAN, lambda raw: source, None, None, {})
        outs: list[Any] = []
        for flag in (True, False):
            dec = Decoder(native=flag)
            dec.step_filter = (lambda s: s % 2 == 0) if n % 2 else None
            try:
                r = dec.decode_bytes(data)
                outs.append((r.records, r.rejected, list(r.reasons.items()), r.ignored,
                             r.rejected_spans, r.dropped_upstream))  # fmt: skip
            except DecodeError:
                outs.append(None)
            handed_back += dec.handed_back
        if outs[0] != outs[1]:
            print(f"fuzz: MISMATCH on {data.hex()}")
            return 1
        n += 1
        accepted += outs[0] is not None
    print(f"fuzz: {n:,} bodies, {accepted:,} accepted by upb ({handed_back:,} handed back "
          "to Python): both decoders agreed on all, the walker returned on all")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print events/s and ratios; non-zero when a target is missed."""
    p = argparse.ArgumentParser(prog="python -m bench ingest", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per measurement")
    p.add_argument("--repeats", type=int, default=3, help="best of N measurements")
    p.add_argument("--fuzz", type=float, metavar="SECONDS", help="fuzz the decoders instead")
    args = p.parse_args(argv)
    if args.fuzz:
        return fuzz(args.fuzz)

    decoder = Decoder()
    print(f"decoder: {'compiled extension' if decoder.native else 'pure Python'}")
    head = ("parse-only", "coeffd", "pure Python", "MessageToDict", "of parse", "x MTD")
    print(f"{'workload (events/s per CPU s)':37s}" + "".join(f"{h:>14s}" for h in head))
    seconds = [0.0] * 4  # per event, summed over workloads of equal weight
    ok = True
    for name, bodies in _workloads(random.Random(42)).items():
        n = _check_same(decoder, bodies)
        rates = _rates(decoder, bodies, n, args.seconds, args.repeats)
        seconds = [s + 1 / r for s, r in zip(seconds, rates, strict=True)]
        ok &= _row(name, *rates)
    k = len(_workloads(random.Random(42)))
    ok &= _row("all (equal event counts)", *(k / s for s in seconds))
    print(
        f"targets: >= {_OF_PARSE:.0%} of the upb parse-only rate, >= {_OF_MTD:.0f}x "
        f"MessageToDict, on every row: {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


#: Issue 34's targets: coeffd's decode against a parse-only upb pass and MessageToDict.
_OF_PARSE = 0.25
_OF_MTD = 25.0


def _row(name: str, parse: float, ours: float, pure: float, base: float) -> bool:
    ok = ours >= _OF_PARSE * parse and ours >= _OF_MTD * base
    print(
        f"{name:37s}{parse:14,.0f}{ours:14,.0f}{pure:14,.0f}{base:14,.0f}{ours / parse:14.1%}"
        f"{ours / base:13.1f}x{'' if ok else '  MISSED'}"
    )
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
