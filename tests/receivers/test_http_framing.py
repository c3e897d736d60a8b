"""HTTP framing attacks of issue 32 against the real listeners (base/http.py), over raw
sockets so the exact bytes and the answer can be asserted:

1. a negative or huge chunk size is refused at once, without reading the body;
2. a body in tiny chunks does not grow the server's memory with its length;
3. TCP connections that never start their TLS handshake take no connection slot:
   ``/healthz`` and a client-certificate export are still answered;
6. strict framing: ``Transfer-Encoding: xchunked`` and two different ``Content-Length``
   are refused, and a request pipelined after such an ambiguous body is never run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings, metric, scrape
from otlp_builders import core_span, journey, request
from tls_certs import Certs, make_certs

from coeffd.base.http import HttpServer, Response, Router
from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer

GOOD = request(("vllm.scheduler", [core_span(journey())])).SerializeToString()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _records(app: App) -> int:
    assert app.pipeline.wait_idle(10)
    consumer = app.consumer
    assert isinstance(consumer, CountingConsumer)
    return consumer.total


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read what comes back until the server closes (or 5 s of
    silence: the connection is kept open from our side, as an attacker would)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:80]
    return int(answer.split(b" ", 2)[1])


HEAD = b"POST /v1/traces HTTP/1.1\r\nHost: coeffd\r\nContent-Type: application/x-protobuf\r\n"


# ----------------------------------------------------------------------- item 1


@pytest.mark.parametrize("size", [b"-1", b"-0x10", b"fffffffffffffffffffffffff"])
def test_bad_chunk_size_refused_without_reading_the_body(app: App, size: bytes) -> None:
    # The connection stays open after the chunk-size line: a server that reads "the
    # rest" (rfile.read(-1)) would wait for the client to close, never answering.
    port = app.otlp_http_port
    assert port is not None
    answer = _exchange(port, HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabc")
    assert _status(answer) in (400, 413)
    assert b"Connection: close" in answer or answer.count(b"HTTP/1.") == 1
    assert _records(app) == 0
    samples = scrape(app)
    refused = metric(
        samples, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="invalid"
    ) + metric(samples, "coeffd_receiver_requests_total", receiver="otlp_http", outcome="limit")
    assert refused == 1


# ----------------------------------------------------------------------- item 2

_SERVER = textwrap.dedent(
    """
    import sys, time
    from coeffd.base.http import HttpServer, Response, Router
    r = Router()
    r.add_route("POST", "/x", lambda req: Response(200, b"%d" % len(req.body)))
    s = HttpServer("127.0.0.1", 0, r, max_body_bytes=8 << 20)
    s.start()
    print(s.port, flush=True)
    sys.stdin.read()
    """
)


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_tiny_chunks_do_not_grow_memory() -> None:
    # 1 MiB of 1-byte chunks (6 MB on the wire), under the 8 MiB limit: the old reader
    # kept one bytes object per chunk (~45 MB); bounded reading holds ~1 MiB + a
    # bounded buffer of undelivered chunks, and past max(64, 8 MiB // MIN_CHUNK) = 8,192
    # chunks the body is refused (413) and its connection no longer read.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.2)
        before = _hwm_mb(proc.pid)
        n = 1 << 20
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(HEAD.replace(b"/v1/traces", b"/x") + b"Transfer-Encoding: chunked\r\n\r\n")
            piece = b"1\r\nx\r\n" * 8192
            with contextlib.suppress(OSError):  # cut off once refused
                for _ in range(n // 8192):
                    s.sendall(piece)
                s.sendall(b"0\r\n\r\n")
            answer = b""
            with contextlib.suppress(OSError):  # a reset may overtake the answer
                while chunk := s.recv(65536):
                    answer += chunk
        assert answer == b"" or _status(answer) == 413, answer
        grown = _hwm_mb(proc.pid) - before
        assert grown < 20, f"peak RSS grew {grown:.1f} MB for a 1 MiB body"
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------- item 3


def _tls_app(certs: Certs) -> App:
    s = make_settings()
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    s.http.tls = s.http.tls.model_validate(tls)
    s.receivers.otlp_http.tls = s.receivers.otlp_http.tls.model_validate(
        {**tls, "client_ca_file": str(certs.ca)}
    )
    s.receivers.otlp_http.max_connections = 8
    app = App(s, consumer=CountingConsumer.keeping())
    return app.start()


def test_silent_tls_connections_take_no_slot(certs: Certs) -> None:
    app = _tls_app(certs)
    silent: list[socket.socket] = []
    try:
        api, otlp = app.http_port, app.otlp_http_port
        assert api is not None and otlp is not None
        # more than either cap (API 64, OTLP/HTTP 8): TCP connects, no ClientHello
        for port, n in ((api, 80), (otlp, 20)):
            silent += [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        time.sleep(0.3)
        anonymous = ssl.create_default_context(cafile=str(certs.ca))
        for _ in range(3):
            with urllib.request.urlopen(
                f"https://127.0.0.1:{api}/healthz", timeout=5, context=anonymous
            ) as r:
                assert r.status == 200
        with_cert = ssl.create_default_context(cafile=str(certs.ca))
        with_cert.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        req = urllib.request.Request(
            f"https://127.0.0.1:{otlp}/v1/traces",
            data=GOOD,
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(req, timeout=5, context=with_cert) as r:
            assert r.status == 200
        assert _records(app) == 2
    finally:
        for s in silent:
            s.close()
        app.stop()


def _tls_server(certs: Certs, **kw: Any) -> HttpServer:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    r = Router()
    r.add_route("GET", "/healthz", lambda req: Response.text(200, "ok"))
    server = HttpServer("127.0.0.1", 0, r, ssl_context=ctx, **kw)
    server.start()
    return server


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (EOF or reset within the socket's timeout)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_handshaking_client_outlives_a_silent_flood(certs: Certs) -> None:
    # Cap of pending handshakes: 2 slots x 4 = 8. The client sends its ClientHello,
    # then 20 silent connections arrive: the silent ones are cut, not the client (the
    # old server cut the oldest pending, the client, and its handshake was reset).
    server = _tls_server(certs, max_connections=2)
    silent: list[socket.socket] = []
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        raw.sendall(outgoing.read())
        incoming.write(raw.recv(65536))  # the server's answer: its handshake has begun
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        silent[0].settimeout(5)
        assert _closed_by_server(silent[0])  # the cap was applied, to the silent ones
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                raw.sendall(outgoing.read())
                incoming.write(raw.recv(65536))
        tls.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw.sendall(outgoing.read())
        answer = b""
        while b"ok" not in answer:
            data = raw.recv(65536)
            assert data, answer
            incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError):
                answer += tls.read(65536)
        assert _status(answer) == 200
        raw.close()
    finally:
        for s in silent:
            s.close()
        server.stop()


def test_silent_connection_cut_at_its_deadline(certs: Certs) -> None:
    server = _tls_server(certs, handshake_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            assert _closed_by_server(s)  # a 10 s safety net, not a timing assertion
        anonymous = ssl.create_default_context(cafile=str(certs.ca))
        with urllib.request.urlopen(
            f"https://127.0.0.1:{server.port}/healthz", timeout=5, context=anonymous
        ) as r:
            assert r.status == 200
    finally:
        server.stop()


# ----------------------------------------------------------------------- item 6


def _good_request(close: bool = False) -> bytes:
    conn = b"Connection: close\r\n" if close else b""
    return HEAD + conn + b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: xchunked\r\n\r\n%x\r\n" % len(GOOD) + GOOD + b"\r\n0\r\n\r\n",
        b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(GOOD), len(GOOD) + 1) + GOOD,
        b"Transfer-Encoding: chunked, identity\r\n\r\n%x\r\n" % len(GOOD) + GOOD + b"\r\n0\r\n\r\n",
    ],
    ids=["xchunked", "two-content-lengths", "chunked-not-last"],
)
def test_ambiguous_framing_refused_and_nothing_after_it_runs(app: App, framing: bytes) -> None:
    port = app.otlp_http_port
    assert port is not None
    # the ambiguous request, then a valid one on the same connection (request smuggling)
    answer = _exchange(port, HEAD + framing + _good_request())
    assert _status(answer) == 400
    assert answer.count(b"HTTP/1.") == 1, answer
    assert _records(app) == 0
    # the listener is fine afterwards
    answer = _exchange(port, _good_request(close=True))
    assert _status(answer) == 200
    assert _records(app) == 2


def test_inline_routes_run_on_the_loop_and_the_rest_on_the_pool() -> None:
    """``/healthz`` is registered inline: a probe is answered on the server's loop thread,
    with no hand-off to a pool thread (each hand-off waits for the GIL behind busy
    threads); ordinary routes still run on the pool, where they may block."""
    import threading

    r = Router()
    r.add_route(
        "GET", "/flag", lambda req: Response.text(200, threading.current_thread().name), inline=True
    )
    r.add_route("GET", "/work", lambda req: Response.text(200, threading.current_thread().name))
    s = HttpServer("127.0.0.1", 0, r)
    s.start()
    try:
        base = f"http://127.0.0.1:{s.port}"
        with urllib.request.urlopen(f"{base}/flag", timeout=5) as resp:
            on_flag = resp.read().decode().strip()
        with urllib.request.urlopen(f"{base}/work", timeout=5) as resp:
            on_work = resp.read().decode().strip()
    finally:
        s.stop()
    assert on_flag != on_work
    assert r.inline(r.resolve("GET", "/flag")[0]) and not r.inline(r.resolve("GET", "/work")[0])
    # the loop thread is named after the listener; pool threads add a worker suffix
    assert on_work.startswith(on_flag + "_"), (on_flag, on_work)


def test_daemon_answers_healthz_on_its_loop(app: App) -> None:
    handler, _ = app.router.resolve("GET", "/healthz")
    assert handler is not None and app.router.inline(handler)
    readyz, _ = app.router.resolve("GET", "/readyz")
    assert readyz is not None and not app.router.inline(readyz)  # its checks may touch disk
