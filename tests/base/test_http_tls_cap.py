"""The connection cap over several loops with TLS (issue 32): a TLS connection is
admitted when its handshake ends, on whichever loop ran it, and several loops admitting
at once must not pass the cap between one's check and its admission, nor give the slot
of one victim to two newcomers."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coeffd.base.http import HttpServer, Response, Router
from tests.receivers.tls_certs import Certs, make_certs

CAP = 4
LOOPS = 4
#: clients handshaking at once: under the pending handshakes' cap (4 per slot), which
#: would otherwise cut some before the connection cap sees them
WAVE = 12
WAVES = 4


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every 10 us instead of 5 ms: the loops interleave mid-admission
    as they would on more cores."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def _server(certs: Certs, cut: list[str]) -> HttpServer:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    router = Router()
    router.add_route("GET", "/healthz", lambda _req: Response.text(200, "ok"))
    return HttpServer(
        "127.0.0.1",
        0,
        router,
        ssl_context=ctx,
        max_connections=CAP,
        loops=LOOPS,
        idle_timeout=None,
        on_refused=lambda _status, reason, _client: cut.append(reason),
    )


def _open_on_server(server: HttpServer) -> int:
    """Connections aiohttp still has open, over every loop."""
    return sum(len(lane.manager._connections) for lane in server._lanes if lane.manager)


def test_concurrent_tls_admissions_never_pass_the_cap(certs: Certs, fast_switching: None) -> None:
    cut: list[str] = []
    server = _server(certs, cut)
    server.start()
    ctx = ssl.create_default_context(cafile=str(Path(certs.ca)))
    clients: list[ssl.SSLSocket] = []
    lock = threading.Lock()
    start = threading.Barrier(WAVE)
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(server.connections())

    def client() -> None:
        start.wait(30)
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        try:
            tls = ctx.wrap_socket(raw, server_hostname="localhost")
        except OSError:  # cut during its handshake's last steps: counted all the same
            raw.close()
            return
        with lock:
            clients.append(tls)

    watcher = threading.Thread(target=watch)
    try:
        watcher.start()
        for _ in range(WAVES):
            threads = [threading.Thread(target=client) for _ in range(WAVE)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        time.sleep(0.5)  # the last handshakes' ends were admitted, the cuts' closes ran
        done.set()
        watcher.join(10)
        # the cap was reached and passed for most of them: every one cut another
        assert len(cut) >= WAVE * WAVES // 2, (len(cut), len(clients))
        assert max(seen) <= CAP, f"the cap of {CAP} was passed: {max(seen)}"
        assert server.connections() == _open_on_server(server) <= CAP
    finally:
        done.set()
        for c in clients:
            c.close()
        server.stop()
