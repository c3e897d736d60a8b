"""The HTTP server of the OTLP/HTTP receiver and of the daemon's listener (``/metrics``,
probes, API), with a router; down here where both can use it.

HTTP/1.1 framing is aiohttp's (its llhttp parser: strict ``Transfer-Encoding`` and
``Content-Length``, chunk sizes checked; keep-alive; bodies streamed under flow control),
served by an asyncio loop in a background thread. What stays here is what coeffd decides:

* bodies are read in bounded pieces and refused with 413 as soon as they pass
  ``max_body_bytes`` (Content-Length: before reading any of it), so a connection holds at
  most one limit's worth whatever the chunking;
* a chunked body is refused with 413 past ``max(MIN_CHUNKS, max_body_bytes //
  MIN_CHUNK)`` chunks (16,384 at 16 MiB), counted as llhttp parses them, and its
  connection is then neither read nor drained: aiohttp calls Python per chunk, and 8 MiB
  of 2-byte chunks cost the loop ~5 s of CPU; now the bound plus one read's parse at most
  (aiohttp pauses after 16,384 unread chunks, ~20 ms). ``bench dos --part http``
  2026-11-29: two such bodies answered 413 after 3-5 MiB sent, not 200 after ~21 s, peak
  RSS 98-104 MB instead of 129-136;
* the TLS handshake runs per connection with a deadline, outside the connection cap: a
  client that never starts it costs a socket until it times out, cannot take a slot a
  probe needs and delays no one's handshake (:mod:`coeffd.base.tlsdoor`);
* a plain connection that has sent nothing is held as a bare socket (a selector entry,
  no aiohttp protocol or task) until its first bytes, which aiohttp then reads as sent:
  it counts for the cap and the request deadline from its accept like any connection
  waiting for its request, but a flood of silent ones costs the loop an ``accept`` and a
  selector entry each (a burst of 600: 16-18 ms of loop CPU at a cap of 1024); at a cap
  of 64 the cut for each new one costs no more: the victim's choice is O(1) (held
  sockets in accept order), the ones a burst cuts again at once never enter the
  selector, and cut sockets are closed on a thread of their own (16-17 ms for 600);
* at ``max_connections`` a connection still waiting for its request is cut for the new
  one — the one waiting longest, except during a burst of new silent connections, which
  then loses its own newest (:meth:`HttpServer.victim`) — or, while that one is younger
  than ``SPEAK_GRACE`` (time to send its request), the silent new arrival itself, with
  a 503; only when every connection is busy is the new one answered 503. Choosing,
  cutting and admitting are one step under a lock over every loop
  (:meth:`HttpServer.admit`): the cap is never passed, and a held socket whose request
  has arrived is not cut as silent whichever loop holds it;
* the token / client-certificate :class:`~coeffd.base.security.Gate` runs before a body
  is read, and refusals are shaped by ``error_response`` (OTLP/HTTP: ``google.rpc.Status``).

Handlers are plain functions ``(Request) -> Response`` run on a small thread pool (or on
the loop with ``inline_handlers``, for handlers that never block); routes are exact
paths or prefixes, so the API mounts ``/v1/...`` routes with :meth:`Router.add_route`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import operator
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import structlog
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from coeffd.base.tlsdoor import CLOSER, Acceptor, TlsDoor

if TYPE_CHECKING:
    from coeffd.base.security import Gate

__all__ = ["Handler", "HttpServer", "Request", "Response", "Router"]

log = structlog.get_logger(__name__)

#: Seconds a client gets from its connect to the end of its TLS handshake; until then it
#: holds no slot of ``max_connections`` (only one of the pending handshakes, at most
#: ``PENDING_HANDSHAKES_PER_SLOT`` times that cap, the oldest silent one cut first).
TLS_HANDSHAKE_TIMEOUT = 10.0
PENDING_HANDSHAKES_PER_SLOT = 4
#: Bytes read from a body at a time (and aiohttp's read buffer: flow control pauses the
#: socket at twice this, or at this / 16 chunks however small they are). 64 KiB cost
#: 2.4x the server CPU of a 200 KB request (pause/resume), 256 KiB 1.2x the old server.
READ_PIECE = 256 * 1024
#: Seconds and bytes a refused body is still read and dropped, so a client that writes
#: its whole body before reading sees the 413 instead of a reset.
DRAIN_SECONDS = 2.0
#: Decoded bytes per chunk a chunked body gets on average: it may have at most
#: ``max(MIN_CHUNKS, max_body_bytes // MIN_CHUNK)`` chunks, past which it is refused and
#: its connection closed unparsed. aiohttp calls into Python three times per chunk (1.2 us
#: a chunk here): 2-byte chunks cost ~0.6 s of loop CPU per MiB of body, while at 1 KiB a
#: chunk the framing of a body at the limit costs ~1.2 ms per MiB, less than decoding it.
#: Real clients stay well above 1 KiB: OTLP exporters send Content-Length bodies, and
#: streaming clients write chunks of 4 KiB (Java's default) to 64 KiB (Go's ``io.Copy``
#: 32 KiB, curl, urllib3's 16 KiB file blocks); only ``requests``/``urllib3`` fed a
#: generator of small pieces (one chunk each) could exceed the bound, and only with more
#: than ``MIN_CHUNKS`` of them. The answer is 413, as for ``max_body_bytes``: the body is
#: refused for what it would cost, its framing is valid (400 is for broken framing);
#: OTLP/HTTP exporters do not retry it, and the receivers count it with the body-size
#: refusals.
MIN_CHUNK = 1024
MIN_CHUNKS = 64
#: How often connections overdue for their request are looked for.
REAP_INTERVAL = 0.25
#: Seconds a new connection is "young" for the connection cap, and how many young silent
#: connections make a burst: during a burst the cap cuts the newest young one instead of
#: the one waiting longest. Without it a client that connected just before 300 silent
#: connections arrived was the longest-waiting one when the cap was reached (its request
#: not yet sent or not yet read) and was reset (1 of 1,115 probes in ``bench soak``).
CUT_GRACE = 1.0
BURST = 8
#: Seconds the newest connection of a burst has to send its first bytes before the burst
#: cuts it: until then a new silent connection past the cap is closed itself instead.
#: A probe accepted amid a flood as soon as it connected (the loop keeps up) was cut by
#: the next silent arrival before its request was written (3 of 21 floods of 600 at a
#: cap of 64, each with one reset probe).
SPEAK_GRACE = 0.05


@dataclass(slots=True)
class Request:
    """One parsed HTTP request; ``body`` is already read (bounded by the server)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    client: str = ""

    def header(self, name: str, default: str = "") -> str:
        """Case-insensitive header lookup."""
        v = self.headers.get(name)
        return default if v is None else str(v)


@dataclass(slots=True)
class Response:
    """What a handler returns."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, status: int, text: str, headers: Mapping[str, str] | None = None) -> Response:
        """A ``text/plain`` response (a trailing newline is added)."""
        return cls(status, (text + "\n").encode(), headers=dict(headers or {}))


Handler = Callable[[Request], Response]


class Router:
    """Maps (method, path) to a handler: exact paths first, then the longest prefix.

    >>> r = Router()
    >>> r.add_route("GET", "/healthz", lambda req: Response.text(200, "ok"))
    >>> r.add_route("GET", "/v1/", lambda req: Response.text(200, "api"), prefix=True)
    >>> r.resolve("GET", "/v1/coefficients/x")[0] is not None
    True
    >>> r.resolve("POST", "/healthz")
    (None, ['GET'])
    """

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._prefix: list[tuple[str, dict[str, Handler]]] = []
        self._inline: set[Handler] = set()
        self._lock = threading.Lock()

    def add_route(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        prefix: bool = False,
        inline: bool = False,
    ) -> None:
        """Register ``handler``; ``prefix=True`` matches every path starting with ``path``.

        ``inline=True``: the handler runs on the server's loop, not its thread pool — for
        handlers that only read a flag (``/healthz``): a probe then needs no hand-off to a
        pool thread and back, each of which waits for the GIL behind busy threads.
        """
        method = method.upper()
        with self._lock:
            if inline:
                self._inline.add(handler)
            if not prefix:
                self._exact.setdefault(path, {})[method] = handler
                return
            for p, methods in self._prefix:
                if p == path:
                    methods[method] = handler
                    return
            self._prefix.append((path, {method: handler}))
            self._prefix.sort(key=lambda t: len(t[0]), reverse=True)

    def resolve(self, method: str, path: str) -> tuple[Handler | None, list[str]]:
        """Return (handler or None, the methods allowed on that path)."""
        methods = self._exact.get(path)
        if methods is None:
            for p, m in self._prefix:
                if path.startswith(p):
                    methods = m
                    break
        if methods is None:
            return None, []
        h = methods.get(method.upper())
        if h is None and method.upper() == "HEAD":
            h = methods.get("GET")
        return h, sorted(methods)

    def inline(self, handler: Handler) -> bool:
        """Whether ``handler`` was registered to run on the loop (``add_route(inline=True)``)."""
        return handler in self._inline


class _Refused(Exception):
    """A request answered before its handler ran (``response`` says how)."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__()
        self.response = response


#: aiohttp's parsing of what a connection received (called without ``super()``'s cost)
_data_received = RequestHandler.data_received


class _ChunkFlood(Exception):
    """A chunked body past its chunk bound (:data:`MIN_CHUNK`), set on its stream."""


class _Protocol(RequestHandler):
    """aiohttp's connection handler; its framing errors (bad chunk sizes, conflicting
    lengths, unknown transfer codings) are counted and answered in our shape, and the
    chunks of a chunked body are counted as they are parsed (:meth:`data_received`)."""

    def __init__(self, owner: HttpServer, manager: _Manager, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._owner = owner
        self.lane = manager
        #: when a plain connection held silent was accepted (None: not held)
        self.accepted: float | None = None
        #: holds a slot of the cap (False once cut for a newcomer: the slot is its)
        self.counted = False
        #: the body being read (:meth:`HttpServer._body`), its chunks so far, their bound
        self._body: StreamReader | None = None
        self._chunks = 0
        self._max_chunks = owner.max_body_chunks

    def count_chunks(self, body: StreamReader | None) -> None:
        """Count the chunks of ``body`` from now until it is read (None: stop), those
        parsed before included: nothing of it is read yet, so its stream still holds one
        position per chunk (``_http_chunk_splits``)."""
        self._body = body
        self._chunks = 0
        if body is not None and body._http_chunk_splits:
            self._chunks = len(body._http_chunk_splits)
            if self._chunks > self._max_chunks:
                self._flood(body)

    def data_received(self, data: bytes) -> None:
        """aiohttp's parsing, counting the chunks of the body being read: llhttp appends
        one stream position per chunk while it parses, and none is taken before this
        returns (the body is read by another task). The check comes after one read's
        parse, which aiohttp's own flow control ends after ``READ_PIECE // 16`` chunks
        (16,384: ~20 ms of CPU), as it ends the parse before the body is read.
        No ``super()`` call, and nothing more for a connection not reading a chunked
        body: this runs once per read."""
        body = self._body
        if body is None:
            _data_received(self, data)
            return
        splits = body._http_chunk_splits
        before = len(splits) if splits else 0
        _data_received(self, data)
        splits = body._http_chunk_splits
        if splits:
            n = self._chunks = self._chunks + len(splits) - before
            if n > self._max_chunks:
                self._flood(body)

    def _flood(self, body: StreamReader) -> None:
        """Past the bound: the reader gets :class:`_ChunkFlood` (413); aiohttp parses
        nothing more (``close``) nor reads on after the answer (its lingering), and the
        socket is no longer read."""
        self._body = None
        self.close()
        self._lingering_time = 0.0
        if self.transport is not None:
            self.transport.pause_reading()
        body.set_exception(_ChunkFlood(f"body in more than {self._max_chunks} chunks"))

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        owner = self._owner
        if status >= 500 and not isinstance(exc, _Refused):
            log.warning("http request failed", listener=owner.name, error=repr(exc))
        reason = (message or (str(exc) if exc is not None else "") or "bad request")[:200]
        if status < 500:
            owner.refused(status, f"malformed request: {reason}", request.remote or "")
        ctype = ""
        with contextlib.suppress(Exception):
            ctype = request.headers.get("Content-Type", "")
        resp = owner.error(status, "malformed request" if status < 500 else "internal error", ctype)
        resp.force_close()
        return resp


class _Manager(web.Server):
    """aiohttp's low-level server (the protocol factory) of one loop, plus the cap's and
    the request deadline's bookkeeping of its connections.

    Plain (non-TLS) connections are accepted here, not by ``loop.create_server``: one
    that has sent nothing yet is held as a bare socket (a selector entry and a dict
    entry, no protocol, no task) and handed to aiohttp when its first bytes arrive —
    which stay in the kernel's buffer, so nothing is lost or reordered. Held sockets
    count for the cap, are candidates of :meth:`HttpServer.victim` with their accept time
    and are cut at the same deadline as a connection waiting for its request.

    ``held``, ``waiting`` (inserts) and ``slots`` change only under the server's
    ``lock``: another loop's accept may cut one of them for its newcomer, and a held
    socket is closed only by this loop after leaving ``held`` — so under the lock a held
    socket of any loop is still open and may be peeked at."""

    def __init__(self, owner: HttpServer, **kwargs: Any) -> None:
        super().__init__(owner.dispatch, **kwargs)
        self.owner = owner
        #: connections waiting for (or still reading) a request → since when
        self.waiting: dict[_Protocol, float] = {}
        #: silent plain connections not handed to aiohttp yet → accepted at; insertion
        #: order is accept order, so the oldest is the first and the newest the last
        self.held: dict[socket.socket, float] = {}
        #: connections of this loop that hold a slot of the cap: held, waiting, busy, and
        #: those on their way from ``held`` to aiohttp
        self.slots = 0
        #: accepted in the current batch: their readers are added once the batch is
        #: done, so that the ones a burst cuts again at once never enter the selector
        self._fresh: set[socket.socket] = set()
        #: sockets cut during the current batch, closed together after it (None: no
        #: batch running, a cut socket is closed at once)
        self._doomed: list[socket.socket] | None = None

    def __call__(self) -> _Protocol:
        return _Protocol(self.owner, self, loop=self._loop, **self._kwargs)

    def ends(self) -> tuple[int, tuple[float, Conn] | None, tuple[float, Conn] | None]:
        """(candidates, (since, oldest), (since, newest)) of the cap here (under the lock).

        Held sockets are in accept order: their ends cost nothing however many a flood
        holds. Waiting connections are not (one handed over from ``held`` keeps its
        accept time), so they are scanned, by ``min`` and ``max`` in C."""
        held, waiting = self.held, self.waiting
        lo: tuple[float, Conn] | None = None
        hi: tuple[float, Conn] | None = None
        if held:
            first = next(iter(held))
            last = next(reversed(held))
            lo, hi = (held[first], first), (held[last], last)
        if waiting:
            w_lo = min(waiting.items(), key=_since)
            w_hi = max(waiting.items(), key=_since)
            if lo is None or w_lo[1] < lo[0]:
                lo = (w_lo[1], w_lo[0])
            if hi is None or w_hi[1] > hi[0]:
                hi = (w_hi[1], w_hi[0])
        return len(held) + len(waiting), lo, hi

    def on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this manager's loop (from another loop's thread)."""
        with contextlib.suppress(RuntimeError):  # that loop is closing
            self._loop.call_soon_threadsafe(fn)

    def _drop(self, sock: socket.socket) -> None:
        """Close a socket that left ``held`` (on the loop)."""
        if sock in self._fresh:
            self._fresh.discard(sock)  # never watched: no selector entry to remove
        else:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
        if self._doomed is None:
            CLOSER.close([sock])
        else:
            self._doomed.append(sock)

    def _abort(self, handler: _Protocol) -> None:
        """Close a connection handed to aiohttp (on the loop)."""
        transport = self._connections.get(handler)
        handler.force_close()
        if transport is not None:
            transport.abort()

    # ------------------------------------------------------------ plain accepting

    def open(self, listener: socket.socket) -> Callable[[], None]:
        """Accept plain connections on ``listener`` from this (running) loop; returns
        what stops it and closes the held sockets."""
        acceptor = Acceptor(self._loop, listener, self._take, self._settle)
        acceptor.start()

        def close() -> None:
            acceptor.close()
            with self.owner.lock:
                socks = list(self.held)
                self.held.clear()
                self.slots -= len(socks)
            for sock in socks:
                self._drop(sock)

        return close

    def _take(self, sock: socket.socket, peer: str) -> None:
        if self._doomed is None:
            self._doomed = []
        cut = self.owner.admit(self, sock)
        if cut is None:
            with contextlib.suppress(OSError):
                sock.send(_BUSY)
            self._doomed.append(sock)  # closed after the batch (off the loop)
            self.owner.refused(503, "too many connections", peer)
            return
        self._fresh.add(sock)
        if cut:
            self.owner.refused(503, "idle connection cut for a new one", peer)

    def _settle(self) -> None:
        """After a batch of accepts: watch those of its sockets still held, close those
        it cut."""
        held = self.held
        for sock in self._fresh:
            if sock in held:
                self._loop.add_reader(sock.fileno(), self._first_bytes, sock)
        self._fresh.clear()
        doomed, self._doomed = self._doomed, None
        if doomed:
            CLOSER.close(doomed)

    def _first_bytes(self, sock: socket.socket) -> None:
        got = _peek(sock)
        if got is None:
            return  # a spurious wake-up: still held, still watched
        with self.owner.lock:
            since = self.held.pop(sock, None)
            if since is not None and not got:
                self.slots -= 1
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(sock.fileno())
        if since is None:
            return  # cut meanwhile (its close or hand-over is queued)
        if not got:  # gone before its first byte: no aiohttp machinery for it
            sock.close()
            return
        self.hand_over(sock, since)

    def hand_over(self, sock: socket.socket, since: float) -> None:
        """Give aiohttp a socket that left ``held`` with its slot (on the loop)."""
        if sock in self._fresh:
            self._fresh.discard(sock)
        else:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
        handler = _Protocol(self.owner, self, loop=self._loop, **self._kwargs)
        handler.accepted = since
        handler.counted = True
        made: list[bool] = []

        def protocol() -> _Protocol:
            made.append(True)  # from here asyncio's transport owns (and closes) the socket
            return handler

        task = self._loop.create_task(self._loop.connect_accepted_socket(protocol, sock))
        task.add_done_callback(lambda t: self._handed(t, handler, sock, bool(made)))

    def _handed(
        self, task: asyncio.Task[Any], handler: _Protocol, sock: socket.socket, made: bool
    ) -> None:
        """After a hand-over: if it failed or was cancelled (stopping) before aiohttp
        took the connection, its slot is freed (and its socket closed)."""
        if not task.cancelled():
            task.exception()  # retrieved: the transport's own failure, nothing to add
        if handler.accepted is None:
            return  # connection_made ran
        if task.cancelled() or task.exception() is not None:
            handler.accepted = None
            self._release(handler)
            if not made:
                sock.close()

    def _release(self, handler: _Protocol) -> None:
        with self.owner.lock:
            self.waiting.pop(handler, None)
            if handler.counted:
                handler.counted = False
                self.slots -= 1

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        assert isinstance(handler, _Protocol)
        if handler.accepted is not None:
            # handed over by the plain door: admitted (cap, victim) at its accept
            since, handler.accepted = handler.accepted, None
            super().connection_made(handler, transport)
            with self.owner.lock:
                if handler.counted:  # not cut on its way here
                    self.waiting[handler] = since
            return
        cut = self.owner.admit(self, handler)
        if cut is None:
            with contextlib.suppress(Exception):
                transport.write(_BUSY)
            transport.close()
            handler.force_close()
            self.owner.refused(503, "too many connections", _peer(transport))
        elif cut:
            self.owner.refused(503, "idle connection cut for a new one", _peer(transport))
        super().connection_made(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        assert isinstance(handler, _Protocol)
        self._release(handler)
        super().connection_lost(handler, exc)

    def reap(self, deadline: float) -> None:
        """Cut the connections whose request has not arrived whole since ``deadline``."""
        with self.owner.lock:
            late = [h for h, since in self.waiting.items() if since < deadline]
            for handler in late:
                del self.waiting[handler]  # its slot is freed by connection_lost
            overdue: list[socket.socket] = []
            for sock, since in self.held.items():  # oldest first
                if since >= deadline:
                    break
                overdue.append(sock)
            for sock in overdue:
                del self.held[sock]
            self.slots -= len(overdue)
        for handler in late:
            self._abort(handler)
        for sock in overdue:
            self._drop(sock)


#: A connection the cap counts and may cut: a held socket or aiohttp's handler.
Conn: TypeAlias = "socket.socket | _Protocol"

_since = operator.itemgetter(1)

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)


def _peek(sock: socket.socket) -> bytes | None:
    """The first byte waiting on ``sock`` without taking it, b"" if the peer closed it,
    None if it is silent."""
    try:
        return sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def _peer(transport: asyncio.BaseTransport) -> str:
    try:
        return str(transport.get_extra_info("peername")[0])
    except (TypeError, IndexError, OSError):
        return ""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # listen(2) backlog: a burst of connects must not stall (capped by somaxconn)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class _Lane:
    """One event loop serving the socket: its thread, its connections."""

    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None
    manager: _Manager | None = None
    reaper: asyncio.Task[None] | None = None
    close: Callable[[], None] | None = None  # stops accepting


class HttpServer:
    """A router served on ``host:port`` by a background thread (``port=0``: free port)."""

    def __init__(
        self,
        host: str,
        port: int,
        router: Router | None = None,
        *,
        max_body_bytes: int = 1024 * 1024,
        name: str = "http",
        on_refused: Callable[[int, str, str], None] | None = None,
        error_response: Callable[[int, str, str], Response] | None = None,
        max_connections: int = 64,
        idle_timeout: float | None = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        gate: Gate | None = None,
        handshake_timeout: float = TLS_HANDSHAKE_TIMEOUT,
        inline_handlers: bool = False,
        handler_threads: int = 8,
        loops: int = 1,
        cut_grace: float = CUT_GRACE,
        speak_grace: float = SPEAK_GRACE,
    ) -> None:
        """``on_refused(status, reason, client)`` is told about requests refused before
        routing (oversize or malformed bodies, 503 past ``max_connections``), so receivers
        can count them; ``error_response(status, reason, request content type)`` shapes
        those answers (default: text). ``idle_timeout``: seconds a connection may stay
        silent, and that a request may take to arrive whole (None: forever).
        ``ssl_context``: serve HTTPS (each handshake within ``handshake_timeout``);
        ``gate``: token / client-certificate rule per path. ``inline_handlers``: run the
        handlers on the serving loop (they must never block), else on
        ``handler_threads`` threads. ``loops``: event loops (threads) accepting on the
        socket, so that one connection's I/O waits on the GIL while another's handler
        runs, as thread-per-connection servers do. ``cut_grace``: seconds a connection
        counts as young for the cap's choice of whom to cut (:meth:`victim`);
        ``speak_grace``: seconds a burst's newest has to speak (:meth:`admit`)."""
        self.router = router or Router()
        self.name = name
        self.max_body_bytes = max_body_bytes
        #: chunks a chunked body may have (:data:`MIN_CHUNK`)
        self.max_body_chunks = max(MIN_CHUNKS, max_body_bytes // MIN_CHUNK)
        self.on_refused = on_refused
        self.error_response = error_response
        self.max_connections = max_connections
        self.cut_grace = cut_grace
        self.speak_grace = speak_grace
        self.idle_timeout = idle_timeout
        self.ssl_context = ssl_context
        self.gate = gate
        self.handshake_timeout = handshake_timeout
        self.inline_handlers = inline_handlers
        self._threads = handler_threads
        self._sock = _bind(host, port)
        self._port = int(self._sock.getsockname()[1])
        self.stopping = False
        self._lanes = [_Lane() for _ in range(max(1, loops))]
        #: the cap's bookkeeping over every loop (:meth:`admit`, :class:`_Manager`)
        self.lock = threading.Lock()
        self._door = (
            None
            if ssl_context is None
            else TlsDoor(
                ssl_context,
                timeout=handshake_timeout,
                cap=max(1, max_connections) * PENDING_HANDSHAKES_PER_SLOT,
                failed=self._handshake_failed,
            )
        )
        self._pool: ThreadPoolExecutor | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._port

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start serving: one daemon thread per loop (returns once the socket is served)."""
        if self._pool is None and not self.inline_handlers:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=f"coeffd-{self.name}")
        for i, lane in enumerate(self._lanes):
            if lane.thread is not None and lane.thread.is_alive():
                continue
            started = threading.Event()
            suffix = f"-{i}" if len(self._lanes) > 1 else ""
            lane.thread = threading.Thread(
                target=self._run,
                args=(lane, started),
                name=f"coeffd-{self.name}{suffix}",
                daemon=True,
            )
            lane.thread.start()
            started.wait(10.0)

    def victim(self) -> tuple[_Manager, Conn, float, bool] | None:
        """The connection the cap cuts for a new one, over every loop, as (manager,
        connection, since, burst); the caller holds ``lock``. The one waiting longest for
        its request, unless a burst is on — at least ``BURST`` connections that arrived
        less than ``cut_grace`` ago are waiting, none has waited longer — then the newest
        of them (which :meth:`admit` spares for ``speak_grace``).

        A burst of silent connections thus takes slots from itself, not from the client
        that connected just before it and has not sent (or we have not read) its request
        yet. What an attacker cannot do: make its connections old without waiting (a
        connection that waited ``cut_grace`` is cut first, oldest first, as before), nor
        cut, by a burst that fills the cap, a client that connected before it within
        ``cut_grace`` (with ``max_connections`` above ``BURST``; a cap filled by requests
        in progress and fewer than ``BURST`` waiting ones still cuts the oldest). What it
        still can: a new client is the newest connection until the next one arrives, so
        an attacker connecting after it cuts it if the client has not sent its first
        bytes within ``speak_grace`` of its accept (and one connecting before a client's
        accept, whose own bytes are not there yet, gets that client answered 503)."""
        young = time.monotonic() - self.cut_grace
        oldest: tuple[float, _Manager, Conn] | None = None
        newest: tuple[float, _Manager, Conn] | None = None
        total = 0
        for lane in self._lanes:
            manager = lane.manager
            if manager is None:
                continue
            n, lo, hi = manager.ends()
            total += n
            if lo is not None and (oldest is None or lo[0] < oldest[0]):
                oldest = (lo[0], manager, lo[1])
            if hi is not None and (newest is None or hi[0] > newest[0]):
                newest = (hi[0], manager, hi[1])
        if oldest is None or newest is None:
            return None
        # The burst's choice applies only when every waiting connection is young (the
        # oldest is), so the young ones are all of them and their newest is the newest.
        burst = oldest[0] >= young and total >= BURST
        pick = newest if burst else oldest
        return pick[1], pick[2], pick[0], burst

    def admit(self, manager: _Manager, conn: Conn) -> bool | None:
        """Give ``conn``, new on ``manager``'s loop, a slot of the cap: a free one (False),
        else the one of a connection cut for it (True); None: ``conn`` is not admitted —
        every connection is busy, or a burst's newest is younger than ``speak_grace``
        and ``conn`` (plain) has sent nothing yet either: it is cut itself, so that a
        client accepted amid a flood has that long to send its request.

        Choosing, cutting and admitting are one step under ``lock`` whichever loop runs
        it, so the cap is never passed, not even for a moment: a slot freed by a cut goes
        to one newcomer, and two loops never cut the same victim for two. A held socket
        chosen is peeked at first, whichever loop holds it: one whose first bytes have
        arrived (a client that connected amid a flood and sent its request at once, its
        loop busy) is not silent — it keeps its slot and is handed to aiohttp on its own
        loop, and the choice is made again; one its client closed frees its slot."""
        after: list[tuple[_Manager, Callable[[], None]]] = []
        cut: bool | None = False
        cap = self.max_connections
        with self.lock:
            while cap and self._slots() >= cap:
                pick = self.victim()
                if pick is None:
                    cut = None
                    break
                owner, victim, since, burst = pick
                if (
                    burst
                    and since > time.monotonic() - self.speak_grace
                    and isinstance(conn, socket.socket)
                    and _peek(conn) is None
                ):
                    cut = None
                    break
                if isinstance(victim, _Protocol):
                    del owner.waiting[victim]
                    victim.counted = False
                    owner.slots -= 1
                    after.append((owner, functools.partial(owner._abort, victim)))
                    cut = True
                    break
                got = _peek(victim)
                del owner.held[victim]
                if got:
                    after.append((owner, functools.partial(owner.hand_over, victim, since)))
                    continue  # it keeps its slot: choose again
                owner.slots -= 1
                after.append((owner, functools.partial(owner._drop, victim)))
                if got is None:
                    cut = True
                    break
                # closed by its client: its slot is free
            if cut is not None:
                manager.slots += 1
                now = time.monotonic()
                if isinstance(conn, _Protocol):
                    conn.counted = True
                    manager.waiting[conn] = now
                else:
                    manager.held[conn] = now
        for owner, fn in after:
            if owner is manager:  # admit runs on the newcomer's loop
                fn()
            else:
                owner.on_loop(fn)
        return cut

    def connections(self) -> int:
        """Connections holding a slot of the cap, over every loop (one cut for a newcomer
        holds none, though its close may be a loop turn away)."""
        with self.lock:  # a slot moving between loops is counted once
            return self._slots()

    def _slots(self) -> int:
        return sum(lane.manager.slots for lane in self._lanes if lane.manager is not None)

    def _run(self, lane: _Lane, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        lane.loop = loop
        try:
            loop.run_until_complete(self._serve(lane))
            started.set()
            loop.run_forever()
            if lane.close is not None:
                lane.close()
            if lane.manager is not None:
                lane.manager.pre_shutdown()
            loop.run_until_complete(asyncio.sleep(0))
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=2.0))
        finally:
            started.set()
            loop.close()

    async def _serve(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        keepalive = self.idle_timeout if self.idle_timeout is not None else 3630.0
        manager = lane.manager = _Manager(
            self,
            loop=loop,
            keepalive_timeout=keepalive,
            auto_decompress=False,  # receivers inflate bodies themselves, bounded
            read_bufsize=READ_PIECE,
            lingering_time=DRAIN_SECONDS,
            access_log=None,
        )

        # Every loop accepts on the same listening socket (the kernel hands each new
        # connection to one of them).
        if self._door is not None:
            lane.close = self._door.open(self._sock.dup(), manager)
        else:
            # silent connections are held as bare sockets until their first bytes
            lane.close = manager.open(self._sock.dup())
        lane.reaper = loop.create_task(self._reaper(manager))

    async def _reaper(self, manager: _Manager) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            if self.idle_timeout is not None:
                manager.reap(time.monotonic() - self.idle_timeout)
            if self._door is not None:
                self._door.reap(loop)

    def _handshake_failed(self, error: Exception, client: str) -> None:
        if self.gate is not None and not self.stopping:
            self.gate.handshake_failed(error, client)

    @property
    def alive(self) -> bool:
        """Whether every serving thread runs."""
        return all(lane.thread is not None and lane.thread.is_alive() for lane in self._lanes)

    def restart(self) -> None:
        """Serve again from new threads after one died (supervision)."""
        if self.alive or self.stopping:
            return
        self.start()

    def stop(self) -> None:
        """Stop accepting, close the connections and the socket."""
        self.stopping = True
        for lane in self._lanes:
            loop, thread = lane.loop, lane.thread
            if loop is not None and thread is not None and thread.is_alive():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=5)
            lane.thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._sock.close()

    # ------------------------------------------------------------------ requests

    def refused(self, status: int, reason: str, client: str) -> None:
        """Tell the owner about a request refused before its handler."""
        if self.on_refused is not None:
            try:
                self.on_refused(status, reason, client)
            except Exception:
                log.exception("http on_refused hook failed", listener=self.name)

    def error(
        self, status: int, reason: str, ctype: str, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        """An error answer shaped by ``error_response`` (OTLP/HTTP: a ``google.rpc.Status``
        in the request's encoding), else plain text."""
        if self.error_response is None:
            resp = Response.text(status, reason, headers)
        else:
            resp = self.error_response(status, reason, ctype)
            resp.headers.update(headers or {})
        return _web(resp)

    async def dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp's request handler: gate, route, bounded body, handler."""
        proto = request.protocol
        manager = proto.lane if isinstance(proto, _Protocol) else None
        url = urllib.parse.urlsplit(request.raw_path)
        path = url.path
        client = request.remote or ""
        ctype = request.headers.get("Content-Type", "")
        try:
            if self.gate is not None:
                self._admit(self.gate, request, path, client, ctype)
            handler, allowed = self.router.resolve(request.method, path)
            if handler is None:
                if allowed:
                    allow = {"Allow": ", ".join(allowed)}
                    miss = self.error(405, "method not allowed", ctype, allow)
                else:
                    miss = self.error(404, "not found", ctype)
                if not request.content.is_eof() and request.body_exists:
                    miss.force_close()  # the body stays unread
                return miss
            body = await self._body(request, ctype, client)
        except _Refused as r:
            return r.response
        if manager is not None and isinstance(proto, _Protocol):
            with self.lock:
                manager.waiting.pop(proto, None)  # the request is here: no deadline while handled
        req = Request(
            method=request.method,
            path=path,
            query=urllib.parse.parse_qs(url.query),
            headers=request.headers,
            body=body,
            client=client,
        )
        resp: Response
        try:
            if self.inline_handlers or self._pool is None or self.router.inline(handler):
                resp = handler(req)
            else:
                loop = asyncio.get_running_loop()
                resp = await loop.run_in_executor(self._pool, handler, req)
        except Exception:
            log.exception("http handler failed", path=path, method=request.method)
            resp = Response.text(500, "internal error")
            if self.error_response is not None:
                resp = self.error_response(500, "internal error", ctype)
        if manager is not None and isinstance(proto, _Protocol) and not proto._force_close:
            with self.lock:
                if proto.counted:  # not cut meanwhile (a second cut would free no slot)
                    manager.waiting[proto] = time.monotonic()  # waiting for the next one
        return _web(resp)

    def _admit(
        self, gate: Gate, request: web.BaseRequest, path: str, client: str, ctype: str
    ) -> None:
        """Apply the listener's token / client-certificate rule before reading the body."""
        transport = request.transport
        has_cert = bool(transport is not None and transport.get_extra_info("peercert"))
        reason = gate.check(path, request.headers.get("Authorization"), has_cert, client)
        if reason is None:
            return
        if reason == "client_certificate":
            resp = self.error(403, "client certificate required", ctype)
        else:
            error = ', error="invalid_token"' if reason == "invalid_token" else ""
            challenge = {"WWW-Authenticate": f'Bearer realm="coeffd"{error}'}
            resp = self.error(401, "bearer token required", ctype, challenge)
        resp.force_close()  # the body stays unread
        raise _Refused(resp)

    async def _body(self, request: web.BaseRequest, ctype: str, client: str) -> bytes:
        """The body, read in pieces up to ``max_body_bytes``; raises :class:`_Refused`."""
        limit = self.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            await self._refuse(request, 413, f"body larger than {limit} bytes", ctype, client)
        if not request.body_exists:
            return b""
        buf = bytearray()
        content = request.content
        proto = request.protocol
        counter = proto if isinstance(proto, _Protocol) and length is None else None  # chunked
        try:
            if counter is not None:
                counter.count_chunks(content)
            while True:
                piece = await content.read(READ_PIECE)
                if not piece:
                    break
                if len(buf) + len(piece) > limit:
                    del buf[:]
                    await self._refuse(
                        request, 413, f"body larger than {limit} bytes", ctype, client
                    )
                buf += piece
        except _Refused:
            raise
        except _ChunkFlood as e:  # no drain: the rest would cost the parse it is refused for
            reason = str(e)
            resp = self.error(413, reason, ctype)
            resp.force_close()
            self.refused(413, reason, client)
            raise _Refused(resp) from None
        except Exception as e:  # aiohttp's payload errors: framing broken mid-body
            reason = f"malformed body: {str(e)[:200]}"
            resp = self.error(400, reason, ctype)
            resp.force_close()
            self.refused(400, reason, client)
            raise _Refused(resp) from None
        finally:
            if counter is not None:
                counter.count_chunks(None)
        return bytes(buf)

    async def _refuse(
        self, request: web.BaseRequest, status: int, reason: str, ctype: str, client: str
    ) -> None:
        """Answer ``status`` without reading the rest of the body, and close after it; a
        limit's worth is read and dropped first (bounded in time) so that a client that
        writes before it reads gets the answer rather than a reset."""
        self.refused(status, reason, client)
        resp = self.error(status, reason, ctype)
        resp.force_close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._drain(request.content, self.max_body_bytes), DRAIN_SECONDS)
        raise _Refused(resp)

    @staticmethod
    async def _drain(content: Any, n: int) -> None:
        while n > 0:
            piece = await content.read(min(n, READ_PIECE))
            if not piece:
                return
            n -= len(piece)


def _web(resp: Response) -> web.Response:
    headers = {"Content-Type": resp.content_type}
    headers.update(resp.headers)
    return web.Response(status=resp.status, body=resp.body, headers=headers)
