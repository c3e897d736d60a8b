"""Back-pressure: a full pipeline answers retryable statuses, and the SDK's own retries
then deliver every event exactly once."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from conftest import make_settings, metric, scrape
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from otlp_builders import core_span, journey, request
from test_sdk_export import exporter
from vllm_spans import emit_api, emit_engine

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer

FILLER: Any = [object()] * 4  # occupies the tiny queue so that any real request overflows it


@pytest.fixture
def full_app() -> Iterator[App]:
    settings = make_settings(queue_capacity=5)
    # 1 s keeps the exporter's 6 attempts spread over ~5 s, so a slow (loaded) test
    # machine still resumes the worker before the SDK gives up.
    settings.receivers.retry_after_seconds = 1.0
    a = App(settings, consumer=CountingConsumer.keeping())
    a.start()
    a.pause()
    assert a.offer(FILLER, "test")
    yield a
    a.stop()


def _wait_retry(app: App, receiver: str, at_least: int = 1, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = metric(
            scrape(app), "coeffd_receiver_requests_total", receiver=receiver, outcome="retry"
        )
        if n >= at_least:
            return n
        time.sleep(0.02)
    raise AssertionError(f"no retry answered by {receiver}")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_retries_deliver_exactly_once(full_app: App, protocol: str) -> None:
    app = full_app
    resource = Resource.create({"service.name": "unknown_service"})
    engine = emit_engine(exporter(app, protocol, gzip=False), resource)
    flushed: list[bool] = []
    t = threading.Thread(target=lambda: flushed.append(engine.force_flush(30_000)))
    t.start()
    _wait_retry(app, f"otlp_{protocol}")
    assert app.consumer.total == 0  # type: ignore[attr-defined]
    app.resume()  # the filler drains; the SDK's next retry fits
    t.join(30)
    assert flushed == [True]
    api = emit_api(exporter(app, protocol, gzip=False), resource)
    assert api.force_flush(30_000)
    assert app.pipeline.wait_idle(10)
    c = app.consumer
    assert isinstance(c, CountingConsumer) and c.records is not None
    real = [r for r in c.records if r not in FILLER]
    assert len(real) == 15  # exactly once: nothing lost, nothing duplicated
    assert c.by_kind["JourneyEvent.QUEUED"] == 1 and c.by_kind["BatchSummary"] == 2
    m = scrape(app)
    assert (
        metric(m, "coeffd_receiver_requests_total", receiver=f"otlp_{protocol}", outcome="ok") == 2
    )
    assert (
        metric(m, "coeffd_events_received_total", receiver=f"otlp_{protocol}", kind="BatchSummary")
        == 2
    )
    engine.shutdown()
    api.shutdown()


def test_grpc_unavailable_carries_retry_info(full_app: App) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{full_app.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Export(request(("vllm.scheduler", [core_span(journey())])), timeout=5)
    err = ei.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(err.trailing_metadata())
    info = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert (info.retry_delay.seconds, info.retry_delay.nanos) == (1, 0)
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.details[0].Unpack(error_details_pb2.RetryInfo())


def test_http_503_retry_after(full_app: App) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{full_app.otlp_http_port}/v1/traces",
        data=request(("vllm.scheduler", [core_span(journey())])).SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=5)
    assert ei.value.code == 503 and ei.value.headers["Retry-After"] == "1"
    m = scrape(full_app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="retry") == 1
    # nothing from the refused request was counted as received
    assert metric(m, "coeffd_events_received_total", receiver="otlp_http", kind="CoreSpan") == 0
    assert metric(m, "coeffd_queue_depth") == 4


def test_full_pipeline_refuses_before_decoding(full_app: App) -> None:
    """Under overload a refused request must not cost a decode that is thrown away (each
    resend would pay it again): once the typical request size is known, a pipeline without
    room for it answers UNAVAILABLE before decoding."""
    body = request(("vllm.scheduler", [core_span(journey())]))
    with grpc.insecure_channel(f"127.0.0.1:{full_app.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as ei:
                stub.Export(body, timeout=5)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    m = scrape(full_app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="retry") == 3
    # only the first was decoded (it taught the ingestor the typical request size)
    assert metric(m, "coeffd_receiver_decode_seconds_count", receiver="otlp_grpc") == 1
    full_app.resume()  # room again: the same request is decoded and accepted
    with grpc.insecure_channel(f"127.0.0.1:{full_app.grpc_port}") as ch:
        trace_service_pb2_grpc.TraceServiceStub(ch).Export(body, timeout=5)
    m = scrape(full_app)
    assert metric(m, "coeffd_receiver_requests_total", receiver="otlp_grpc", outcome="ok") == 1
    assert metric(m, "coeffd_receiver_decode_seconds_count", receiver="otlp_grpc") == 2
