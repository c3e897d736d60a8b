"""The gRPC receiver's pool occupancy is measured on real requests over a real port."""

from __future__ import annotations

import time

from conftest import make_settings
from opentelemetry.sdk.resources import Resource
from test_sdk_export import exporter
from vllm_spans import emit_engine

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer


def test_requests_occupy_the_pool_while_they_are_handled() -> None:
    settings = make_settings()
    settings.receivers.otlp_grpc.workers = 1  # one request fills the pool
    app = App(settings, consumer=CountingConsumer.keeping())
    app.start()
    try:
        occ = app.grpc_occupancy
        time.sleep(0.2)
        assert occ.full_share() == 0.0  # nothing sent: never full
        provider = emit_engine(exporter(app, "grpc", gzip=False), Resource.create({}))
        assert provider.force_flush(10_000)
        provider.shutdown()
        time.sleep(0.2)
        # the request held the only worker for a while, a small part of the time
        assert 0.0 < occ.full_share() < 0.5
        time.sleep(0.2)
        assert occ.full_share() == 0.0  # and let it go
    finally:
        app.stop()
