"""Plain connections that have sent nothing are held as bare sockets, not handed to
aiohttp, until their first bytes (issue 32): a flood of silent connections then costs the
loop an ``accept`` and a selector entry each, not a protocol object and a task.

Everything else stays as it was: their bytes reach aiohttp whole and in order, they count
for the connection cap, are cut by it and by the request deadline, and a busy cap answers
503."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from coeffd.base.http import BURST, HttpServer, Request, Response, Router, _Manager
from tests.support.sockets import peek_closed


def _router(release: threading.Event | None = None) -> Router:
    router = Router()
    router.add_route("GET", "/healthz", lambda _req: Response.text(200, "ok"))

    def echo(req: Request) -> Response:
        return Response(200, req.body, content_type="application/octet-stream")

    def slow(_req: Request) -> Response:
        assert release is not None
        release.wait(30)
        return Response.text(200, "done")

    router.add_route("POST", "/echo", echo)
    router.add_route("GET", "/slow", slow)
    return router


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[HttpServer]:
    kwargs = getattr(request, "param", {})
    s = HttpServer("127.0.0.1", 0, _router(kwargs.pop("release", None)), **kwargs)
    s.start()
    yield s
    s.stop()


def _manager(server: HttpServer) -> _Manager:
    manager = server._lanes[0].manager
    assert manager is not None
    return manager


def _connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _until(cond: Callable[[], object], what: str) -> None:
    """Until ``cond()`` (a 30 s safety net, not a timing assertion)."""
    for _ in range(3000):
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(what)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        piece = s.recv(65536)
        if not piece:
            return out
        out += piece


def test_a_silent_plain_connection_is_held_not_handed_to_aiohttp(server: HttpServer) -> None:
    manager = _manager(server)
    with _connect(server), _connect(server):
        _until(lambda: len(manager.held) == 2, "the server took the connections")
        assert not manager._connections  # no RequestHandler, no task
        assert not manager.waiting
        assert server.connections() == 2  # they count for the cap all the same


def test_a_request_after_a_held_period_is_served_byte_exact(server: HttpServer) -> None:
    manager = _manager(server)
    payload = bytes(range(256)) * 64 + b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"
    first = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    second = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with _connect(server) as s:
        _until(lambda: len(manager.held) == 1, "the server took the connection")
        time.sleep(0.3)  # held
        s.sendall(first[:1])  # the first byte alone wakes the door
        _until(lambda: not manager.held, "the connection was handed over")
        time.sleep(0.05)
        s.sendall(first[1:] + second)  # the rest, and a pipelined request
        answer = _read_all(s)
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:60]
    assert f"Content-Length: {len(payload)}".encode() in head
    assert rest[: len(payload)] == payload
    assert rest[len(payload) :].startswith(b"HTTP/1.1 200")
    assert rest.endswith(b"ok\n")


@pytest.mark.parametrize("server", [{"idle_timeout": 0.5}], indirect=True)
def test_the_deadline_cuts_a_held_connection(server: HttpServer) -> None:
    manager = _manager(server)
    with _connect(server) as s:
        _until(lambda: len(manager.held) == 1, "the server took the connection")
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(1) == b""
        assert time.monotonic() - started >= 0.3
        _until(lambda: not manager.held and server.connections() == 0, "the socket was dropped")


def test_a_connection_gone_before_its_first_byte_costs_no_handler(server: HttpServer) -> None:
    manager = _manager(server)
    s = _connect(server)
    _until(lambda: len(manager.held) == 1, "the server took the connection")
    s.close()
    _until(lambda: not manager.held, "the closed connection was dropped")
    time.sleep(0.1)
    assert not manager._connections and server.connections() == 0


def test_the_cap_cuts_a_held_connection_and_counts_it() -> None:
    refused: list[tuple[int, str]] = []
    s = HttpServer(
        "127.0.0.1",
        0,
        _router(),
        max_connections=2,
        on_refused=lambda status, reason, _client: refused.append((status, reason)),
    )
    s.start()
    manager = _manager(s)
    try:
        with _connect(s) as first, _connect(s) as second:
            _until(lambda: len(manager.held) == 2, "the server took the connections")
            with _connect(s) as third:
                assert first.recv(1) == b""  # the longest-waiting one
                third.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert _read_all(third).startswith(b"HTTP/1.1 200")
            second.setblocking(False)
            with pytest.raises(BlockingIOError):
                second.recv(1, socket.MSG_PEEK)  # still open, still held
        assert refused == [(503, "idle connection cut for a new one")]
    finally:
        s.stop()


def test_a_cap_of_busy_connections_answers_503() -> None:
    release = threading.Event()
    refused: list[tuple[int, str]] = []
    s = HttpServer(
        "127.0.0.1",
        0,
        _router(release),
        max_connections=1,
        on_refused=lambda status, reason, _client: refused.append((status, reason)),
    )
    s.start()
    manager = _manager(s)
    try:
        with _connect(s) as busy:
            busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _until(lambda: manager._connections and not manager.waiting, "the handler runs")
            with _connect(s) as late:
                assert _read_all(late).startswith(b"HTTP/1.1 503")
            release.set()
            assert _read_all(busy).startswith(b"HTTP/1.1 200")
        assert refused == [(503, "too many connections")]
    finally:
        release.set()
        s.stop()


def test_a_client_that_sent_its_request_amid_a_burst_is_not_its_newest() -> None:
    """The accepts of a burst run before any held socket's reader: a probe that
    connected amid it and sent its request at once is still held when the next silent
    connection passes the cap. Its bytes are there, so it is not silent: it is handed to
    aiohttp, and the burst's newest silent one is cut instead."""
    cap = 16
    s = HttpServer("127.0.0.1", 0, _router(), max_connections=cap, cut_grace=600.0)
    s.start()
    loop = s._lanes[0].loop
    assert loop is not None
    socks: list[socket.socket] = []
    try:
        paused = threading.Event()

        def pause() -> None:
            paused.set()
            time.sleep(1.0)  # the connects below wait in the backlog meanwhile

        loop.call_soon_threadsafe(pause)
        assert paused.wait(30)
        socks += [_connect(s) for _ in range(cap)]  # silent, the cap's worth
        probe = _connect(s)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        socks += [_connect(s) for _ in range(4)]  # more silent ones after it
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            answer = _read_all(probe)
        probe.close()
        assert answer.startswith(b"HTTP/1.1 200"), "the probe was cut"
    finally:
        for c in socks:
            c.close()
        s.stop()


def test_held_connections_over_several_loops_share_one_cap() -> None:
    """With two loops a silent connection held by one is cut by the other's accept (on
    its own loop), the cap holds over both, and a request is still served."""
    cap = 8
    s = HttpServer(
        "127.0.0.1", 0, _router(), max_connections=cap, loops=2, cut_grace=600.0, speak_grace=0.0
    )
    s.start()
    managers = [lane.manager for lane in s._lanes]
    socks: list[socket.socket] = []
    try:
        socks += [_connect(s) for _ in range(5 * cap)]
        _until(lambda: s.connections() <= cap + 1, "the cap held")  # one per loop in flight
        time.sleep(0.2)
        assert s.connections() <= cap
        assert all(m is not None and not m._connections for m in managers)  # all held
        open_ = [c for c in socks if not peek_closed(c)]
        assert len(open_) == s.connections()
        with _connect(s) as probe:
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _read_all(probe).startswith(b"HTTP/1.1 200")
    finally:
        for c in socks:
            c.close()
        s.stop()


@pytest.mark.parametrize("server", [{"idle_timeout": 1.5}], indirect=True)
def test_a_handed_over_connection_keeps_the_deadline_of_its_accept(server: HttpServer) -> None:
    """Held, then the start of a request that never ends: the request deadline still
    runs from the accept, as it did when aiohttp took every connection at once."""
    manager = _manager(server)
    with _connect(server) as s:
        _until(lambda: len(manager.held) == 1, "the server took the connection")
        started = time.monotonic()
        time.sleep(0.8)
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished
        _until(lambda: not manager.held, "the connection was handed over")
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(1) == b""
        # cut near 1.5 s after the accept; from the hand-over it would be 2.3 s or more
        assert time.monotonic() - started < 2.2


def _blocked(loop: asyncio.AbstractEventLoop) -> threading.Event:
    """Block ``loop`` (a callback that waits) until the returned event is set."""
    running, release = threading.Event(), threading.Event()

    def block() -> None:
        running.set()
        release.wait(30)

    loop.call_soon_threadsafe(block)
    assert running.wait(30)
    return release


def test_a_held_socket_of_another_loop_with_bytes_waiting_is_not_cut_as_silent() -> None:
    """The cap's victim is chosen over every loop. A held socket of a busy loop whose
    request has arrived, unread, is no more silent than one of the accepting loop's:
    it is handed to aiohttp, and the burst's newest silent one is cut instead (the
    cross-loop cut had closed it unpeeked, and the client's request was reset)."""
    cap = BURST + 2
    s = HttpServer(
        "127.0.0.1", 0, _router(), max_connections=cap, loops=2, cut_grace=600.0, speak_grace=0.0
    )
    s.start()
    loops = [lane.loop for lane in s._lanes if lane.loop is not None]
    managers = [lane.manager for lane in s._lanes if lane.manager is not None]
    assert len(loops) == len(managers) == 2
    socks: list[socket.socket] = []
    releases: list[threading.Event] = []
    try:
        releases.append(_blocked(loops[1]))  # loop 0 accepts the first cap's worth
        socks += [_connect(s) for _ in range(cap - 1)]
        probe = _connect(s)  # the newest held one
        _until(lambda: s.connections() == cap, "loop 0 took the connections")
        releases.append(_blocked(loops[0]))
        releases[0].set()  # now loop 1 accepts, loop 0 reads nothing
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.05)  # the request is in the probe's socket buffer, on loop 0
        socks.append(_connect(s))  # over the cap, accepted by loop 1
        _until(lambda: len(managers[1].held) == 1, "loop 1 took the newcomer")
        releases[1].set()
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            answer = _read_all(probe)
        probe.close()
        assert answer.startswith(b"HTTP/1.1 200"), "the probe was cut"
        # the newest silent one paid for the newcomer, the rest are open
        _until(lambda: peek_closed(socks[cap - 2]), "the newest silent one was cut")
        assert not any(peek_closed(c) for c in (*socks[: cap - 2], socks[-1]))
        assert s.connections() <= cap
    finally:
        for r in releases:
            r.set()
        for c in socks:
            c.close()
        s.stop()
