"""OTLP/JSON bodies → ``ExportTraceServiceRequest`` (the HTTP receiver, replay files).

OTLP/JSON differs from protobuf's JSON mapping in its ids (hex, not base64); they are
rewritten before the protobuf parser runs. Anything that is not a request raises
:class:`JsonDecodeError` with a short message; decoding the request into records is
:mod:`.decode`'s job.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["JsonDecodeError", "parse_json_request"]


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
