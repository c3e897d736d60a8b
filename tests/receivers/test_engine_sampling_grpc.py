"""Engine sampling at the receiver, end to end: vLLM's own SDK exporter sends two engines'
spans over real gRPC; the app's decoder, consulting an engine sampler at share 1/2,
decodes the kept engine's and counts the other's, as scraped from /metrics."""

from __future__ import annotations

import time

from conftest import make_settings, metric, scrape
from opentelemetry.sdk.resources import Resource
from test_sdk_export import exporter
from vllm_spans import emit_engine

from coeffd.daemon.app import App
from coeffd.daemon.load.sampling import EngineSampler, engine_hash
from coeffd.daemon.pipeline import CountingConsumer

_HALF = 1 << 31


def _engines() -> tuple[str, str]:
    """Two engine names of one configuration: the lower-hash one holds the floor (kept
    whatever the share), the other hashes above 1/2 (dropped at share 1/2)."""
    names = sorted((f"pod-{i}" for i in range(50)), key=engine_hash)
    low = names[0]
    high = next(n for n in names[1:] if engine_hash(n) >= _HALF)
    return low, high


def _wait(pred: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_sampled_out_engine_is_counted_not_decoded() -> None:
    clock = [0.0]
    sampler = EngineSampler(min_engines=1, clock=lambda: clock[0], cpu_clock=lambda: 0.0)
    clock[0] = 2.0
    assert sampler.update(0.9, 1 / 32) == 0.5
    consumer = CountingConsumer.keeping()
    app = App(make_settings(), consumer=consumer)
    app.decoder.source_filter = sampler.keep
    app.start()
    try:
        kept, dropped = _engines()
        attrs = {"coeffd.model": "meta-llama/Llama-3.1-8B-Instruct", "coeffd.gpu": "H100"}
        # the kept engine first: its spans register it as its configuration's floor
        for name in (kept, dropped):
            provider = emit_engine(
                exporter(app, "grpc", gzip=False),
                Resource.create({**attrs, "coeffd.engine": name}),
            )
            assert provider.force_flush(10_000)
            provider.shutdown()
        _wait(
            lambda: (
                metric(
                    scrape(app),
                    "coeffd_receiver_requests_total",
                    receiver="otlp_grpc",
                    outcome="ok",
                )
                >= 2
            )
        )
        m = scrape(app)
        assert consumer.records is not None
        engines = {r.span.source.get("coeffd.engine") for r in consumer.records}
        assert engines == {kept}
        # the dropped engine sent what the kept one did: every span and event of it is
        # counted as sampled out, none as received, ignored or rejected
        decoded = len(consumer.records) + metric(
            m, "coeffd_events_ignored_total", receiver="otlp_grpc"
        )
        out = metric(m, "coeffd_events_sampled_out_total", receiver="otlp_grpc")
        assert out == decoded > 0
        assert sampler.engines() == (1, 2)
    finally:
        app.stop()
