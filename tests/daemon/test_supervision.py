"""A dead worker thread fails /readyz (naming it), is restarted by the supervisor and
counted in coeffd_thread_restarts_total (issue 17.2): real App, real HTTP probes, real
ZMQ sockets."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.app import App
from coeffd.daemon.settings import Settings
from coeffd.daemon.supervise import Supervisor
from coeffd.receivers.kv import KVSubscriber

WAIT_S = 30.0  # safety net against hangs, not a timing assertion


class Fatal(BaseException):
    """Escapes every ``except Exception``: what kills a worker thread."""


# These tests kill a thread on purpose (threading reports it, pytest turns that into a
# warning); anywhere else that warning is a real failure to look at.
_KILLS_A_THREAD = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


class DiesOnce:
    """A consumer whose first batch kills the pipeline worker; counts the rest."""

    def __init__(self) -> None:
        self.died = False
        self.consumed = 0

    def consume(self, records: Sequence[Any]) -> None:
        if not self.died:
            self.died = True
            raise Fatal
        self.consumed += len(records)

    def tick(self, now: float) -> None:
        pass

    def close(self) -> None:
        pass


def _get(app: App, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http_port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _restarts(app: App, thread: str) -> float:
    _, text = _get(app, "/metrics")
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "coeffd_thread_restarts_total" and s.labels == {"thread": thread}:
                return s.value
    raise AssertionError("coeffd_thread_restarts_total missing")


def _wait(pred: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


@_KILLS_A_THREAD
def test_dead_pipeline_worker_fails_readyz_and_is_restarted() -> None:
    settings = Settings.model_validate(
        {
            "receivers": {
                "otlp_grpc": {"enabled": False},
                "otlp_http": {"enabled": False},
            },
            "http": {"endpoint": "127.0.0.1:0"},
            "state": {"state_dir": ""},
        }
    )
    consumer = DiesOnce()
    app = App(settings, consumer=consumer)
    app.supervisor.interval = 3600.0  # checked by hand below, so the dead state is seen
    with app:
        assert _get(app, "/readyz")[0] == 200
        assert app.offer([1, 2], "test")
        _wait(lambda: not app.pipeline.alive)
        status, text = _get(app, "/readyz")
        assert status == 503 and "pipeline" in text
        assert app.supervisor.check() == ["pipeline"]
        assert _get(app, "/readyz")[0] == 200
        assert _restarts(app, "pipeline") == 1
        assert app.offer([3, 4, 5], "test")
        _wait(lambda: consumer.consumed == 3)


@_KILLS_A_THREAD
def test_dead_kv_subscriber_is_restarted_and_receives_again() -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    got: list[int] = []
    cond = threading.Condition()
    kill = threading.Event()

    def offer(records: list[Any]) -> bool:
        if kill.is_set():
            kill.clear()
            raise Fatal
        with cond:
            got.extend(r.batch.seq for r in records)
            cond.notify_all()
        return True

    def publish_until(seq_from: int) -> int:
        seq = seq_from
        deadline = time.monotonic() + WAIT_S
        with cond:
            while not any(s >= seq_from for s in got):
                assert time.monotonic() < deadline, "no batch arrived"
                payload = msgspec.msgpack.encode([1767225600.0 + seq, [["AllBlocksCleared"]], 0])
                pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
                seq += 1
                cond.wait(0.05)
        return seq

    registry = CollectorRegistry()
    sup = Supervisor(registry, interval=3600.0)
    sub = KVSubscriber(f"tcp://127.0.0.1:{port}", "", offer)
    try:
        sub.start()
        sup.watch("kv", lambda: sub.alive, sub.restart)
        seq = publish_until(0)
        kill.set()
        deadline = time.monotonic() + WAIT_S
        while sub.alive:  # the next batch kills the thread
            assert time.monotonic() < deadline, "the subscriber never died"
            payload = msgspec.msgpack.encode([1767225600.0 + seq, [["AllBlocksCleared"]], 0])
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
            seq += 1
            time.sleep(0.01)
        assert sup.readiness() is not None and "kv" in str(sup.readiness())
        assert sup.check() == ["kv"] and sub.alive
        publish_until(seq + 1000)
        assert sup.readiness() is None
        assert registry.get_sample_value("coeffd_thread_restarts_total", {"thread": "kv"}) == 1
    finally:
        sub.stop()
        pub.close()
