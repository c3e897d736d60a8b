"""OTLP/HTTP receiver: ``POST /v1/traces`` and, defensively, ``POST /`` (spec §1.3).

vLLM passes its ``--otlp-traces-endpoint`` URL verbatim to the exporter, so
``http://host:4318`` posts to ``/``. Bodies: ``application/x-protobuf`` or
``application/json`` (OTLP/JSON), optionally ``Content-Encoding: gzip|deflate``.
Answers: 200 + empty binary ``ExportTraceServiceResponse`` (or one carrying
``partial_success``), 400 for undecodable bodies, 415 for other content types, 413
for oversize bodies, 503 + ``Retry-After`` when the pipeline is full (the SDK retries
5xx, and honours ``Retry-After``).
"""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from daemon.http.server import HttpServer, Request, Response, Router
from daemon.security import http_guard
from daemon.settings import parse_endpoint
from receivers.otlp.decode import JsonDecodeError, parse_json_request
from receivers.otlp.fastproto import FastExportRequest
from receivers.otlp.ingest import Ingestor, Outcome

if TYPE_CHECKING:
    from daemon.app import App

__all__ = ["RECEIVER", "OtlpHttpReceiver", "decompress"]

RECEIVER = "otlp_http"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyError(ValueError):
    """The body cannot be turned into a request; ``args[0]`` is a short reason."""


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
            raise BodyError(f"decompressed body larger than {limit} bytes")
        return out
    raise BodyError(f"body is not valid {enc}")


class OtlpHttpReceiver:
    """An HTTP server with the OTLP routes, on its own port."""

    def __init__(self, app: App) -> None:
        cfg = app.settings.receivers.otlp_http
        self.max_body = cfg.max_body_bytes
        self.retry_after = str(max(1, math.ceil(app.settings.receivers.retry_after_seconds)))
        self.ingestor = Ingestor.for_app(app, RECEIVER)
        self.router = Router()
        self.router.add_route("POST", "/v1/traces", self.handle)
        self.router.add_route("POST", "/", self.handle)
        host, port = parse_endpoint(cfg.endpoint)
        tls, gate = http_guard(RECEIVER, cfg.tls, cfg.auth, app.auth_metrics)
        self._server = HttpServer(
            host,
            port,
            self.router,
            max_body_bytes=self.max_body,
            name="otlp-http",
            on_refused=lambda status, reason, client: self.ingestor.invalid(reason, client),
            ssl_context=tls,
            gate=gate,
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
        ctype = req.header("Content-Type").split(";", 1)[0].strip().lower()
        if ctype not in (PROTOBUF, JSON):
            self.ingestor.invalid(f"content type {ctype!r}", req.client, len(req.body))
            return Response.text(
                415, f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}"
            )
        try:
            body = decompress(req.body, req.header("Content-Encoding"), self.max_body)
            if ctype == PROTOBUF:
                try:
                    export = FastExportRequest.FromString(body)
                except DecodeError as e:
                    raise BodyError(f"invalid protobuf: {e}") from None
            else:
                try:
                    export = parse_json_request(body)
                except JsonDecodeError as e:
                    raise BodyError(str(e)) from None
        except BodyError as e:
            self.ingestor.invalid(str(e), req.client, len(req.body))
            return Response.text(400, str(e))
        got = self.ingestor.ingest(export, peer=req.client)
        if got.outcome is Outcome.RETRY:
            return Response.text(
                503, "coeffd pipeline full, retry later", {"Retry-After": self.retry_after}
            )
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if got.outcome is Outcome.PARTIAL:
            resp.partial_success.rejected_spans = got.result.rejected_spans
            resp.partial_success.error_message = got.result.error_message()
        if ctype == JSON:
            return Response(200, b"{}" if got.outcome is Outcome.OK else _json(resp), JSON)
        return Response(200, resp.SerializeToString(), PROTOBUF)


def _json(msg: trace_service_pb2.ExportTraceServiceResponse) -> bytes:
    from google.protobuf import json_format

    return json_format.MessageToJson(msg, indent=None).encode()
