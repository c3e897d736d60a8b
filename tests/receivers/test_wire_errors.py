"""Malformed input on the wire: documented statuses, counters (via a real scrape), and
the daemon keeps serving."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request

import grpc
import pytest
from conftest import metric, scrape
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from otlp_builders import core_span, journey, request, step_span, summary_attrs

from coeffd.daemon.app import App

GOOD = request(("vllm.scheduler", [core_span(journey())]))
BAD_EVENT = request(
    ("vllm.scheduler", [core_span(journey(scheduler__step="x"), journey("SCHEDULED"))])
)


def post(
    app: App, body: bytes, ctype: str, path: str = "/v1/traces", **headers: str
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{app.otlp_http_port}{path}",
        data=body,
        method="POST",
        headers={"Content-Type": ctype, **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


PB = "application/x-protobuf"


@pytest.mark.parametrize(
    ("body", "ctype", "headers", "status"),
    [
        (b"\xff\xfe garbage \x00\x01", PB, {}, 400),
        (b"{not json", "application/json", {}, 400),
        (b'{"resourceSpans": "nope"}', "application/json", {}, 400),
        (b"hello", "text/plain", {}, 415),
        (b"not gzip at all", PB, {"Content-Encoding": "gzip"}, 400),
        (b"x", PB, {"Content-Encoding": "br"}, 400),
    ],
)
def test_http_undecodable(
    app: App, body: bytes, ctype: str, headers: dict[str, str], status: int
) -> None:
    code, text, _ = post(app, body, ctype, **headers)
    assert code == status and text
    m = scrape(app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="invalid") == 1
    assert (
        metric(m, "coeffd_events_rejected_total", receiver="otlp_http", reason="undecodable") == 1
    )
    # ... and the daemon keeps serving
    code, body2, _ = post(
        app, gzip.compress(GOOD.SerializeToString()), PB, **{"Content-Encoding": "gzip"}
    )
    assert code == 200 and body2 == b""
    assert app.pipeline.wait_idle(5)
    assert app.consumer.total == 2  # type: ignore[attr-defined]


def test_http_partial_success_and_counters(app: App) -> None:
    code, body, hdrs = post(app, BAD_EVENT.SerializeToString(), PB, path="/")
    assert code == 200 and hdrs["Content-Type"] == PB
    resp = trace_service_pb2.ExportTraceServiceResponse.FromString(body)
    assert resp.partial_success.rejected_spans == 1
    assert "type:scheduler.step=1" in resp.partial_success.error_message
    code, body, _ = post(app, b"", PB)  # empty request: fine, nothing to do
    assert (code, body) == (200, b"")
    code, body, _ = post(app, b'{"resourceSpans": []}', "application/json")
    assert (code, body) == (200, b"{}")
    code, _, hdrs = post(app, b"", PB, path="/metrics")
    assert code == 404
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"http://127.0.0.1:{app.otlp_http_port}/v1/traces", timeout=5)
    assert ei.value.code == 405
    m = scrape(app)
    assert (
        metric(
            m, "coeffd_events_rejected_total", receiver="otlp_http", reason="type:scheduler.step"
        )
        == 1
    )
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="partial") == 1
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="ok") == 2
    assert (
        metric(
            m, "coeffd_events_received_total", receiver="otlp_http", kind="JourneyEvent.SCHEDULED"
        )
        == 1
    )


def test_http_oversize_body_413(app: App) -> None:
    app._otlp_http._server.max_body_bytes = 1000  # type: ignore[union-attr]
    code, _, _ = post(app, b"\x00" * 5000, PB)
    assert code == 413
    m = scrape(app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="limit") == 1
    assert (
        metric(m, "coeffd_receiver_limit_exceeded_total", receiver="otlp_http", limit="body_bytes")
        == 1
    )
    assert post(app, GOOD.SerializeToString(), PB)[0] == 200


def _stub(app: App) -> tuple[grpc.Channel, trace_service_pb2_grpc.TraceServiceStub]:
    ch = grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    return ch, trace_service_pb2_grpc.TraceServiceStub(ch)


def test_grpc_garbage_partial_empty(app: App) -> None:
    ch, stub = _stub(app)
    with ch:
        raw = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as ei:
            raw(b"\xff\xfe not protobuf", timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        resp = stub.Export(BAD_EVENT, timeout=5)
        assert resp.partial_success.rejected_spans == 1
        assert "type:scheduler.step" in resp.partial_success.error_message
        assert stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=5) == (
            trace_service_pb2.ExportTraceServiceResponse()
        )
        assert not stub.Export(GOOD, timeout=5).HasField("partial_success")
    m = scrape(app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="invalid") == 1
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="partial") == 1
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="ok") == 2
    assert (
        metric(
            m, "coeffd_events_rejected_total", receiver="otlp_grpc", reason="type:scheduler.step"
        )
        == 1
    )
    assert metric(m, "coeffd_events_received_total", receiver="otlp_grpc", kind="CoreSpan") == 2


def test_health_and_ready(app: App) -> None:
    base = f"http://127.0.0.1:{app.http_port}"
    assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
    assert urllib.request.urlopen(base + "/readyz", timeout=5).read() == b"ready\n"
    app.ready = False
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(base + "/readyz", timeout=5)
    assert ei.value.code == 503


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (journey(scheduler__step=None), "missing:scheduler.step"),
        (journey(phase=7), "type:phase"),
        (journey(decode__done_tokens=float("nan")), "nonfinite:decode.done_tokens"),
        (journey(prefill__total_tokens=2**60), "range:prefill.total_tokens"),
        (journey(num_preemptions=-2), "range:num_preemptions"),
    ],
)
def test_malformed_events_over_grpc_counted_by_reason(
    app: App, event: tuple[str, dict[str, object]], reason: str
) -> None:
    req = request(
        ("vllm.scheduler", [core_span(event, journey("SCHEDULED"))]),
        ("vllm.unknown", [core_span(journey())]),
    )
    ch, stub = _stub(app)
    with ch:
        resp = stub.Export(req, timeout=5)
    assert resp.partial_success.rejected_spans == 1
    m = scrape(app)
    assert metric(m, "coeffd_events_rejected_total", receiver="otlp_grpc", reason=reason) == 1
    assert (
        metric(m, "coeffd_events_ignored_total", receiver="otlp_grpc") == 2
    )  # unknown scope: span + event
    assert (
        metric(
            m, "coeffd_events_received_total", receiver="otlp_grpc", kind="JourneyEvent.SCHEDULED"
        )
        == 1
    )
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="partial") == 1


@pytest.mark.parametrize("wbits", [15, -15])  # zlib-wrapped (RFC) and raw deflate
def test_http_deflate_accepted(app: App, wbits: int) -> None:
    import zlib

    c = zlib.compressobj(wbits=wbits)
    body = c.compress(GOOD.SerializeToString()) + c.flush()
    code, _, _ = post(app, body, PB, **{"Content-Encoding": "deflate"})
    assert code == 200
    assert app.pipeline.wait_idle(5)
    assert app.consumer.total == 2  # type: ignore[attr-defined]


def test_upstream_dropped_events_counted(app: App) -> None:
    req = request(("vllm.scheduler.step", [step_span(summary_attrs())]))
    req.resource_spans[0].scope_spans[0].spans[0].dropped_events_count = 37
    ch, stub = _stub(app)
    with ch:
        assert not stub.Export(req, timeout=5).HasField("partial_success")
    assert app.pipeline.wait_idle(5)
    records = app.consumer.records  # type: ignore[attr-defined]
    assert records[0].span.dropped_events == 37
    m = scrape(app)
    assert metric(m, "coeffd_upstream_dropped_events_total", receiver="otlp_grpc") == 37
