"""The real OpenTelemetry SDK exporters (gRPC and HTTP) → a running receiver → records."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import metric, scrape
from grpc import Compression as GrpcCompression
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from test_example_replay import check_example
from vllm_spans import emit_api, emit_engine

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer


def exporter(app: App, protocol: str, gzip: bool, path: str = "/v1/traces") -> SpanExporter:
    if protocol == "grpc":
        return GrpcExporter(
            endpoint=f"http://127.0.0.1:{app.grpc_port}",
            insecure=True,
            compression=GrpcCompression.Gzip if gzip else None,
        )
    return HttpExporter(
        endpoint=f"http://127.0.0.1:{app.otlp_http_port}{path}",
        compression=HttpCompression.Gzip if gzip else HttpCompression.NoCompression,
    )


@pytest.mark.parametrize(("protocol", "path"), [("grpc", ""), ("http", "/v1/traces"), ("http", "")])
def test_sdk_spans_arrive_as_records(app: App, protocol: str, path: str) -> None:
    # vLLM's default resource: the SDK's, with service.name unset → unknown_service.
    resource = Resource.create({"service.name": "unknown_service"})
    engine = emit_engine(exporter(app, protocol, gzip=True, path=path), resource)
    assert engine.force_flush(10_000)
    api = emit_api(exporter(app, protocol, gzip=False, path=path), resource)
    assert api.force_flush(10_000)
    assert app.pipeline.wait_idle(10)

    consumer = app.consumer
    assert isinstance(consumer, CountingConsumer) and consumer.records is not None
    check_example(consumer.records)  # every record, field by field
    first: Any = consumer.records[0]
    assert first.span.source.get("telemetry.sdk.name") == "opentelemetry"

    receiver = f"otlp_{protocol}"
    m = scrape(app)
    assert metric(m, "coeffd_receiver_requests_total", receiver=receiver, outcome="ok") == 2
    assert metric(m, "coeffd_events_received_total", receiver=receiver, kind="BatchSummary") == 2
    assert (
        metric(m, "coeffd_events_received_total", receiver=receiver, kind="JourneyEvent.QUEUED")
        == 1
    )
    assert metric(m, "coeffd_receiver_decode_seconds_count", receiver=receiver) == 2
    assert metric(m, "coeffd_queue_depth") == 0
    engine.shutdown()
    api.shutdown()
