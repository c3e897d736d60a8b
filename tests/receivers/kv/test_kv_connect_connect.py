"""KV events lost without a word when both sides connect (issue 19): the daemon's
connecting subscriber warns once that nothing accepts at its endpoint, and simfleet
refuses to connect to an endpoint nobody listens on, saying how to wire it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from coeffd.receivers.kv import KVSubscriber
from coeffd.simfleet.kv import KVEndpointError, ZmqPublisher, require_listener

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 30.0  # a safety net against hangs, not a timing assertion


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_connecting_subscriber_with_nothing_to_connect_to_warns_once() -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with capture_logs() as logs:
        sub = KVSubscriber(endpoint, "", lambda records: True).start()
        try:
            deadline = time.monotonic() + WAIT_S
            while sub.counts["connect_retries"] < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            sub.stop()
    assert sub.counts["connect_retries"] >= 3 and sub.counts["connected"] == 0
    warned = [e for e in logs if "nothing accepts connections" in e["event"]]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert warned[0]["endpoint"] == endpoint and "kv.bind=true" in warned[0]["event"]


def test_connecting_subscriber_that_meets_a_publisher_does_not_warn() -> None:
    port = _free_port()
    publisher = ZmqPublisher(f"tcp://127.0.0.1:{port}".replace("127.0.0.1", "*"))
    try:
        with capture_logs() as logs:
            sub = KVSubscriber(f"tcp://127.0.0.1:{port}", "", lambda records: True).start()
            try:
                deadline = time.monotonic() + WAIT_S
                while not sub.counts["connected"] and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                sub.stop()
    finally:
        publisher.close()
    assert sub.counts["connected"] >= 1
    assert not [e for e in logs if "nothing accepts" in e["event"]]


def test_simfleet_refuses_to_connect_where_nobody_listens() -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(KVEndpointError, match=r"kv\.bind=true"):
        require_listener(endpoint)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "coeffd", "simfleet", "--scenario", "steady"),
            *("--duration", "5", "--kv-endpoint", endpoint),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "nothing accepts connections" in proc.stderr and "kv.bind=true" in proc.stderr


def test_simfleet_connects_to_a_bound_subscriber() -> None:
    """The simfleet README's wiring: coeffd binds (kv.bind), the engines connect."""
    port = _free_port()
    sub = KVSubscriber(f"tcp://127.0.0.1:{port}", "", lambda records: True, bind=True).start()
    try:
        require_listener(f"tcp://127.0.0.1:{port}")  # does not raise
        ZmqPublisher(f"tcp://127.0.0.1:{port}").close()
    finally:
        sub.stop()
