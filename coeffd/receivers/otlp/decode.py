"""OTLP ``ExportTraceServiceRequest`` → event records (spec ``vllm-telemetry.md`` §2).

The decoder is the receivers' hot path: every span and event of every vLLM process
passes through it, and protobuf accessors cost ~100–200 ns each (one Python wrapper per
access), so the number of accessor calls per attribute is what the code minimises:

* requests are parsed into :data:`~receivers.otlp.fastproto.FastExportRequest`, a
  wire-compatible twin whose ``attributes`` are protobuf maps, so each needed attribute
  is one C lookup and unneeded ones cost nothing;
* each span/event kind has a generated straight-line parser (:func:`_compile_parser`)
  that reads exactly its keys, type-checks on the fast path with one accessor call, and
  builds the record positionally;
* a span's :class:`SpanInfo` and the resource's :class:`Source` are built once and
  shared by all records of that span / resource.

``python -m bench ingest`` measures it against a ``MessageToDict`` baseline.

Bad input never raises out of this module: a span or event with a missing or mistyped
required attribute, a non-finite number, or an absurd value (negative count, an integer
beyond :data:`MAX_COUNT`) is *rejected* with a reason and skipped; spans, events and
scopes we do not know are *ignored* (counted only); the rest of the request is still
decoded.

>>> from coeffd.receivers.otlp.decode import decode_json
>>> res = decode_json(b'{"resourceSpans": []}')
>>> (res.records, res.rejected, res.ignored)
([], 0, 0)
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from coeffd.receivers.otlp.fastproto import FastExportRequest, to_fast
from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    AttrValue,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    Record,
    RequestSnapshot,
    RequestSpan,
    Source,
    SpanInfo,
    StepSpan,
)

__all__ = [
    "MAX_COUNT",
    "SCOPE_API",
    "SCOPE_SCHEDULER",
    "SCOPE_STEP",
    "DecodeResult",
    "Decoder",
    "JsonDecodeError",
    "count_kinds",
    "decode_json",
    "decode_request",
    "parse_json_request",
    "record_kind",
    "source_for_resource",
]

SCOPE_API = "vllm.api"
SCOPE_SCHEDULER = "vllm.scheduler"
SCOPE_STEP = "vllm.scheduler.step"

#: Largest integer accepted for counts, steps and token numbers. Real values are far
#: below (steps ~1e9 after years of uptime); anything above is corruption.
MAX_COUNT = 1 << 48
#: Largest accepted nanosecond timestamp (int64 max: what OTLP can carry).
MAX_NS = (1 << 63) - 1

_STATUS_CODE_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


class _Reject(Exception):
    """Internal: a span or event is bad; ``args[0]`` is the reason label."""


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


# --------------------------------------------------------------------- value access
# Type codes of attribute slots.
_INT = 0  # non-negative int, accepts an integral double, bounded by MAX_COUNT
_NS = 1  # non-negative int nanoseconds, bounded by MAX_NS
_FLOAT = 2  # finite float, accepts int
_STR = 3  # string
_SECONDS = 4  # finite float seconds → int nanoseconds


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


def _int_slow(v: AnyValue, key: str, required: bool, hi: int) -> int | None:
    """Integer slot whose fast read gave 0: unset, zero, an integral double, or bad."""
    which = v.WhichOneof("value")
    if which == "int_value":
        return 0
    if which is None:
        if required:
            raise _Reject("missing:" + key)
        return None
    if which == "double_value":
        d = v.double_value
        if not math.isfinite(d):
            raise _Reject("nonfinite:" + key)
        if not d.is_integer():
            raise _Reject("type:" + key)
        if d < 0 or d > hi:
            raise _Reject("range:" + key)
        return int(d)
    raise _Reject("type:" + key)


def _float_slow(v: AnyValue, key: str, required: bool) -> float | None:
    """Float slot whose fast read gave 0.0: unset, zero, an int, or a type error."""
    which = v.WhichOneof("value")
    if which == "double_value":
        return 0.0
    if which == "int_value":
        return float(v.int_value)
    if which is None:
        if required:
            raise _Reject("missing:" + key)
        return None
    raise _Reject("type:" + key)


def _str_slow(v: AnyValue, key: str, required: bool) -> str | None:
    """String slot whose fast read gave ``""``: unset, empty string, or a type error."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return ""
    if which is None:
        if required:
            raise _Reject("missing:" + key)
        return None
    raise _Reject("type:" + key)


_Field = tuple[str, int, bool]  # (attribute key, type code, required)


def _compile_parser(
    name: str,
    fields: tuple[_Field, ...],
    ctor: str,
    post: tuple[str, ...] = (),
    env: Mapping[str, Any] | None = None,
    params: str = "obj, info, wall=0",
) -> Callable[..., Record]:
    """Generate ``name(obj, info, wall=0) -> Record`` for one span or event kind
    (``params`` adds parameters that ``ctor`` may use).

    The function reads ``fields`` from ``obj.attributes`` (a protobuf map, see
    ``fastproto``) into ``x0, x1, …``, runs the ``post`` check lines, and returns
    ``ctor`` (an expression using ``info``, ``wall``, ``obj`` and ``{args}`` =
    ``x0, x1, …``). Straight-line generated code, one block per key with constants
    inlined, instead of a loop over a table: no per-attribute tuple unpacking, type
    dispatch or extra call frames, which together cost as much as the protobuf reads.

    Fast paths read the expected oneof arm directly: a non-zero/non-empty result proves
    the arm (unset arms read as their default), so ``WhichOneof`` only runs for zeros
    and empties, and the helper functions only for the rare odd cases (a double where an
    int is expected, wrong types, missing keys). Optional keys are tested with ``in``
    first because ``attrs[key]`` on a message map inserts an empty value for an absent
    key (harmless, but slower than the test).
    """
    lines = [f"def {name}({params}):", "    at = obj.attributes"]
    for i, (key, t, req) in enumerate(fields):
        k, x = repr(key), f"x{i}"
        ind = "    "
        if not req:
            lines += [f"    if {k} not in at:", f"        {x} = None", "    else:"]
            ind = "        "
        lines.append(f"{ind}v = at[{k}]")
        if t in (_INT, _NS):
            hi = "MAX_COUNT" if t == _INT else "MAX_NS"
            lines += [
                f"{ind}{x} = v.int_value",
                f"{ind}if {x}:",
                f"{ind}    if {x} < 0 or {x} > {hi}:",
                f"{ind}    " + f"    raise _Reject({'range:' + key!r})",
                f"{ind}elif v.WhichOneof('value') != 'int_value':",
                f"{ind}    {x} = _int_slow(v, {k}, {req}, {hi})",
            ]
        elif t in (_FLOAT, _SECONDS):
            lines += [
                f"{ind}{x} = v.double_value",
                f"{ind}if {x}:",
                f"{ind}    if {x} - {x} != 0.0:",  # NaN or ±inf; cheaper than isfinite
                f"{ind}        raise _Reject({'nonfinite:' + key!r})",
                f"{ind}else:",
                f"{ind}    {x} = _float_slow(v, {k}, {req})",
            ]
            if t == _SECONDS:
                lines += [
                    f"{ind}if {x} is not None:",
                    f"{ind}    if {x} < 0.0 or {x} > 9.2e9:",
                    f"{ind}        raise _Reject({'range:' + key!r})",
                    f"{ind}    {x} = round({x} * 1e9)",
                ]
        else:
            lines += [
                f"{ind}{x} = v.string_value",
                f"{ind}if not {x} and v.WhichOneof('value') != 'string_value':",
                f"{ind}    {x} = _str_slow(v, {k}, {req})",
            ]
    lines += ["    " + line for line in post]
    args = ", ".join(f"x{i}" for i in range(len(fields)))
    lines.append("    return " + ctor.format(args=args))
    namespace: dict[str, Any] = {
        "_Reject": _Reject,
        "_int_slow": _int_slow,
        "_float_slow": _float_slow,
        "_str_slow": _str_slow,
        "MAX_COUNT": MAX_COUNT,
        "MAX_NS": MAX_NS,
        **(env or {}),
    }
    exec(compile("\n".join(lines), f"<decode:{name}>", "exec"), namespace)
    fn: Callable[..., Record] = namespace[name]
    return fn


# ------------------------------------------------------------------ span/event kinds
# Fields are in record field order: records are built positionally from x0, x1, ….
_R, _O = True, False  # required, optional

_request_span = _compile_parser(
    "request_span",
    (
        ("gen_ai.request.id", _STR, _R),
        ("http.route", _STR, _O),
        ("gen_ai.response.model", _STR, _O),
        ("gen_ai.usage.prompt_tokens", _INT, _O),
        ("gen_ai.usage.completion_tokens", _INT, _O),
        ("gen_ai.request.max_tokens", _INT, _O),
        ("gen_ai.request.n", _INT, _O),
        ("gen_ai.request.temperature", _FLOAT, _O),
        ("gen_ai.request.top_p", _FLOAT, _O),
    ),
    "RequestSpan(info, {args}, obj.status.code == STATUS_CODE_ERROR)",
    env={"RequestSpan": RequestSpan, "STATUS_CODE_ERROR": _STATUS_CODE_ERROR},
)
_core_span = _compile_parser(
    "core_span",
    (("gen_ai.request.id", _STR, _R),),
    "CoreSpan(info, {args})",
    env={"CoreSpan": CoreSpan},
)
_step_span = _compile_parser(
    "step_span",
    (
        ("scheduler.span_sequence", _INT, _R),
        ("scheduler.step_range_start", _INT, _R),
        ("scheduler.closure_interval", _INT, _R),
        ("scheduler.step_range_end", _INT, _O),
    ),
    "StepSpan(info, {args})",
    env={"StepSpan": StepSpan},
)

_API_FIELDS: tuple[_Field, ...] = (
    ("event.ts.monotonic", _SECONDS, _R),
    ("reason", _STR, _O),
    ("error", _STR, _O),
)
_api_events = {
    "api." + k.value: _compile_parser(
        "api_" + k.value.lower(),
        _API_FIELDS,
        "ApiEvent(info, KIND, wall, {args})",
        env={"ApiEvent": ApiEvent, "KIND": k},
    )
    for k in ApiKind
}

_journey_seconds = _compile_parser("journey_seconds", (("ts.monotonic", _SECONDS, _O),), "{args}")
_JOURNEY_FIELDS: tuple[_Field, ...] = (
    ("ts.monotonic_ns", _NS, _O),  # required, with ts.monotonic as the fallback
    ("scheduler.step", _INT, _R),
    ("phase", _STR, _R),
    ("prefill.done_tokens", _INT, _R),
    ("prefill.total_tokens", _INT, _R),
    ("decode.done_tokens", _INT, _R),
    ("decode.max_tokens", _INT, _R),
    ("num_preemptions", _INT, _R),
    ("schedule.kind", _STR, _O),
    ("finish.status", _STR, _O),
)
_journey_events = {
    "journey." + k.value: _compile_parser(
        "journey_" + k.value.lower(),
        _JOURNEY_FIELDS,
        "JourneyEvent(info, KIND, wall, {args})",
        post=(
            # Spec: ts.monotonic == ts.monotonic_ns / 1e9; use it when ns is absent.
            "if x0 is None:",
            "    x0 = journey_seconds(obj, info)",
            "    if x0 is None:",
            "        raise _Reject('missing:ts.monotonic_ns')",
        ),
        env={"JourneyEvent": JourneyEvent, "KIND": k, "journey_seconds": _journey_seconds},
    )
    for k in JourneyKind
}

_SUMMARY_FIELDS: tuple[_Field, ...] = (
    ("step.id", _INT, _R),
    ("step.ts_start_ns", _NS, _R),
    ("step.ts_end_ns", _NS, _R),
    ("step.duration_us", _INT, _R),
    ("queue.running_depth", _INT, _R),
    ("queue.waiting_depth", _INT, _R),
    ("batch.num_prefill_reqs", _INT, _R),
    ("batch.num_decode_reqs", _INT, _R),
    ("batch.scheduled_tokens", _INT, _R),
    ("batch.prefill_tokens", _INT, _R),
    ("batch.decode_tokens", _INT, _R),
    ("batch.num_finished", _INT, _R),
    ("batch.num_preempted", _INT, _R),
    ("kv.usage_gpu_ratio", _FLOAT, _R),
    ("kv.blocks_total_gpu", _INT, _R),
    ("kv.blocks_free_gpu", _INT, _R),
)
#: What the joiner's bookkeeping reads of a step it sheds (see ``BatchSummary.partial``),
#: besides ``step.id``, which :func:`_shedding_summary_parser` has read already.
_PARTIAL_SUMMARY_KEYS = frozenset(
    {
        "step.ts_start_ns",
        "step.ts_end_ns",
        "queue.running_depth",
        "queue.waiting_depth",
        "batch.scheduled_tokens",
        "kv.usage_gpu_ratio",
    }
)


def _ratio_check(fields: tuple[_Field, ...]) -> tuple[str, ...]:
    """The ``post`` lines bounding ``kv.usage_gpu_ratio`` to [0, 1] among ``fields``."""
    i = [key for key, _, _ in fields].index("kv.usage_gpu_ratio")
    return (f"if x{i} < 0.0 or x{i} > 1.0:", "    raise _Reject('range:kv.usage_gpu_ratio')")


def _partial_summary_parser() -> Callable[..., Record]:
    """``batch_summary_partial(obj, info, wall, step)``: the partial fields read, every
    other field of the record 0, ``partial`` True (built from :data:`_SUMMARY_FIELDS`,
    so the two parsers cannot disagree on a field or its position)."""
    fields = tuple(f for f in _SUMMARY_FIELDS if f[0] in _PARTIAL_SUMMARY_KEYS)
    index = {key: i for i, (key, _, _) in enumerate(fields)}
    args = [
        "step" if key == "step.id" else f"x{index[key]}" if key in index else "0"
        for key, _, _ in _SUMMARY_FIELDS
    ]
    return _compile_parser(
        "batch_summary_partial",
        fields,
        "BatchSummary(info, wall, " + ", ".join(args) + ", True)",
        post=_ratio_check(fields),
        env={"BatchSummary": BatchSummary},
        params="obj, info, wall, step",
    )


_batch_summary = _compile_parser(
    "batch_summary",
    _SUMMARY_FIELDS,
    "BatchSummary(info, wall, {args})",
    post=_ratio_check(_SUMMARY_FIELDS),
    env={"BatchSummary": BatchSummary},
)
_batch_summary_partial = _partial_summary_parser()


def _shedding_summary_parser(keep: Callable[[int], bool]) -> _EventParser:
    """A ``step.BATCH_SUMMARY`` parser that decodes the steps ``keep`` rejects partially.

    Under load the daemon learns one step in up to 32, and a full summary is the
    costliest record to decode; the shed ones only feed the joiner's bookkeeping. An
    odd ``step.id`` (missing, mistyped, out of range) takes the full parser, which
    rejects it with the usual reason.
    """

    def parse(ev: Any, info: SpanInfo, wall: int) -> Record:
        n = ev.attributes["step.id"].int_value
        if 0 < n <= MAX_COUNT and not keep(n):
            return _batch_summary_partial(ev, info, wall, n)
        return _batch_summary(ev, info, wall)

    return parse


_request_snapshot = _compile_parser(
    "request_snapshot",
    (
        ("step.id", _INT, _R),
        ("request.id", _STR, _R),
        ("request.phase", _STR, _R),
        ("request.num_prompt_tokens", _INT, _R),
        ("request.num_computed_tokens", _INT, _R),
        ("request.num_output_tokens", _INT, _R),
        ("request.num_preemptions", _INT, _R),
        ("request.scheduled_tokens_this_step", _INT, _R),
        ("kv.blocks_allocated_gpu", _INT, _R),
        ("kv.blocks_cached_gpu", _INT, _R),
        ("request.effective_prompt_len", _INT, _O),
    ),
    "RequestSnapshot(info, wall, {args})",
    env={"RequestSnapshot": RequestSnapshot},
)


# ----------------------------------------------------------------------- resources


def source_for_resource(resource: Resource) -> Source:
    """Build the :class:`Source` of a resource: id = short hash of sorted attributes.

    The id is stable across restarts of an identically configured process, and
    independent of attribute order.
    """
    attrs = tuple(sorted((kv.key, _any_to_python(kv.value)) for kv in resource.attributes))
    digest = hashlib.blake2b(
        json.dumps(attrs, separators=(",", ":")).encode(), digest_size=6
    ).hexdigest()
    return Source(id=digest, attributes=attrs)


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

    def __init__(self, max_sources: int = 4096, max_source_bytes: int = 16 << 20) -> None:
        self._sources: dict[bytes, Source] = {}
        self._max_sources = max_sources
        # Bounded by bytes too: sources come from the network, and 4096 resources of
        # 1 MB each held 4 GB (a Source holds about what its key does).
        self._max_source_bytes = max_source_bytes
        self._source_bytes = 0
        self._step_filter: Callable[[int], bool] | None = None
        self._scopes = _SCOPES
        #: Engine sampling: the spans of sources for which this is False are counted in
        #: ``sampled_out`` and not decoded. The daemon wires its engine sampler's ``keep``
        #: here (see ``daemon.sampling``); ``None`` decodes every source.
        self.source_filter: Callable[[Source], bool] | None = None

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
        scopes = _SCOPES
        if keep is not None:
            accepts, span_parser, events = _SCOPES[SCOPE_STEP]
            events = {**events, "step.BATCH_SUMMARY": _shedding_summary_parser(keep)}
            scopes = {**_SCOPES, SCOPE_STEP: (accepts, span_parser, events)}
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

    def decode_bytes(self, data: bytes) -> DecodeResult:
        """Decode a binary ``ExportTraceServiceRequest``; raises protobuf ``DecodeError``."""
        return self.decode(FastExportRequest.FromString(data))

    def decode(self, req: Any) -> DecodeResult:
        """Decode one request (see the module docstring for the rules).

        ``req`` is a standard ``ExportTraceServiceRequest`` or, faster, the wire-compatible
        :data:`~receivers.otlp.fastproto.FastExportRequest` the receivers parse into.
        """
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
                    except _Reject as e:
                        _reject_span(res, span, e.args[0])
                        continue
                    _decode_events(span, info, event_parsers, out, res)
        return res


def _decode_events(
    span: Any,
    info: SpanInfo,
    parsers: Mapping[str, _EventParser],
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
                raise _Reject("range:timeUnixNano")
            out.append(parse(ev, info, wall))
        except _Reject as e:
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
        raise _Reject("ids")
    start = span.start_time_unix_nano
    end = span.end_time_unix_nano
    if start <= 0 or end <= 0 or start > MAX_NS or end > MAX_NS:
        raise _Reject("range:span_time")
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


_EventParser = Callable[[Any, SpanInfo, int], Record]
_SpanParser = Callable[[Any, SpanInfo], Record]

#: scope → (accepts span name, span parser, event name → event parser)
_SCOPES: dict[str, tuple[Callable[[str], bool], _SpanParser, dict[str, _EventParser]]] = {
    SCOPE_API: (
        "llm_request".__eq__,
        _request_span,
        _api_events,
    ),
    SCOPE_SCHEDULER: (
        "llm_core".__eq__,
        _core_span,
        _journey_events,
    ),
    SCOPE_STEP: (
        lambda name: name.startswith("scheduler_steps_"),
        _step_span,
        {"step.BATCH_SUMMARY": _batch_summary, "step.REQUEST_SNAPSHOT": _request_snapshot},
    ),
}


def decode_request(req: Any, decoder: Decoder | None = None) -> DecodeResult:
    """Decode one ``ExportTraceServiceRequest`` into records (spans first, then events).

    Pass a long-lived :class:`Decoder` to reuse its Source cache across requests.
    """
    return (decoder or Decoder()).decode(req)


# ------------------------------------------------------------------------ OTLP/JSON


class JsonDecodeError(ValueError):
    """The body is not an OTLP/JSON ``ExportTraceServiceRequest``."""


_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(obj: Any) -> None:
    """OTLP/JSON writes trace/span ids as hex, protobuf's JSON mapping wants base64.

    Rewrites ids in place in spans and their links; ids that are not valid hex are left
    as they are (so a base64 producer still works, and garbage fails in the parser).
    """
    if not isinstance(obj, dict):
        return
    for rs in _items(obj.get("resourceSpans")):
        if not isinstance(rs, dict):
            continue
        for ss in _items(rs.get("scopeSpans")):
            if not isinstance(ss, dict):
                continue
            for span in _items(ss.get("spans")):
                if not isinstance(span, dict):
                    continue
                _fix_ids(span)
                for link in _items(span.get("links")):
                    if isinstance(link, dict):
                        _fix_ids(link)


def _items(v: Any) -> list[Any]:
    # Wrong shapes are left for the protobuf parser to reject with a proper message.
    return v if isinstance(v, list) else []


def _fix_ids(d: dict[str, Any]) -> None:
    for k in _ID_KEYS:
        v = d.get(k)
        if isinstance(v, str) and v and len(v) % 2 == 0:
            try:
                raw = bytes.fromhex(v)
            except ValueError:
                continue
            d[k] = base64.b64encode(raw).decode("ascii")


def parse_json_request(data: bytes | str | Mapping[str, Any]) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON body (bytes, text, or an already loaded dict) into the proto.

    Raises :class:`JsonDecodeError` with a short message when it is not one.
    """
    if isinstance(data, bytes | bytearray | memoryview | str):
        try:
            obj = orjson.loads(data if isinstance(data, str) else bytes(data))
        except orjson.JSONDecodeError as e:
            raise JsonDecodeError(f"invalid JSON: {e}") from None
    else:
        obj = dict(data)
    if not isinstance(obj, dict):
        raise JsonDecodeError("OTLP/JSON body must be a JSON object")
    _hex_ids_to_base64(obj)
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(obj, req, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise JsonDecodeError(f"not an OTLP ExportTraceServiceRequest: {e}") from None
    except RecursionError:
        # ParseDict recurses a few frames per nesting level: a few hundred nested array
        # values exhaust the stack while orjson (limit 1024) still accepted the text.
        raise JsonDecodeError("not an OTLP ExportTraceServiceRequest: nested too deeply") from None
    return req


def decode_json(
    data: bytes | str | Mapping[str, Any], decoder: Decoder | None = None
) -> DecodeResult:
    """OTLP/JSON → records: :func:`parse_json_request` then the protobuf decoder."""
    return decode_request(parse_json_request(data), decoder)
