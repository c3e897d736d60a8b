"""vLLM's span telemetry through the real OpenTelemetry SDK, stamped with simulated clocks.

Per engine there are two "processes", each with its own ``TracerProvider`` (spec §0):
the API server (``llm_request`` under scope ``vllm.api``) and the EngineCore (``llm_core``
under ``vllm.scheduler``, ``scheduler_steps_<seq>`` under ``vllm.scheduler.step``). All
start/end/event times are passed explicitly from the simulated clocks (wall = mono +
per-host offset), so the SDK never reads the machine clock.

Export paths:

* ``SimBatchProcessor`` — the BatchSpanProcessor's policy (export at 512 queued spans or
  every 5 s) evaluated on *simulated* time, hence deterministic: used for files and
  in-memory sinks. A span reaches it only when it ends, exactly like vLLM's exports.
* the SDK's own ``BatchSpanProcessor`` + OTLP gRPC/HTTP exporter for live endpoints.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import orjson
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind

SDK_VERSION = "1.26.0"  # what the fork's image pins (spec §1.4); the resource says so


class SeededIdGenerator(IdGenerator):
    """Deterministic trace/span ids: same seed ⇒ same ids ⇒ byte-identical files."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True


# ------------------------------------------------------------------ OTLP/JSON rendering


def _any(v: AnyValue) -> dict[str, Any]:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": v.string_value}
    if kind == "int_value":
        return {"intValue": str(v.int_value)}
    if kind == "double_value":
        return {"doubleValue": v.double_value}
    if kind == "bool_value":
        return {"boolValue": v.bool_value}
    if kind == "array_value":
        return {"arrayValue": {"values": [_any(x) for x in v.array_value.values]}}
    return {}


def _attrs(kvs: Sequence[KeyValue]) -> list[dict[str, Any]]:
    return [{"key": kv.key, "value": _any(kv.value)} for kv in kvs]


def _span_json(
    ids: tuple[str, str, str | None],
    name: str,
    kind: int,
    times: tuple[int, int],
    attrs: list[dict[str, Any]],
    events: list[tuple[int, str, list[dict[str, Any]]]],
    dropped_events: int,
    status: tuple[int, str],
    flags: int,
) -> dict[str, Any]:
    """One span in OTLP/JSON, keys in the order the Collector writes them."""
    d: dict[str, Any] = {"traceId": ids[0], "spanId": ids[1]}
    if ids[2]:
        d["parentSpanId"] = ids[2]
    d["name"] = name
    d["kind"] = kind
    d["startTimeUnixNano"] = str(times[0])
    d["endTimeUnixNano"] = str(times[1])
    if attrs:
        d["attributes"] = attrs
    if events:
        d["events"] = [{"timeUnixNano": str(t), "name": n, "attributes": a} for t, n, a in events]
    if dropped_events:
        d["droppedEventsCount"] = dropped_events
    st: dict[str, Any] = {}
    if status[0]:
        st["code"] = status[0]
    if status[1]:
        st["message"] = status[1]
    d["status"] = st
    if flags:
        d["flags"] = flags
    return d


def request_to_json(req: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON of one request as the Collector file exporter writes it (spec §6).

    Hex trace/span ids, int64 as decimal strings, integer enums, defaults omitted,
    ``"status": {}`` kept (as the Collector does).
    """
    rs_out = []
    for rs in req.resource_spans:
        ss_out = []
        for ss in rs.scope_spans:
            spans = []
            for sp in ss.spans:
                d = _span_json(
                    (sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex() or None),
                    sp.name,
                    int(sp.kind),
                    (sp.start_time_unix_nano, sp.end_time_unix_nano),
                    _attrs(sp.attributes),
                    [(ev.time_unix_nano, ev.name, _attrs(ev.attributes)) for ev in sp.events],
                    sp.dropped_events_count,
                    (int(sp.status.code), sp.status.message),
                    sp.flags,
                )
                spans.append(d)
            scope: dict[str, Any] = {"name": ss.scope.name}
            if ss.scope.version:
                scope["version"] = ss.scope.version
            ss_out.append({"scope": scope, "spans": spans})
        rs_out.append(
            {"resource": {"attributes": _attrs(rs.resource.attributes)}, "scopeSpans": ss_out}
        )
    return orjson.dumps({"resourceSpans": rs_out})


def _value(v: Any) -> dict[str, Any]:
    # bool before int: bool is an int subclass (the SDK encoder checks it first too)
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"arrayValue": {"values": [_value(x) for x in v]}}


def _attrs_direct(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (attrs or {}).items()]


def spans_to_json(spans: Sequence[ReadableSpan]) -> bytes:
    """``request_to_json(encode_spans(spans))`` without building the protobuf (~2× faster).

    Same grouping (resource, then scope in first-appearance order), same field rules
    (flags 0x100 | 0x200 for a remote parent, ``status`` kept, zero counts omitted); the
    equality is asserted by the tests.
    """
    groups: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
    for sp in spans:
        ctx = sp.get_span_context()
        assert ctx is not None
        parent = sp.parent
        d = _span_json(
            (
                f"{ctx.trace_id:032x}",
                f"{ctx.span_id:016x}",
                f"{parent.span_id:016x}" if parent is not None else None,
            ),
            sp.name,
            sp.kind.value + 1,  # OTLP enum: SDK INTERNAL=0 ↦ 1, SERVER=1 ↦ 2, …
            (sp.start_time or 0, sp.end_time or 0),
            _attrs_direct(sp.attributes),
            [(ev.timestamp, ev.name, _attrs_direct(ev.attributes)) for ev in sp.events],
            sp.dropped_events,
            (sp.status.status_code.value, sp.status.description or ""),
            0x300 if parent is not None and parent.is_remote else 0x100,
        )
        scope = sp.instrumentation_scope
        groups.setdefault(sp.resource, {}).setdefault(scope, []).append(d)
    rs_out = []
    for resource, scopes in groups.items():
        ss_out = []
        for scope, out in scopes.items():
            sd: dict[str, Any] = {"name": scope.name if scope is not None else ""}
            if scope is not None and scope.version:
                sd["version"] = scope.version
            ss_out.append({"scope": sd, "spans": out})
        rs_out.append(
            {"resource": {"attributes": _attrs_direct(resource.attributes)}, "scopeSpans": ss_out}
        )
    return orjson.dumps({"resourceSpans": rs_out})


class JsonLinesSink:
    """Writes one ``ExportTraceServiceRequest`` per line (Collector file-exporter format).

    Called with the spans of one export (``export_spans``, the fast path) or with an
    encoded request (``__call__``).
    """

    def __init__(self, fh: IO[bytes], fast: bool = True) -> None:
        self._fh = fh
        self.fast = fast  # False: go through the SDK's protobuf encoder (reference path)

    def __call__(self, req: ExportTraceServiceRequest) -> None:
        self._fh.write(request_to_json(req))
        self._fh.write(b"\n")

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        self._fh.write(spans_to_json(spans))
        self._fh.write(b"\n")


class SimBatchProcessor(SpanProcessor):
    """The BatchSpanProcessor policy on simulated time (deterministic).

    Exports when ``max_batch`` spans are queued or ``schedule_delay_ns`` of simulated time
    passed since the last export; ``pump(now)`` is called by the simulation loop. Each
    export is one ``ExportTraceServiceRequest`` (one resource, one scopeSpans per scope,
    spans in end order), handed to every sink.
    """

    def __init__(
        self,
        sinks: Sequence[Callable[[ExportTraceServiceRequest], None]],
        schedule_delay_ns: int = 5_000_000_000,
        max_batch: int = 512,
    ) -> None:
        self._sinks = list(sinks)
        self._queue: list[ReadableSpan] = []
        self._delay = schedule_delay_ns
        self._max = max_batch
        self._next: int | None = None

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self._queue.append(span)

    def pump(self, now_ns: int) -> None:
        """Export what the BSP would have exported by simulated time ``now_ns``."""
        if self._next is None:
            self._next = now_ns + self._delay
        while len(self._queue) >= self._max:
            self._export(self._queue[: self._max])
            del self._queue[: self._max]
        if now_ns >= self._next:
            while self._queue:
                self._export(self._queue[: self._max])
                del self._queue[: self._max]
            self._next = now_ns + self._delay

    def _export(self, spans: Sequence[ReadableSpan]) -> None:
        req: ExportTraceServiceRequest | None = None
        for s in self._sinks:
            if isinstance(s, JsonLinesSink) and s.fast:
                s.export_spans(spans)
                continue
            if req is None:
                req = encode_spans(spans)
            s(req)

    def shutdown(self) -> None:
        self.force_flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        while self._queue:
            self._export(self._queue[: self._max])
            del self._queue[: self._max]
        return True


class MemorySpanExporter(SpanExporter):
    """Collects encoded requests (tests)."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def __call__(self, req: ExportTraceServiceRequest) -> None:
        self.requests.append(req)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.requests.append(encode_spans(spans))
        return SpanExportResult.SUCCESS


def make_provider(
    resource_attrs: Mapping[str, Any],
    seed: int,
    processors: Sequence[SpanProcessor],
    max_events: int = 128,
) -> TracerProvider:
    """A provider like vLLM's process singleton, with an identifying resource.

    ``Resource(...)`` rather than ``Resource.create`` so the environment cannot change
    the output (determinism).
    """
    attrs = dict(resource_attrs)
    prov = TracerProvider(
        sampler=ALWAYS_ON,
        resource=Resource(attrs),
        shutdown_on_exit=False,
        id_generator=SeededIdGenerator(seed),
        span_limits=SpanLimits(max_events=max_events),
    )
    for p in processors:
        prov.add_span_processor(p)
    return prov


def otlp_processor(endpoint: str, protocol: str, speed: float | None) -> SpanProcessor:
    """The SDK's BatchSpanProcessor with vLLM's exporter choice (spec §1.1–§1.3).

    Under time compression the 2048-span queue would overflow only because simulated
    time runs fast, so the queue is enlarged unless running at real time.
    """
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter: SpanExporter
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as G

        url = endpoint if "://" in endpoint else f"http://{endpoint}"
        exporter = G(endpoint=url, insecure=url.startswith("http://"))
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as H

        url = endpoint if "://" in endpoint else f"http://{endpoint}"
        if url.count("/") < 3:
            url = url + "/v1/traces"
        exporter = H(endpoint=url)
    else:
        raise ValueError(f"unknown OTLP protocol {protocol!r} (grpc|http/protobuf)")
    realtime = speed is not None and speed <= 1.0
    return BatchSpanProcessor(
        exporter,
        max_queue_size=2048 if realtime else 1 << 20,
        schedule_delay_millis=5000 if realtime else 1000,
        max_export_batch_size=512,
    )


# --------------------------------------------------------------------- span helpers


def remote_parent(span: trace_api.Span) -> Any:
    """Context whose parent is ``span`` as seen across a process boundary (flags 0x300)."""
    sc = span.get_span_context()
    remote = trace_api.SpanContext(
        sc.trace_id, sc.span_id, is_remote=True, trace_flags=sc.trace_flags
    )
    return trace_api.set_span_in_context(trace_api.NonRecordingSpan(remote))


KIND_SERVER = SpanKind.SERVER
KIND_INTERNAL = SpanKind.INTERNAL
