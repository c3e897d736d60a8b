"""Accepting TLS connections so that a flood of connections that never handshake costs
next to nothing and delays no one (issue 32, item 3).

A connection that has sent nothing yet is held as a bare socket: one file descriptor and
one entry in the loop's selector, no TLS state, no task. Only its first bytes (a
ClientHello, or the end of the connection) start the handshake, run by asyncio's own TLS
layer with the time left of the connection's deadline. Holding 300 such connections in
an HTTPS listener had cost ~0.45 ms of the loop each when each started its handshake at
once (a task, an ``SSLObject``, a timer), so ``/healthz`` probes queued behind a burst of
them waited 150–250 ms; now they cost an ``accept`` and a selector entry.

Connections not yet through their handshake are capped (per door, over every loop): past
the cap the oldest *silent* one is cut first, a handshaking one only when none is silent,
so a client that sends its ClientHello as it connects (any real one) is not cut by a
flood of silent connections however long it lasts.

The accept loop (:class:`Acceptor`) and the closer thread (:class:`Closer`) are shared
with the plain door of :mod:`coeffd.base.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

__all__ = ["ACCEPT_BATCH", "ACCEPT_PAUSE", "CLOSER", "Acceptor", "Closer", "TlsDoor"]

log = structlog.get_logger(__name__)

#: Connections accepted per loop turn: a burst is taken in steps, other work between.
ACCEPT_BATCH = 64
#: Seconds accepting pauses after the process ran out of file descriptors.
ACCEPT_PAUSE = 1.0


class Acceptor:
    """Accepts connections on a listening socket from one loop, for the plain door of
    :mod:`coeffd.base.http` and the TLS door alike: ``take(sock, peer)`` gets each
    (non-blocking) socket, ``settle()`` runs once after each batch.

    A burst is taken ``ACCEPT_BATCH`` at a time so the loop's other work runs between
    batches; when the process runs out of descriptors (EMFILE, ENFILE, ENOBUFS)
    accepting pauses for ``ACCEPT_PAUSE`` instead of spinning on a listener that stays
    readable."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        listener: socket.socket,
        take: Callable[[socket.socket, str], None],
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self.listener = listener
        self._fd = listener.fileno()
        # socket.accept() looks the listener's family and type up as enums for every
        # socket it makes: a third of the cost of an accept a flood's cut closes at once
        self._kind = (int(listener.family), int(listener.type), listener.proto)
        self._take = take
        self._settle = settle

    def start(self) -> None:
        """Accept from the loop (which must be this thread's, running or about to)."""
        self.loop.add_reader(self._fd, self._ready)

    def close(self) -> None:
        """Stop accepting and close the listener (on the loop)."""
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self._fd)
        self.listener.close()

    def _ready(self) -> None:
        listener = self.listener
        family, kind, proto = self._kind
        try:
            for _ in range(ACCEPT_BATCH):
                try:
                    fd, addr = listener._accept()  # type: ignore[attr-defined]
                except (BlockingIOError, InterruptedError):
                    return  # another loop took it, or the queue is empty
                except OSError as e:
                    if listener.fileno() == -1:
                        return  # closed: stopping
                    log.warning("accept failed; pausing", error=str(e), seconds=ACCEPT_PAUSE)
                    self.loop.remove_reader(self._fd)
                    self.loop.call_later(ACCEPT_PAUSE, self._resume)
                    return
                sock = socket.socket(family, kind, proto, fd)
                sock.setblocking(False)
                self._take(sock, str(addr[0]) if isinstance(addr, tuple) and addr else "")
            # A full batch: more may be queued. The next batch waits a loop turn, so that
            # the turn's other callbacks (a probe's hand-over, its request) do not each
            # wait for a batch of a flood first.
            self.loop.remove_reader(self._fd)
            self.loop.call_soon(self._resume)
        finally:
            if self._settle is not None:
                self._settle()

    def _resume(self) -> None:
        if self.listener.fileno() != -1:  # not closed meanwhile (stopping)
            self.loop.add_reader(self._fd, self._ready)


class Closer:
    """Closes sockets on a thread of its own. A connection's close costs its loop 6-17
    us of kernel time (its FIN sent and taken in by the peer's socket, on loopback in
    the same call), which a flood over a cap pays for each connection it cuts;
    ``close`` lets go of the GIL, so here it runs beside the loops, which only hand
    over one batch's cut sockets at a time. A socket handed over has left its selector
    and every table: nothing else touches it, and its descriptor is not reused until
    the close is done."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[socket.socket]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def close(self, socks: list[socket.socket]) -> None:
        """Close ``socks`` soon, off the calling thread."""
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="coeffd-http-closer", daemon=True
                    )
                    self._thread.start()
        self._queue.put(socks)

    def _run(self) -> None:
        while True:
            for sock in self._queue.get():
                with contextlib.suppress(OSError):
                    sock.close()


#: the process's closer, shared by every door
CLOSER = Closer()


@dataclass(slots=True)
class _Held:
    """A connection not through its handshake yet."""

    since: float
    loop: asyncio.AbstractEventLoop
    peer: str
    task: asyncio.Task[None] | None = None  # None: silent, nothing received yet
    started: bool = False  # the handshake task runs (asyncio owns the socket)


class TlsDoor:
    """The TLS side of one listening socket, for every loop that accepts on it.

    ``factory(loop)`` gives the protocol factory a loop serves with (its connection
    cap applies when a handshake is done); ``failed(error, client)`` is told about each
    handshake that failed, timed out or was cut."""

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        timeout: float,
        cap: int,
        failed: Callable[[Exception, str], None],
    ) -> None:
        self.context = context
        self.timeout = timeout
        self.cap = max(1, cap)
        self.failed = failed
        self._lock = threading.Lock()
        # insertion order = age: the first entry is the oldest
        self._silent: dict[socket.socket, _Held] = {}
        self._shaking: dict[socket.socket, _Held] = {}

    # ---------------------------------------------------------------- accepting

    def open(
        self, listener: socket.socket, factory: Callable[[], asyncio.BaseProtocol]
    ) -> Callable[[], None]:
        """Accept on ``listener`` from the running loop; returns what stops it (and
        drops this loop's pending connections)."""
        loop = asyncio.get_running_loop()

        def take(sock: socket.socket, peer: str) -> None:
            with self._lock:
                self._silent[sock] = _Held(time.monotonic(), loop, peer)
            loop.add_reader(sock.fileno(), self._first_bytes, loop, sock, factory)
            self._over_cap()

        acceptor = Acceptor(loop, listener, take)
        acceptor.start()

        def close() -> None:
            acceptor.close()
            with self._lock:
                mine = [
                    s for s, h in (*self._silent.items(), *self._shaking.items()) if h.loop is loop
                ]
            for sock in mine:
                self._cut(sock, None)

        return close

    def _first_bytes(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
    ) -> None:
        loop.remove_reader(sock.fileno())
        with self._lock:
            held = self._silent.pop(sock, None)
        if held is None:
            return  # cut meanwhile
        try:
            closed = sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:  # a spurious wake-up: the handshake waits for the bytes
            closed = False
        except OSError:
            closed = True
        if closed:  # gone before its first byte: no TLS machinery for it
            sock.close()
            self.failed(ConnectionResetError("closed before the TLS handshake"), held.peer)
            return
        held.task = loop.create_task(self._handshake(loop, sock, held, factory))
        with self._lock:
            self._shaking[sock] = held

    async def _handshake(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        held: _Held,
        factory: Callable[[], asyncio.BaseProtocol],
    ) -> None:
        # From here the socket belongs to asyncio's transport, which closes it on any
        # failure or cancellation (closing it here too could close a reused descriptor).
        held.started = True
        left = max(0.1, held.since + self.timeout - time.monotonic())
        try:
            await loop.connect_accepted_socket(
                factory, sock, ssl=self.context, ssl_handshake_timeout=left
            )
        except Exception as e:  # SSLError, its timeout, resets: the client's failure
            self.failed(e, held.peer)
        finally:
            with self._lock:
                self._shaking.pop(sock, None)

    # ---------------------------------------------------------------- cutting

    def _over_cap(self) -> None:
        """Cut the oldest silent connection (else the oldest handshaking one) while more
        than ``cap`` are pending."""
        while True:
            with self._lock:
                if len(self._silent) + len(self._shaking) <= self.cap:
                    return
                pool = self._silent or self._shaking
                sock = next(iter(pool))
            self._cut(sock, ConnectionAbortedError("too many pending TLS handshakes"))

    def _cut(self, sock: socket.socket, why: Exception | None) -> None:
        """Drop a pending connection, on its own loop; ``why`` is counted as a failed
        handshake (None: stopping)."""
        with self._lock:
            held = self._silent.pop(sock, None) or self._shaking.pop(sock, None)
        if held is None:
            return
        if why is not None:
            self.failed(why, held.peer)
        task = held.task

        def close() -> None:
            if task is None:
                with contextlib.suppress(ValueError, OSError):
                    held.loop.remove_reader(sock.fileno())
                CLOSER.close([sock])
                return
            task.cancel()  # asyncio's transport closes the socket as it unwinds
            if not held.started:  # cancelled before it ran: nothing owns the socket
                task.add_done_callback(lambda _t: sock.close())

        try:
            here = asyncio.get_running_loop() is held.loop
        except RuntimeError:
            here = False
        if here:
            close()
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closing
                held.loop.call_soon_threadsafe(close)

    def reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cut ``loop``'s silent connections past their deadline (a handshaking one has
        asyncio's handshake timeout)."""
        deadline = time.monotonic() - self.timeout
        with self._lock:
            overdue = []
            for sock, held in self._silent.items():
                if held.since >= deadline:
                    break
                if held.loop is loop:
                    overdue.append(sock)
        for sock in overdue:
            self._cut(sock, TimeoutError("no TLS handshake within the deadline"))
