"""A small threaded HTTP/1.1 server with a router: the OTLP/HTTP receiver's and the
daemon's (``/metrics``, probes, API) listener, hence down here where both can use it.

Stdlib ``ThreadingHTTPServer`` (one thread per connection) is enough here: the daemon's
HTTP traffic is scrapes, probes, a few API calls and, on the OTLP/HTTP port, one
keep-alive connection per exporting process. Handlers are plain functions
``(Request) -> Response``; routes are exact paths or prefixes, so the serve developer
can mount ``/v1/...`` API routes with :meth:`Router.add_route`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from coeffd.base.security import Gate

__all__ = ["Handler", "HttpServer", "Request", "Response", "Router"]

log = structlog.get_logger(__name__)

#: Seconds a client gets to finish the TLS handshake (done in the connection's thread,
#: so a silent client never blocks accepting others).
TLS_HANDSHAKE_TIMEOUT = 10.0


@dataclass(slots=True)
class Request:
    """One parsed HTTP request; ``body`` is already read (bounded by the server)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
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
        self._lock = threading.Lock()

    def add_route(self, method: str, path: str, handler: Handler, *, prefix: bool = False) -> None:
        """Register ``handler``; ``prefix=True`` matches every path starting with ``path``."""
        method = method.upper()
        with self._lock:
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection
    server: _Server

    def setup(self) -> None:
        # A socket timeout bounds every read: an idle keep-alive connection or a client
        # that stalls inside a request is closed instead of holding its thread forever.
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)
        # Headers and body leave in two writes: with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms a response on keep-alive connections).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        # The idle timeout bounds each read; this bounds the whole request, so a client
        # trickling a byte now and then cannot hold its thread (and a connection slot).
        self.server.expect_request(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.request_arrived(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        # Access logs would be one line per request; the metrics count requests instead.
        pass

    def _dispatch(self) -> None:
        srv = self.server
        url = urllib.parse.urlsplit(self.path)
        if srv.gate is not None and not self._admitted(srv.gate, url.path):
            return
        handler, allowed = srv.router.resolve(self.command, url.path)
        if handler is None:
            self._read_body(discard=True)
            if allowed:
                self._send(self._error(405, "method not allowed", {"Allow": ", ".join(allowed)}))
            else:
                self._send(self._error(404, "not found"))
            return
        body = self._read_body()
        self.server.request_arrived(self.connection)
        if body is None:
            return
        req = Request(
            method=self.command,
            path=url.path,
            query=urllib.parse.parse_qs(url.query),
            headers=self.headers,
            body=body,
            client=self.client_address[0] if self.client_address else "",
        )
        try:
            resp = handler(req)
        except Exception:
            log.exception("http handler failed", path=url.path, method=self.command)
            resp = self._error(500, "internal error")
        self._send(resp, head=self.command == "HEAD")

    def _admitted(self, gate: Gate, path: str) -> bool:
        """Apply the listener's token / client-certificate rule before reading the body."""
        conn = self.connection
        has_cert = isinstance(conn, ssl.SSLSocket) and bool(conn.getpeercert())
        client = self.client_address[0] if self.client_address else ""
        reason = gate.check(path, self.headers.get("Authorization"), has_cert, client)
        if reason is None:
            return True
        self.close_connection = True  # the body stays unread
        if reason == "client_certificate":
            self._send(self._error(403, "client certificate required"))
        else:
            error = ', error="invalid_token"' if reason == "invalid_token" else ""
            challenge = {"WWW-Authenticate": f'Bearer realm="coeffd"{error}'}
            self._send(self._error(401, "bearer token required", challenge))
        return False

    def _error(
        self, status: int, reason: str, headers: Mapping[str, str] | None = None
    ) -> Response:
        """An error answer shaped by the server's ``error_response`` (OTLP/HTTP: a
        ``google.rpc.Status`` in the request's encoding), else plain text."""
        shape = self.server.error_response
        if shape is None:
            return Response.text(status, reason, headers)
        resp = shape(status, reason, self.headers.get("Content-Type") or "")
        resp.headers.update(headers or {})
        return resp

    def _read_body(self, discard: bool = False) -> bytes | None:
        """Read the body (Content-Length or chunked) up to the server's limit."""
        limit = self.server.max_body_bytes
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks: list[bytes] = []
            total = 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    self._refuse(400, "bad chunked encoding")
                    return None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    self._refuse(413, f"body larger than {limit} bytes")
                    return None
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)
            return b"" if discard else b"".join(chunks)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._refuse(400, "bad Content-Length")
            return None
        if length < 0 or length > limit:
            self._refuse(413, f"body larger than {limit} bytes")
            # A client that writes its whole body before reading (most do) would get a
            # reset instead of the 413: read and drop up to one more limit's worth
            # (each read bounded by the idle timeout) before closing.
            self._drain(min(length, limit))
            return None
        data = self.rfile.read(length) if length else b""
        return b"" if discard else data

    def _drain(self, n: int) -> None:
        try:
            self.wfile.flush()
            while n > 0:
                got = self.rfile.read(min(n, 1 << 16))
                if not got:
                    return
                n -= len(got)
        except OSError:
            pass

    def _refuse(self, status: int, reason: str) -> None:
        """Answer a request whose body we will not read, and tell the owner."""
        self.close_connection = True  # the unread body would poison keep-alive
        self._send(self._error(status, reason))
        hook = self.server.on_refused
        if hook is not None:
            hook(status, reason, self.client_address[0] if self.client_address else "")

    def _send(self, resp: Response, head: bool = False) -> None:
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for k, v in resp.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and resp.body:
            self.wfile.write(resp.body)

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch
    do_HEAD = _dispatch
    do_PATCH = _dispatch


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # listen(2) backlog; socketserver's default of 5 stalled connects under a burst (the
    # kernel caps it at net.core.somaxconn).
    request_queue_size = 1024
    idle_timeout: float | None = None
    max_connections: int = 0  # 0 = unbounded
    error_response: Callable[[int, str, str], Response] | None = None
    _active = 0
    _active_lock = threading.Lock()
    _deadlines: dict[Any, float]

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, at most ``max_connections``: at the cap the
        # connection that has waited longest for its request (idle keep-alive, a silent or
        # trickling client) is cut to make room, so idle clients can never lock out a
        # probe or an exporter; only when every connection is busy with a request is the
        # new one answered 503 at once and closed.
        if self.max_connections:
            victim = None
            with self._active_lock:
                full = self._active >= self.max_connections
                if full and self.idle_timeout is not None and self._deadlines:
                    victim = min(self._deadlines, key=self._deadlines.__getitem__)
                    del self._deadlines[victim]
                    full = False
                if not full:
                    self._active += 1  # the victim's thread gives its slot back as it ends
            if victim is not None:
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)
                if self.on_refused is not None:
                    self.on_refused(503, "idle connection cut for a new one", _peer(victim))
            if full:
                self._turn_away(request, client_address)
                return
        super().process_request(request, client_address)

    def expect_request(self, conn: Any) -> None:
        """``conn`` now waits for a request: it must have arrived within the timeout."""
        if self.idle_timeout is not None:
            with self._active_lock:
                self._deadlines[conn] = time.monotonic() + self.idle_timeout

    def request_arrived(self, conn: Any) -> None:
        """The request on ``conn`` is read (or the connection is done)."""
        with self._active_lock:
            self._deadlines.pop(conn, None)

    def service_actions(self) -> None:
        # Called by serve_forever every poll interval: cut the connections whose request
        # is overdue; their blocked read returns and the thread ends.
        if not self._deadlines:
            return
        now = time.monotonic()
        with self._active_lock:
            overdue = [c for c, t in self._deadlines.items() if t < now]
            for c in overdue:
                del self._deadlines[c]
        for c in overdue:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            if self.max_connections:
                with self._active_lock:
                    self._active -= 1

    def _turn_away(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(1.0)
            request.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
        except (OSError, ValueError):  # TLS sockets refuse plain bytes before a handshake
            pass
        self.shutdown_request(request)
        if self.on_refused is not None:
            self.on_refused(503, "too many connections", str(client_address[0]))

    router: Router
    max_body_bytes: int
    on_refused: Callable[[int, str, str], None] | None
    gate: Gate | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, in the connection's own thread (see HttpServer).
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(TLS_HANDSHAKE_TIMEOUT)
            try:
                request.do_handshake()
            except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
                if self.gate is not None:
                    self.gate.handshake_failed(e, str(client_address[0]))
                return
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Client resets and half-closed connections are normal; never print a traceback.
        log.debug("http connection error", client=str(client_address))


def _peer(conn: Any) -> str:
    try:
        return str(conn.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return ""


class _Server6(_Server):
    address_family = socket.AF_INET6


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
    ) -> None:
        """``on_refused(status, reason, client)`` is told about requests refused before
        routing (oversize or malformed bodies, 503 past ``max_connections``), so receivers
        can count them; ``error_response(status, reason, request content type)`` shapes
        those answers (default: text). ``idle_timeout``: seconds a connection may stay
        silent, and that a request may take to arrive whole (None: forever).
        ``ssl_context``: serve HTTPS; ``gate``: token / client-certificate rule per path."""
        self.router = router or Router()
        self.name = name
        server_cls = _Server6 if ":" in host else _Server
        self._server = server_cls((host, port), _Handler)
        self._server.router = self.router
        self._server.max_body_bytes = max_body_bytes
        self._server.on_refused = on_refused
        self._server.error_response = error_response
        self._server.max_connections = max_connections
        self._server.idle_timeout = idle_timeout
        self._server._active_lock = threading.Lock()  # per server, not the class's
        self._server._deadlines = {}
        self._server.gate = gate
        if ssl_context is not None:
            # Handshake deferred to the connection thread (_Server.finish_request).
            self._server.socket = ssl_context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Start serving in a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"coeffd-{self.name}",
            daemon=True,
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the serving thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def restart(self) -> None:
        """Serve again from a new thread after the old one died (supervision)."""
        if self._thread is None or self._thread.is_alive():
            return
        self.start()

    def stop(self) -> None:
        """Stop accepting and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
