"""Pipeline worker and App wiring: ticks, consumer failures, several apps, routes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from coeffd.base.http import Request, Response
from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer, Pipeline
from coeffd.daemon.settings import Settings
from coeffd.receivers.metrics import ReceiverMetrics


def _wait(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


class Flaky(CountingConsumer):
    """Raises on the first batch; must not stop the worker."""

    def consume(self, records: Sequence[Any]) -> None:
        if self.batches == 0:
            self.batches += 1
            raise RuntimeError("boom")
        super().consume(records)


def test_ticks_when_idle_and_consumer_errors_do_not_stop_the_worker() -> None:
    registry = CollectorRegistry()
    c = Flaky()
    p = Pipeline(c, capacity=10, metrics=ReceiverMetrics(registry), tick_interval=0.02)
    p.start()
    assert _wait(lambda: c.ticks >= 2)  # no records at all, still ticking
    assert p.offer([1, 2], "t") and p.offer([3], "t")
    assert p.wait_idle(5)
    assert c.total == 1  # first batch raised and was skipped, second consumed
    assert (
        registry.get_sample_value("coeffd_pipeline_consumer_errors_total", {"stage": "consume"})
        == 1
    )
    assert (
        registry.get_sample_value("coeffd_events_received_total", {"receiver": "t", "kind": "int"})
        == 3
    )
    assert p.close(1.0) and c.closed and not p.alive
    assert not p.offer([4], "t")  # closed: refused


def test_oversize_batch_accepted_only_into_an_empty_queue() -> None:
    p = Pipeline(CountingConsumer(), capacity=2)
    assert p.offer([1, 2, 3, 4], "t")  # alone it could never fit; accept rather than livelock
    assert not p.offer([5], "t")
    assert p.depth == 4


def test_close_drops_after_drain_timeout_when_consumer_is_stuck() -> None:
    class Slow(CountingConsumer):
        def consume(self, records: Sequence[Any]) -> None:
            time.sleep(0.3)
            super().consume(records)

    c = Slow()
    p = Pipeline(c, capacity=100)
    p.start()
    for i in range(5):
        assert p.offer([i], "t")
    assert p.close(drain_timeout=0.1) is False
    assert c.closed and c.total < 5


def test_two_apps_in_one_process_with_own_registries_and_mounted_routes() -> None:
    def settings() -> Settings:
        return Settings.model_validate(
            {
                "receivers": {
                    "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                    "otlp_http": {"endpoint": "127.0.0.1:0"},
                },
                "http": {"endpoint": "127.0.0.1:0"},
            }
        )

    with App(settings()) as a, App(settings()) as b:
        a.router.add_route(
            "GET", "/v1/", lambda req: Response.text(200, "api:" + req.path), prefix=True
        )
        placeholder: Any = object()
        assert a.offer([placeholder], "t")
        assert a.pipeline.wait_idle(5)
        url = f"http://127.0.0.1:{a.http_port}/v1/coefficients/x"
        assert urllib.request.urlopen(url, timeout=5).read() == b"api:/v1/coefficients/x\n"
        ma = urllib.request.urlopen(f"http://127.0.0.1:{a.http_port}/metrics", timeout=5).read()
        mb = urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/metrics", timeout=5).read()
        assert b'coeffd_events_received_total{kind="object",receiver="t"} 1.0' in ma
        assert b'receiver="t"' not in mb
        assert a.registry is not b.registry and a.grpc_port != b.grpc_port
    assert not a.ready and not b.ready


def test_request_helpers() -> None:
    from email.message import Message

    m = Message()
    m["Content-Type"] = "application/json"
    r = Request("GET", "/x", {}, m, b"")
    assert r.header("content-type") == "application/json" and r.header("X-Nope", "d") == "d"


def test_bind_failure_raises_and_cleans_up() -> None:
    import socket

    import pytest

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        app = App(
            Settings.model_validate(
                {
                    "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
                    "http": {"endpoint": f"127.0.0.1:{port}"},
                }
            )
        )
        with pytest.raises(OSError):
            app.start()
    assert not app.ready and app.pipeline.closed and not app.pipeline.alive
