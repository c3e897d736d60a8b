"""Bounds on the work one OTLP request may cause, checked on the wire bytes before parsing.

Why before: protobuf's cost is per *message*, not per byte. An empty ``ResourceSpans`` is
2 bytes on the wire, ~60 bytes once parsed and ~1 µs in the decoder's loop; an empty
``Span`` ~170 bytes. So a 32 MB body of 16 M empty ``ResourceSpans`` cost ~34 s of CPU
and 2 GB before it was answered 200 (issue 17; ``python -m bench dos`` measures 17 s and
1.9 GB on the decode path alone), and a body of empty spans 3.6 GB. Counting after parsing is too late, so :func:`check_request` walks the encoded
``ExportTraceServiceRequest`` instead, and stops at the first bound exceeded:

* ``ResourceSpans``, ``ScopeSpans`` and spans are counted exactly (one step per item:
  a real request has a few resources and some hundreds of spans);
* each resource's encoded size is bounded: the decoder keeps one ``Source`` per distinct
  resource, so its size is memory held for as long as the stream lives; each scope's
  too (its attributes would be parsed, and are never walked);
* *items* inside spans (events, links, attributes, and the values nested in array or
  map attributes) are bounded per span and per request. A nested message costs at least
  2 bytes of its span, so a span of ``n`` bytes holds at most ``n // 2`` items: spans
  are walked only while that bound could exceed a limit, which real traffic (1 MB
  requests) never reaches, and the walk gives up at the first limit crossed.

The walk allocates nothing per item, so its own cost is bounded by the limits too.

>>> check_request(b"", RequestLimits()) is None
True
>>> check_request(b"\\x0a\\x00" * 3, RequestLimits(max_resource_spans=2))
LimitExceeded('more than 2 ResourceSpans')
>>> check_request(b"\\x0a\\x05", RequestLimits()) is None  # truncated: the parser's job
True
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LimitExceeded", "RequestLimits", "check_json_body", "check_request"]


class RequestLimits(BaseModel):
    """``[receivers.limits]``: bounds on one OTLP request, for both OTLP receivers.

    A request over any of them is refused whole (gRPC ``INVALID_ARGUMENT``, HTTP 413)
    and counted in ``coeffd_receiver_limit_exceeded_total{limit}``. The defaults are far
    above what vLLM sends (a few resources, ≤ 512 spans, ≤ 128 events of ≤ 128
    attributes per span) and far below what a sender can pack into the largest body.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_resource_spans: int = Field(default=10_000, ge=1)
    max_scope_spans: int = Field(default=10_000, ge=1)
    max_spans: int = Field(default=100_000, ge=1)
    #: Events + links + attributes (and values nested in array/map attributes) of one span.
    max_span_items: int = Field(default=100_000, ge=1)
    #: The same, summed over the request.
    max_items: int = Field(default=2_000_000, ge=1)
    #: Encoded size of one ``Resource`` (its attributes): each distinct one is kept as
    #: the stream's identity for as long as the stream lives. Bounds each
    #: ``InstrumentationScope`` too (a name, a version, rarely attributes).
    max_resource_bytes: int = Field(default=65_536, ge=64)
    #: Objects (``{``) in an OTLP/JSON body, counted before it is parsed: protobuf's
    #: JSON parser costs ~4 µs an object (250,000: ~1 s of CPU, a 512-span batch ~90,000).
    max_json_objects: int = Field(default=250_000, ge=1)


class LimitExceeded(ValueError):
    """A request exceeds a :class:`RequestLimits` bound; ``limit`` is its metric label
    (``resource_spans``, ``scope_spans``, ``spans``, ``span_items``, ``items``,
    ``resource_bytes``, ``scope_bytes``, ``json_objects``; the receivers add
    ``message_bytes``, ``body_bytes`` and ``connections``)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class _Stop(Exception):
    """Internal: malformed wire data; the protobuf parser will give the real error."""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """Decode a varint at ``i``; returns (value, next index)."""
    b = data[i]
    if b < 0x80:
        return b, i + 1
    value = b & 0x7F
    shift = 7
    i += 1
    while True:
        if i >= len(data) or shift > 63:
            raise _Stop
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """The length-delimited fields of the message ``data[start:end]`` as
    ``(field number, payload start, payload end)``; other wire types are skipped.
    A generator, so that a caller crossing a bound stops the walk there."""
    i = start
    while i < end:
        key = data[i]  # one-byte keys and lengths inline: this loop runs per span
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(data, i)
        wire = key & 7
        if wire == 2:
            n = data[i]
            if n < 0x80:
                i += 1
            elif i + 1 < end and data[i + 1] < 0x80:  # spans are mostly 128 B - 16 KB
                n = (n & 0x7F) | data[i + 1] << 7
                i += 2
            else:
                n, i = _varint(data, i)
            if i + n > end:
                raise _Stop
            yield key >> 3, i, i + n
            i += n
        elif wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:  # groups (3, 4) are not used by OTLP; 6, 7 are invalid
            raise _Stop
    if i != end:
        raise _Stop


# Field numbers (opentelemetry/proto/{collector/trace,trace,common}/v1/*.proto).
_REQ_RESOURCE_SPANS = 1
_RS_RESOURCE, _RS_SCOPE_SPANS = 1, 2
_SS_SCOPE, _SS_SPANS = 1, 2
_SPAN_ATTRIBUTES, _SPAN_EVENTS, _SPAN_LINKS = 9, 11, 13
_EVENT_ATTRIBUTES = 3  # Span.Event.attributes
_LINK_ATTRIBUTES = 5  # Span.Link.attributes
_KV_VALUE = 2
_ANY_ARRAY, _ANY_KVLIST = 5, 6
#: First byte of an AnyValue holding an array or a map (length-delimited fields 5, 6).
_NESTING_TAGS = frozenset({_ANY_ARRAY << 3 | 2, _ANY_KVLIST << 3 | 2})


def _attribute_items(data: bytes, start: int, end: int) -> int:
    """Items of one ``KeyValue``: 1, plus a bound on what an array/map value nests."""
    # Fast path, the usual encoding: key (field 1) then value (field 2) whose first field
    # is a scalar: one item, found with two varint reads instead of a walk.
    if end - start > 2 and data[start] == 0x0A:
        klen, i = _varint(data, start + 1)
        i += klen
        if i + 2 < end and data[i] == 0x12:
            _, j = _varint(data, i + 1)
            if j < end and data[j] not in _NESTING_TAGS:
                return 1
    n = 1
    for number, s, e in _fields(data, start, end):
        if number == _KV_VALUE:
            for inner, vs, ve in _fields(data, s, e):
                if inner in (_ANY_ARRAY, _ANY_KVLIST):
                    n += (ve - vs) // 2
    return n


def _span_items(data: bytes, start: int, end: int, limit: int) -> int:
    """Exact items of one span (bounded for nested values); stops once above ``limit``."""
    n = 0
    for number, s, e in _fields(data, start, end):
        if number == _SPAN_ATTRIBUTES:
            n += _attribute_items(data, s, e)
        elif number in (_SPAN_EVENTS, _SPAN_LINKS):
            n += 1
            attrs = _EVENT_ATTRIBUTES if number == _SPAN_EVENTS else _LINK_ATTRIBUTES
            for inner, a, b in _fields(data, s, e):
                if inner == attrs:
                    n += _attribute_items(data, a, b)
        if n > limit:
            break
    return n


def check_request(data: bytes, limits: RequestLimits) -> LimitExceeded | None:
    """``None`` if the encoded request is within ``limits``, else the bound it crosses.

    Malformed bytes also give ``None``: they are the parser's to reject, with its message.
    """
    try:
        if _fits_by_size(data, limits):
            return None
    except (_Stop, IndexError):
        pass  # the exact walk decides (a limit may be crossed before the bad bytes)
    try:
        _check(data, limits)
    except LimitExceeded as e:
        return e
    except (_Stop, IndexError):
        return None
    return None


def _fits_by_size(data: bytes, lim: RequestLimits) -> bool:
    """True when no limit can be crossed, walking only ResourceSpans and ScopeSpans.

    The exact walk steps once per span (~0.5 µs an event, a quarter of decoding it); a
    message costs at least 2 bytes, so a ScopeSpans of ``B`` bytes holds at most ``B // 2``
    spans, items in a span or a scope's attributes, and its scope is at most ``B`` bytes.
    When those bounds already fit every limit (a real request: one resource, a few
    scopes, tens of KB) the spans are not walked; otherwise (False) :func:`_check`
    walks exactly, so what is refused, and the message, are the same as before.
    """
    n_rs = n_ss = 0
    bound = 0  # at most this many spans, and items, in the scopes seen
    for number, s, e in _fields(data, 0, len(data)):
        if number != _REQ_RESOURCE_SPANS:
            continue
        n_rs += 1
        if n_rs > lim.max_resource_spans:
            return False
        for rn, rs, re in _fields(data, s, e):
            if rn == _RS_RESOURCE:
                if re - rs > lim.max_resource_bytes:
                    return False
            elif rn == _RS_SCOPE_SPANS:
                n_ss += 1
                size = re - rs
                if n_ss > lim.max_scope_spans or size > lim.max_resource_bytes:
                    return False
                bound += size // 2
                if size // 2 > lim.max_span_items:
                    return False
    return bound <= lim.max_spans and bound <= lim.max_items


def _check(data: bytes, lim: RequestLimits) -> None:
    spans: list[tuple[int, int]] = []
    n_rs = n_ss = 0
    for number, s, e in _fields(data, 0, len(data)):
        if number != _REQ_RESOURCE_SPANS:
            continue
        n_rs += 1
        if n_rs > lim.max_resource_spans:
            raise LimitExceeded(
                "resource_spans", f"more than {lim.max_resource_spans} ResourceSpans"
            )
        for rn, rs, re in _fields(data, s, e):
            if rn == _RS_RESOURCE:
                if re - rs > lim.max_resource_bytes:
                    raise LimitExceeded(
                        "resource_bytes",
                        f"a resource of {re - rs} bytes (more than {lim.max_resource_bytes})",
                    )
            elif rn == _RS_SCOPE_SPANS:
                n_ss += 1
                if n_ss > lim.max_scope_spans:
                    raise LimitExceeded(
                        "scope_spans", f"more than {lim.max_scope_spans} ScopeSpans"
                    )
                for sn, ss, se in _fields(data, rs, re):
                    if sn == _SS_SPANS:
                        spans.append((ss, se))
                        if len(spans) > lim.max_spans:
                            raise LimitExceeded("spans", f"more than {lim.max_spans} spans")
                    elif sn == _SS_SCOPE and se - ss > lim.max_resource_bytes:
                        raise LimitExceeded(
                            "scope_bytes",
                            f"a scope of {se - ss} bytes (more than {lim.max_resource_bytes})",
                        )
    _check_items(data, spans, lim)


def _check_items(data: bytes, spans: list[tuple[int, int]], lim: RequestLimits) -> None:
    # ``bound``: at most this many items in the spans not yet walked.
    bound = sum((e - s) // 2 for s, e in spans)
    exact = 0
    for s, e in spans:
        span_bound = (e - s) // 2
        if exact + bound <= lim.max_items and span_bound <= lim.max_span_items:
            # Every limit holds even if each remaining byte pair were an item; but a later
            # span may still be too big on its own, so only skip this one.
            exact += span_bound
            bound -= span_bound
            continue
        bound -= span_bound
        n = _span_items(data, s, e, lim.max_span_items)
        if n > lim.max_span_items:
            raise LimitExceeded(
                "span_items", f"a span with more than {lim.max_span_items} events/attributes"
            )
        exact += n
        if exact > lim.max_items:
            raise LimitExceeded("items", f"more than {lim.max_items} events/attributes")


def check_json_body(data: bytes, limits: RequestLimits) -> LimitExceeded | None:
    """Bound an OTLP/JSON body before it is parsed: at most ``max_json_objects`` objects.

    Parsing JSON builds a dict per object, then protobuf's JSON parser walks each in
    Python, before any count can be taken; so the objects are bounded by counting ``{``
    in C first. Braces inside strings only make the bound stricter by what they hold.

    >>> check_json_body(b'{"resourceSpans": []}', RequestLimits()) is None
    True
    >>> check_json_body(b"[" + b"{}," * 10 + b"{}]", RequestLimits(max_json_objects=10))
    LimitExceeded('more than 10 JSON objects')
    """
    cap = limits.max_json_objects
    if data.count(b"{") > cap:
        return LimitExceeded("json_objects", f"more than {cap} JSON objects")
    return None
