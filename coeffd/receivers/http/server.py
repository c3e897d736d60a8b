"""OTLP/HTTP receiver: ``POST /v1/traces`` and, defensively, ``POST /`` (spec §1.3).

vLLM passes its ``--otlp-traces-endpoint`` URL verbatim to the exporter, so
``http://host:4318`` posts to ``/``. Bodies: ``application/x-protobuf`` or
``application/json`` (OTLP/JSON), optionally ``Content-Encoding: gzip|deflate``.
Answers: 200 + empty binary ``ExportTraceServiceResponse`` (or one carrying
``partial_success``), 400 for undecodable bodies, 415 for other content types, 413
for bodies over ``max_body_bytes`` (also once decompressed) or over a bound of
``receivers.limits`` (checked before parsing), 503 + ``Retry-After`` when the pipeline
is full (the SDK retries 5xx, and honours ``Retry-After``) or every connection slot is
taken. Errors carry a ``google.rpc.Status`` in the request's encoding (protobuf, or
OTLP/JSON for JSON requests), as the OTLP/HTTP spec asks.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from coeffd.base.endpoint import parse_endpoint
from coeffd.base.http import HttpServer, Request, Response, Router
from coeffd.base.security import http_guard
from coeffd.receivers.config import ReceiverSettings
from coeffd.receivers.host import Host
from coeffd.receivers.otlp.fastproto import parse_request
from coeffd.receivers.otlp.ingest import Ingestor, Outcome
from coeffd.receivers.otlp.jsonbody import JsonDecodeError, parse_json_request
from coeffd.receivers.otlp.limits import LimitExceeded, check_json_body, check_request

__all__ = ["RECEIVER", "OtlpHttpReceiver", "decompress", "status_response"]

RECEIVER = "otlp_http"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyError(ValueError):
    """The body cannot be turned into a request; ``args[0]`` is a short reason."""


class BodyTooLarge(BodyError):
    """The body inflates past the size limit (a 413, not a 400)."""


#: HTTP status → the gRPC code its ``google.rpc.Status`` body carries.
_CODES = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    403: code_pb2.PERMISSION_DENIED,
    404: code_pb2.NOT_FOUND,
    405: code_pb2.UNIMPLEMENTED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    500: code_pb2.INTERNAL,
    503: code_pb2.UNAVAILABLE,
}


def status_response(
    status: int, message: str, ctype: str, headers: dict[str, str] | None = None
) -> Response:
    """An error answer as OTLP/HTTP specifies it: a ``google.rpc.Status`` encoded like
    the request (JSON for ``application/json``, protobuf otherwise).

    >>> r = status_response(400, "bad", JSON)
    >>> r.status, r.content_type, r.body
    (400, 'application/json', b'{"code": 3, "message": "bad"}')
    >>> status_pb2.Status.FromString(status_response(413, "big", PROTOBUF).body).code
    8
    """
    if len(message) > _MAX_MESSAGE:  # parser errors repeat per nesting level
        message = message[: _MAX_MESSAGE - 3] + "..."
    body = status_pb2.Status(code=_CODES.get(status, code_pb2.UNKNOWN), message=message)
    if _media_type(ctype) == JSON:
        return Response(
            status, json_format.MessageToJson(body, indent=None).encode(), JSON, headers or {}
        )
    return Response(status, body.SerializeToString(), PROTOBUF, headers or {})


_MAX_MESSAGE = 512


def _media_type(ctype: str) -> str:
    return ctype.split(";", 1)[0].strip().lower()


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate — raw or zlib-wrapped), bounded by ``limit``.

    The bound protects against decompression bombs: a few KiB of gzip can expand to GiB.

    >>> import gzip
    >>> decompress(gzip.compress(b"abc"), "gzip", 100)
    b'abc'
    """
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc in ("gzip", "x-gzip"):
        wbits_options: tuple[int, ...] = (16 + zlib.MAX_WBITS,)
    elif enc == "deflate":
        # RFC says zlib-wrapped; some clients send raw deflate. Try both.
        wbits_options = (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    else:
        raise BodyError(f"unsupported Content-Encoding {encoding!r}")
    for wbits in wbits_options:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise BodyTooLarge(f"decompressed body larger than {limit} bytes")
        return out
    raise BodyError(f"body is not valid {enc}")


class OtlpHttpReceiver:
    """An HTTP server with the OTLP routes, on its own port."""

    def __init__(self, host: Host, settings: ReceiverSettings) -> None:
        cfg = settings.otlp_http
        self.max_body = cfg.max_body_bytes
        self.limits = settings.limits
        self.retry_after = str(max(1, math.ceil(settings.retry_after_seconds)))
        self.ingestor = Ingestor.for_host(host, RECEIVER)
        self.router = Router()
        self.router.add_route("POST", "/v1/traces", self.handle)
        self.router.add_route("POST", "/", self.handle)
        address, port = parse_endpoint(cfg.endpoint)
        tls, gate = http_guard(RECEIVER, cfg.tls, cfg.auth, host.auth_metrics)
        self._server = HttpServer(
            address,
            port,
            self.router,
            max_body_bytes=self.max_body,
            name="otlp-http",
            on_refused=self._refused,
            error_response=status_response,
            max_connections=cfg.max_connections,
            idle_timeout=cfg.idle_timeout_seconds,
            ssl_context=tls,
            gate=gate,
            inline_handlers=True,  # decode and offer never block: no thread hand-off
            # bench serve --part http: one loop 0.94x the stdlib server, four 0.83x (one
            # noisy run each; the body read size mattered, 64 KiB pieces 0.58x)
            loops=1,
        )

    @property
    def port(self) -> int:
        """Bound port."""
        return self._server.port

    def start(self) -> None:
        """Start serving."""
        self._server.start()

    @property
    def alive(self) -> bool:
        """Whether the serving thread runs."""
        return self._server.alive

    def restart(self) -> None:
        """Serve again after the serving thread died (supervision)."""
        self._server.restart()

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()

    def handle(self, req: Request) -> Response:
        """Handle one export request."""
        ctype = _media_type(req.header("Content-Type"))
        if ctype not in (PROTOBUF, JSON):
            self.ingestor.invalid(f"content type {ctype!r}", req.client, len(req.body))
            return status_response(
                415, f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}", ctype
            )
        try:
            export = self._parse(req, ctype)
        except LimitExceeded as e:
            self.ingestor.refused(e.limit, str(e), req.client, len(req.body))
            return status_response(413, f"request refused: {e}", ctype)
        except BodyTooLarge as e:
            self.ingestor.refused("body_bytes", str(e), req.client, len(req.body))
            return status_response(413, str(e), ctype)
        except BodyError as e:
            self.ingestor.invalid(str(e), req.client, len(req.body))
            return status_response(400, str(e), ctype)
        got = self.ingestor.ingest(export, peer=req.client)
        if got.outcome is Outcome.RETRY:
            return status_response(
                503, "coeffd pipeline full, retry later", ctype, {"Retry-After": self.retry_after}
            )
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if got.outcome is Outcome.PARTIAL:
            resp.partial_success.rejected_spans = got.result.rejected_spans
            resp.partial_success.error_message = got.result.error_message()
        if ctype == JSON:
            return Response(200, b"{}" if got.outcome is Outcome.OK else _json(resp), JSON)
        return Response(200, resp.SerializeToString(), PROTOBUF)

    def _parse(self, req: Request, ctype: str) -> Any:
        """Decompress, check the limits, parse; raises ``BodyError``/``LimitExceeded``."""
        body = decompress(req.body, req.header("Content-Encoding"), self.max_body)
        if ctype == PROTOBUF:
            over = check_request(body, self.limits)
            if over is not None:
                raise over
            try:
                return parse_request(body)
            except DecodeError as e:
                raise BodyError(f"invalid protobuf: {e}") from None
        over = check_json_body(body, self.limits)
        if over is not None:
            raise over
        try:
            export = parse_json_request(body)
        except JsonDecodeError as e:
            raise BodyError(str(e)) from None
        # The same bounds as protobuf, on the request's encoding (C, ~1 ms a MB): the
        # JSON's size was bounded above, what it holds is bounded here.
        over = check_request(export.SerializeToString(), self.limits)
        if over is not None:
            raise over
        return export

    def _refused(self, status: int, reason: str, client: str) -> None:
        """Count a request the HTTP server refused before it reached :meth:`handle`."""
        if status == 413:
            self.ingestor.refused("body_bytes", reason, client)
        elif status == 503:
            self.ingestor.refused("connections", reason, client)
        else:
            self.ingestor.invalid(reason, client)


def _json(msg: trace_service_pb2.ExportTraceServiceResponse) -> bytes:
    return json_format.MessageToJson(msg, indent=None).encode()
