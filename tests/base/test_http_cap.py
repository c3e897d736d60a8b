"""The plain HTTP server's connection cap: whom it cuts for a new connection (issue 32).

``bench soak``: a /healthz probe connected just before 300 silent connections arrived on
its port; at the cap (64) it was the connection waiting longest for its request, so it
was cut, and the probe failed with a reset (1 of 1,115 probes)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from coeffd.base.http import BURST, HttpServer, Response, Router
from tests.support.sockets import peek_closed

CAP = 16


def _server(cut_grace: float, cap: int = CAP, speak_grace: float = 0.0) -> HttpServer:
    """``speak_grace`` 0 by default: the tests of whom a burst cuts do not depend on how
    fast this machine connects (their own test sets it)."""
    router = Router()
    router.add_route("GET", "/healthz", lambda _req: Response.text(200, "ok"))
    return HttpServer(
        "127.0.0.1",
        0,
        router,
        max_connections=cap,
        cut_grace=cut_grace,
        speak_grace=speak_grace,
    )


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    out: list[socket.socket] = []
    yield out
    for s in out:
        s.close()


def _connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _waiting(server: HttpServer, n: int) -> None:
    """Until the server has taken ``n`` connections in (a 30 s safety net, not a timing
    assertion): their ages start when the server takes them, not at our connect."""
    for _ in range(3000):
        if server.connections() >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the server took {server.connections()} of {n} connections")


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _healthz(s: socket.socket) -> bytes:
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return s.recv(4096)


def test_a_burst_of_silent_connections_does_not_cut_the_client_just_before_it(
    held: list[socket.socket],
) -> None:
    # a grace far longer than the test can take: which connections count as young does
    # not depend on the machine's speed
    server = _server(cut_grace=600.0)
    server.start()
    try:
        probe = _connect(server)
        held.append(probe)
        _waiting(server, 1)
        for _ in range(3 * CAP):  # silent: never send a byte
            held.append(_connect(server))
        _waiting(server, CAP)
        # the cap was passed 2 * CAP times; the probe, then the longest-waiting one,
        # was cut at the first
        assert _healthz(probe).startswith(b"HTTP/1.1 200"), "the probe was cut"
        # the burst paid for itself: each arrival over the cap cut the one before it, so
        # its first members and its last are kept
        burst = held[1:]
        assert all(_closed_by_server(s) for s in burst[CAP - 2 : -1])
        assert not any(peek_closed(s) for s in (*burst[: CAP - 2], burst[-1]))
    finally:
        server.stop()


def test_connections_past_the_grace_are_cut_first_oldest_first(
    held: list[socket.socket],
) -> None:
    """A connection silent for longer than the grace (an attacker's held one, an idle
    keep-alive) is still cut before any young one, burst or not."""
    server = _server(cut_grace=0.2)
    server.start()
    try:
        old = [_connect(server), _connect(server)]
        held.extend(old)
        _waiting(server, 2)
        time.sleep(0.5)  # both older than the grace: the server took them before this
        burst = [_connect(server) for _ in range(CAP - 2)]  # the cap, all young
        held.extend(burst)
        _waiting(server, CAP)
        newcomer = _connect(server)
        held.append(newcomer)
        assert _closed_by_server(old[0])  # the oldest
        assert _healthz(newcomer).startswith(b"HTTP/1.1 200")
        assert not peek_closed(old[1]) and not any(peek_closed(s) for s in burst)
    finally:
        server.stop()


def test_a_few_young_connections_are_no_burst(held: list[socket.socket]) -> None:
    """Fewer than ``BURST`` young connections: the longest-waiting one is cut, as before
    (a slow trickle of silent connections still cuts its own oldest)."""
    assert BURST > 2
    server = _server(cut_grace=600.0, cap=2)
    server.start()
    try:
        first = _connect(server)
        held.append(first)
        _waiting(server, 1)
        second = _connect(server)
        held.append(second)
        _waiting(server, 2)
        third = _connect(server)
        held.append(third)
        assert _closed_by_server(first)
        assert _healthz(third).startswith(b"HTTP/1.1 200")
        assert not peek_closed(second)
    finally:
        server.stop()


def test_the_newest_of_a_burst_has_time_to_speak(held: list[socket.socket]) -> None:
    """A client accepted amid a flood as soon as it connected has sent nothing yet; as
    the burst's newest it was cut by the next silent arrival. Within ``speak_grace`` the
    arrivals are answered 503 and closed instead, and its request is served."""
    server = _server(cut_grace=600.0, speak_grace=600.0)
    server.start()
    try:
        held.extend(_connect(server) for _ in range(CAP - 1))
        late = _connect(server)  # the newest: not yet written its request
        held.append(late)
        _waiting(server, CAP)
        arrivals = [_connect(server) for _ in range(4)]
        held.extend(arrivals)
        for s in arrivals:
            assert s.recv(4096).startswith(b"HTTP/1.1 503")
        assert _healthz(late).startswith(b"HTTP/1.1 200"), "the newest was cut"
        assert not any(peek_closed(s) for s in held[: CAP - 1])
    finally:
        server.stop()
