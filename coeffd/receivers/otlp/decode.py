"""OTLP ``ExportTraceServiceRequest`` → event records (spec ``vllm-telemetry.md`` §2).

The decoder is the receivers' hot path: every span and event of every vLLM process
passes through it, and protobuf accessors cost ~100–200 ns each (one Python wrapper per
access), so the number of accessor calls per attribute is what the code minimises:

* requests are parsed into :data:`~receivers.otlp.fastproto.FastExportRequest`, a
  wire-compatible twin whose ``attributes`` are protobuf maps, so each needed attribute
  is one C lookup and unneeded ones cost nothing;
* each span/event kind (:mod:`.kinds`) has a generated straight-line parser
  (:func:`.attrs.compile_parser`) that reads exactly its keys, type-checks on the fast
  path with one accessor call, and builds the record positionally;
* a span's :class:`SpanInfo` and the resource's :class:`Source` are built once and
  shared by all records of that span / resource.

That is as far as Python goes: two accessor calls per attribute still cost ~5× a
parse-only upb pass over the same bytes. So when it is built, the compiled decoder
(:mod:`.native`, ``_wire.c``) walks the wire bytes instead and builds the same records
from the same kind tables; this module's Python path is its fallback and reference
(``Decoder(native=False)``). ``python -m bench ingest`` measures it against upb
parse-only and a ``MessageToDict`` baseline.

Bad input never raises out of this module: a span or event with a missing or mistyped
required attribute, a non-finite number, or an absurd value (negative count, an integer
beyond :data:`.attrs.MAX_COUNT`) is *rejected* with a reason and skipped; spans, events and
scopes we do not know are *ignored* (counted only); the rest of the request is still
decoded. OTLP/JSON bodies are parsed into requests by :mod:`.jsonbody` first.

>>> from coeffd.receivers.otlp.decode import decode_json
>>> res = decode_json(b'{"resourceSpans": []}')
>>> (res.records, res.rejected, res.ignored)
([], 0, 0)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from coeffd.receivers.otlp import native as _native
from coeffd.receivers.otlp.attrs import MAX_NS, Reject
from coeffd.receivers.otlp.fastproto import FastExportRequest, WireRequest, to_fast
from coeffd.receivers.otlp.jsonbody import parse_json_request
from coeffd.receivers.otlp.kinds import SCOPE_STEP, SCOPES, EventParser, shedding_summary_parser
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import (
    AttrValue,
    Record,
    Source,
    SpanInfo,
)

__all__ = [
    "DecodeResult",
    "Decoder",
    "count_kinds",
    "decode_json",
    "decode_request",
    "record_kind",
    "source_for_resource",
]


@dataclass(slots=True)
class DecodeResult:
    """What one request decoded to.

    ``records`` are in request order, each span's record followed by its events'.
    ``rejected`` counts bad spans and events (a rejected span also rejects its events,
    reason ``parent_rejected``); ``reasons`` counts them by reason label
    (``missing:<key>``, ``type:<key>``, ``nonfinite:<key>``, ``range:<key>``, …).
    ``ignored`` counts well-formed things we do not use (unknown scopes, spans, events).
    ``rejected_spans`` is the number of spans with at least one rejected part, which is
    what OTLP's ``partial_success.rejected_spans`` reports.
    """

    records: list[Record] = field(default_factory=list)
    rejected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    ignored: int = 0
    rejected_spans: int = 0
    #: Sum of the spans' ``dropped_events_count``: events the exporting SDK evicted
    #: (more than 128 per span, spec §1.6). Not our loss, but worth an alert.
    dropped_upstream: int = 0
    #: Spans and events of sources the ``source_filter`` skipped (engine sampling).
    sampled_out: int = 0

    def merge(self, other: DecodeResult) -> None:
        """Add ``other`` into this result (used by replay to sum up a file)."""
        self.records.extend(other.records)
        self.rejected += other.rejected
        self.reasons.update(other.reasons)
        self.ignored += other.ignored
        self.rejected_spans += other.rejected_spans
        self.dropped_upstream += other.dropped_upstream
        self.sampled_out += other.sampled_out

    def error_message(self) -> str:
        """A short human summary of the rejections, for OTLP ``error_message``."""
        if not self.rejected:
            return ""
        top = ", ".join(f"{r}={n}" for r, n in self.reasons.most_common(5))
        return f"rejected {self.rejected} spans/events: {top}"


def record_kind(record: Any) -> str:
    """The ``kind`` label of a record: its class name, or ``<class>.<KIND>`` for events
    that have a kind (API and journey events).

    >>> from pathlib import Path
    >>> example = Path(__file__).parents[3] / "tests" / "data" / "vllm-example-traces.jsonl"
    >>> recs = decode_json(example.read_bytes().splitlines()[0]).records
    >>> [record_kind(r) for r in recs[:2]]
    ['CoreSpan', 'JourneyEvent.QUEUED']
    """
    kind = getattr(record, "kind", None)
    name = type(record).__name__
    if kind is None:
        return name
    return f"{name}.{getattr(kind, 'value', kind)}"


def _kind_key(record: Any, getattr: Callable[..., Any] = getattr) -> Any:
    kind = getattr(record, "kind", None)
    return record.__class__ if kind is None else (record.__class__, kind)


def count_kinds(records: Iterable[Any]) -> Counter[str]:
    """Records per :func:`record_kind` label, ~4× faster than calling it per record.

    Counting runs once per accepted batch (metrics), so it is on the ingest hot path:
    the counting itself happens in C (``Counter`` over ``map``) on cheap keys, and labels
    are formatted once per distinct key.

    >>> from pathlib import Path
    >>> example = Path(__file__).parents[3] / "tests" / "data" / "vllm-example-traces.jsonl"
    >>> recs = decode_json(example.read_bytes().splitlines()[0]).records
    >>> count_kinds(recs)["RequestSnapshot"], count_kinds(recs)["JourneyEvent.FINISHED"]
    (2, 1)
    """
    out: Counter[str] = Counter()
    for key, n in Counter(map(_kind_key, records)).items():
        if isinstance(key, tuple):
            cls, kind = key
            out[f"{cls.__name__}.{getattr(kind, 'value', kind)}"] += n
        else:
            out[key.__name__] += n
    return out


# ----------------------------------------------------------------------- resources


def _any_to_python(v: AnyValue) -> AttrValue:
    """Convert a resource AnyValue to a scalar; arrays/maps become compact JSON text."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "bytes_value":
        return v.bytes_value.hex()
    if which is None:
        return ""
    return json.dumps(json_format.MessageToDict(v), sort_keys=True, separators=(",", ":"))


def source_for_resource(resource: Resource) -> Source:
    """Build the :class:`Source` of a resource (:func:`receivers.source.source_from_attributes`:
    the id every receiver gives these attributes)."""
    return source_from_attributes((kv.key, _any_to_python(kv.value)) for kv in resource.attributes)


class Decoder:
    """Decodes requests; caches one :class:`Source` per distinct resource.

    One long-lived instance per receiver. The cache key is the resource's serialized
    bytes (cheap: a handful of attributes, serialized in C); the cache is bounded in
    entries and in bytes and simply cleared when full, since resources are few (one per
    exporting process). The receivers refuse resources over
    ``receivers.limits.max_resource_bytes`` before they get here.
    Thread safety: concurrent ``decode`` calls may both compute the same Source; the
    result is identical, so the race is harmless.
    """

    def __init__(
        self,
        max_sources: int = 4096,
        max_source_bytes: int = 16 << 20,
        *,
        source_filter: Callable[[Source], bool] | None = None,
        native: bool | None = None,
    ) -> None:
        if native and not _native.AVAILABLE:
            raise RuntimeError(_native.UNAVAILABLE)
        #: Whether the compiled decoder decodes (``native``: None = when available).
        self.native = _native.AVAILABLE if native is None else native
        self._sources: dict[bytes, Source] = {}
        # The compiled path's Sources, keyed by the resource's wire bytes (no re-encoding)
        self._wire_sources: dict[bytes, Source] = {}
        self._wire_source_bytes = 0
        #: Requests the compiled decoder handed to the Python one (see ``_wire.c``).
        self.handed_back = 0
        self._max_sources = max_sources
        # Bounded by bytes too: sources come from the network, and 4096 resources of
        # 1 MB each held 4 GB (a Source holds about what its key does).
        self._max_source_bytes = max_source_bytes
        self._source_bytes = 0
        self._step_filter: Callable[[int], bool] | None = None
        self._scopes = SCOPES
        #: Engine sampling: the spans of sources for which this is False are counted in
        #: ``sampled_out`` and not decoded. The daemon hands its engine sampler's ``keep``
        #: here (see ``daemon.load``); ``None`` decodes every source.
        self.source_filter = source_filter

    @property
    def step_filter(self) -> Callable[[int], bool] | None:
        """Load shedding: step ids for which this is False are decoded partially (see
        ``BatchSummary.partial``), since the joiner will not build their observations.
        Set by the learning consumer while it sheds; ``None`` decodes everything."""
        return self._step_filter

    @step_filter.setter
    def step_filter(self, keep: Callable[[int], bool] | None) -> None:
        if keep is self._step_filter:
            return
        scopes = SCOPES
        if keep is not None:
            accepts, span_parser, events = SCOPES[SCOPE_STEP]
            events = {**events, "step.BATCH_SUMMARY": shedding_summary_parser(keep)}
            scopes = {**SCOPES, SCOPE_STEP: (accepts, span_parser, events)}
        # decode reads only _scopes, replaced whole: a decode on another thread sees one table
        self._scopes, self._step_filter = scopes, keep

    def source(self, resource: Resource) -> Source:
        """Return the cached Source of ``resource``."""
        key = resource.SerializeToString(deterministic=True)
        src = self._sources.get(key)
        if src is None:
            if (
                len(self._sources) >= self._max_sources
                or self._source_bytes + len(key) > self._max_source_bytes
            ):
                self._sources.clear()
                self._source_bytes = 0
            src = self._sources[key] = source_for_resource(resource)
            self._source_bytes += len(key)
        return src

    def _wire_source(self, raw: bytes) -> Source:
        """The Source of a resource's wire bytes (the compiled decoder's callback)."""
        src = self._wire_sources.get(raw)
        if src is None:
            if (
                len(self._wire_sources) >= self._max_sources
                or self._wire_source_bytes + len(raw) > self._max_source_bytes
            ):
                self._wire_sources.clear()
                self._wire_source_bytes = 0
            src = self._wire_sources[raw] = self.source(Resource.FromString(raw))
            self._wire_source_bytes += len(raw)
        return src

    def decode_bytes(self, data: bytes) -> DecodeResult:
        """Decode a binary ``ExportTraceServiceRequest``; raises protobuf ``DecodeError``."""
        if self.native:
            ExportTraceServiceRequest.FromString(data)  # upb says what is malformed
            return self._decode_wire(data)
        return self._decode_py(FastExportRequest.FromString(data))

    def decode(self, req: Any) -> DecodeResult:
        """Decode one request (see the module docstring for the rules).

        ``req`` is what :func:`~receivers.otlp.fastproto.parse_request` returned for the
        receivers, or a standard ``ExportTraceServiceRequest``, or its map-attributes twin
        :data:`~receivers.otlp.fastproto.FastExportRequest`.
        """
        if isinstance(req, WireRequest):
            if self.native:
                return self._decode_wire(req.data)
            return self._decode_py(FastExportRequest.FromString(req.data))
        if self.native:
            return self._decode_wire(req.SerializeToString())
        return self._decode_py(req)

    def _decode_wire(self, data: bytes) -> DecodeResult:
        """The compiled decoder, on bytes upb accepts; what it hands back goes to Python."""
        res = DecodeResult()
        out = _native.wire.decode(
            data, _native.PLAN, self._wire_source, self.source_filter, self._step_filter,
            res.reasons,
        )  # fmt: skip
        if out is None:
            self.handed_back += 1
            return self._decode_py(FastExportRequest.FromString(data))
        (res.records, res.rejected, res.ignored, res.rejected_spans, res.dropped_upstream,
         res.sampled_out) = out  # fmt: skip
        return res

    def _decode_py(self, req: Any) -> DecodeResult:
        """The pure-Python decoder (the compiled one's fallback and reference)."""
        if not isinstance(req, FastExportRequest):
            req = to_fast(req)
        res = DecodeResult()
        out = res.records
        scopes = self._scopes
        sample = self.source_filter
        for rs in req.resource_spans:
            source = self.source(rs.resource)
            if sample is not None and not sample(source):
                res.sampled_out += sum(
                    1 + len(span.events) for ss in rs.scope_spans for span in ss.spans
                )
                continue
            for ss in rs.scope_spans:
                scope = ss.scope.name
                handler = scopes.get(scope)
                if handler is None:
                    for span in ss.spans:
                        res.ignored += 1 + len(span.events)
                    continue
                accepts, span_parser, event_parsers = handler
                for span in ss.spans:
                    if not accepts(span.name):
                        res.ignored += 1 + len(span.events)
                        continue
                    try:
                        info = _span_info(span, scope, source)
                        out.append(span_parser(span, info))
                        if info.dropped_events:
                            res.dropped_upstream += info.dropped_events
                    except Reject as e:
                        _reject_span(res, span, e.args[0])
                        continue
                    _decode_events(span, info, event_parsers, out, res)
        return res


def _decode_events(
    span: Any,
    info: SpanInfo,
    parsers: Mapping[str, EventParser],
    out: list[Record],
    res: DecodeResult,
) -> None:
    """Append one record per known event of ``span``; reject bad ones individually."""
    flagged = False  # whether this span already counts in res.rejected_spans
    for ev in span.events:
        parse = parsers.get(ev.name)
        if parse is None:
            res.ignored += 1
            continue
        try:
            wall = ev.time_unix_nano
            if wall <= 0 or wall > MAX_NS:
                raise Reject("range:timeUnixNano")
            out.append(parse(ev, info, wall))
        except Reject as e:
            res.rejected += 1
            res.reasons[e.args[0]] += 1
            if not flagged:
                res.rejected_spans += 1
                flagged = True


def _span_info(span: Any, scope: str, source: Source) -> SpanInfo:
    trace_id = span.trace_id
    span_id = span.span_id
    parent = span.parent_span_id
    # Joins key on these ids (spec §2.6, §7.3), so malformed ids are rejected, not guessed.
    if len(trace_id) != 16 or len(span_id) != 8 or len(parent) not in (0, 8):
        raise Reject("ids")
    start = span.start_time_unix_nano
    end = span.end_time_unix_nano
    if start <= 0 or end <= 0 or start > MAX_NS or end > MAX_NS:
        raise Reject("range:span_time")
    return SpanInfo(
        trace_id,
        span_id,
        parent,
        span.name,
        scope,
        source,
        start,
        end,
        span.dropped_events_count,
    )


def _reject_span(res: DecodeResult, span: Any, reason: str) -> None:
    n_events = len(span.events)
    res.rejected += 1 + n_events
    res.reasons[reason] += 1
    if n_events:
        res.reasons["parent_rejected"] += n_events
    res.rejected_spans += 1


def decode_request(req: Any, decoder: Decoder | None = None) -> DecodeResult:
    """Decode one ``ExportTraceServiceRequest`` into records (spans first, then events).

    Pass a long-lived :class:`Decoder` to reuse its Source cache across requests.
    """
    return (decoder or Decoder()).decode(req)


# ------------------------------------------------------------------------ OTLP/JSON


def decode_json(
    data: bytes | str | Mapping[str, Any], decoder: Decoder | None = None
) -> DecodeResult:
    """OTLP/JSON → records: :func:`parse_json_request` then the protobuf decoder."""
    return decode_request(parse_json_request(data), decoder)
