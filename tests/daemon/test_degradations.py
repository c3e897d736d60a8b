"""Silent degradations get a metric and a readiness effect (issue 17.8): failed checkpoint
and snapshot writes, and a KV publisher that cannot be reached. Real App, real HTTP probes
and scrapes (prometheus-client's parser), real files and real ZMQ sockets."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import zmq
from daemon_support import fleet_requests
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.app import App
from coeffd.daemon.assemble import build_app
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.settings import load_settings
from coeffd.learners.features.config import ServingConfig
from coeffd.receivers.otlp.decode import Decoder

WAIT_S = 60.0  # a safety net against hangs, not a timing assertion


def _wait(cond: Any) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def _get(app: App, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http_port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metric(app: App, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(_get(app, "/metrics")[1]):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _app(tmp: Path, **overrides: Any) -> App:
    base: dict[str, Any] = {
        "http": {"endpoint": "127.0.0.1:0"},
        "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
        "publish": {"snapshot_dir": str(tmp / "snap"), "min_observations": 1},
        "state": {"state_dir": str(tmp / "state")},
    }
    return build_app(load_settings(overrides=base | overrides, environ={}))


def test_failed_checkpoint_and_snapshot_writes(tmp_path: Path) -> None:
    # 40 s: request observations leave the joiner joiner.loop_wait_delay_s (10 s) after QUEUED
    requests = fleet_requests("steady", 40)
    decoder = Decoder()
    batches = [decoder.decode_bytes(r.SerializeToString()).records for r in requests]
    source = next(r.span.source for b in batches for r in b if hasattr(r, "span"))
    cid = ServingConfig.from_resource(source).id
    # Where the state dir and this configuration's snapshot folder would be: files.
    (tmp_path / "state").write_text("not a directory")
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / cid).write_text("not a directory")
    with _app(tmp_path) as app:
        consumer = app.consumer
        assert isinstance(consumer, LearningConsumer)
        assert _get(app, "/readyz") == (200, "ready\n")
        for b in batches:
            assert app.offer(b, "test")
        assert app.pipeline.wait_idle(WAIT_S)
        app.pause()  # the worker is idle: this thread may drive the consumer now
        consumer.publish_due(time.time(), force=True)
        consumer.checkpoint()
        assert consumer.writer.flush(WAIT_S)
        status, body = _get(app, "/readyz")
        assert status == 503
        assert "checkpoints: last checkpoint write failed:" in body
        assert "snapshots: snapshot writes failing for 1 configuration(s):" in body
        # the probe is public: it names what fails, never where (issue 32, item 7)
        assert str(tmp_path) not in body and "'<path>'" in body
        assert _metric(app, "coeffd_checkpoint_failures_total") == 1
        assert _metric(app, "coeffd_snapshot_write_failures_total", config=cid) == 1
        # a write failure is not a refusal of an invalid vector
        assert not _metric(app, "coeffd_snapshot_refused_total", config=cid)
        # the disk is back: the next writes work and readiness recovers
        (tmp_path / "state").unlink()
        (tmp_path / "snap" / cid).unlink()
        consumer.checkpoint()  # checkpoints come on their cadence; the writer retries snapshots
        assert _wait(lambda: _get(app, "/readyz") == (200, "ready\n"))
        assert (tmp_path / "state" / "checkpoint.bin").is_file()
        assert (tmp_path / "snap" / cid / "latest.json").is_file()
        app.resume()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_kv_publisher(tmp_path: Path) -> None:
    """KV is optional: a publisher not (yet) there is a metric and an alert, never a
    readiness failure (issue 32, item 10: a fleet replica whose engines had not bound
    their KV socket dropped out of the Service, and out of the Collector's routing)."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with _app(tmp_path, kv={"endpoints": [endpoint]}) as app:
        # nothing listens there: attempts fail, gauge 0, still ready
        sub = app._kv[0]
        assert _wait(lambda: sub.connect_failures > 0)
        assert _metric(app, "coeffd_kv_connected", endpoint=endpoint) == 0
        assert _get(app, "/readyz") == (200, "ready\n")
        # the publisher comes up: connected
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(endpoint)
        try:
            assert _wait(lambda: _metric(app, "coeffd_kv_connected", endpoint=endpoint) == 1)
        finally:
            pub.close()
        # and it goes away again: the gauge says so, readiness does not change
        assert _wait(lambda: _metric(app, "coeffd_kv_connected", endpoint=endpoint) == 0)
        assert _get(app, "/readyz") == (200, "ready\n")
