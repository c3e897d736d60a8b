"""Issue 32's attacks on the HTTP listeners of a real ``coeffd serve`` (TLS on the API and
OTLP/HTTP, mTLS on OTLP/HTTP, chart-sized limits), each while a kubelet-like prober asks
``GET /healthz`` over a new HTTPS connection every 50 ms:

1. negative chunk size: 4 connections send ``-1`` then stream junk (the old server read
   it all: 400 MiB → RSS 922 MB, four in parallel 3 GB);
2. tiny chunks: 2 connections send bodies of 2-byte chunks under the body limit (the old
   server kept one object per chunk: 30 MiB → 2.2 GB);
3. TLS handshake slots: 300 TCP connections to each HTTPS port that never send a
   ClientHello (the old server gave each a slot: 28 of 29 probes got 503), held 3 s
   with an export with a client certificate meanwhile; three rounds, each after 3 s
   idle, so the probes' p99 idle and under the flood come from the same run (pooled
   over the rounds) and their ratio is printed;
4. KV forged sequence number: 100 valid batches, one numbered 2⁶², 2,000 valid ones on
   the daemon's KV subscriber, counted back from ``/metrics`` (:mod:`bench.kvforge`).

Printed per attack: what the attacker got, the daemon's peak RSS (``VmHWM``) against the
chart's ``resources.limits.memory``, and the probes' p99 / failures. Targets: peak RSS
within the limit, ``/healthz`` p99 ≤ 50 ms, no failed probe, every valid KV batch
accepted.
"""

from __future__ import annotations

import http.client
import multiprocessing
import socket
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq
from prometheus_client.parser import text_string_to_metric_families

from bench.kvforge import forged_frame
from bench.serve import ROOT, DaemonProc

CHART_LIMIT_MB = 1536.0  # helm/coeffd/values.yaml resources.limits.memory
P99_TARGET_S = 0.050


def _probe_loop(port: int, ca: str | None, period: float, conn: Any, stop: Any) -> None:
    """The prober's process: probe until ``stop`` is set; on each request on ``conn``
    send back (latencies, failures) since the last one. Over TLS trusting ``ca``, or
    plain HTTP when ``ca`` is None."""
    ctx = ssl.create_default_context(cafile=ca) if ca is not None else None
    lat: list[float] = []
    fail: list[str] = []
    while not stop.is_set():
        if conn.poll():
            conn.recv()
            conn.send((lat, fail))
            lat, fail = [], []
        time.sleep(period)
        t0 = time.perf_counter()
        try:
            c: http.client.HTTPConnection = (
                http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
                if ctx is not None
                else http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            )
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status != 200:
                fail.append(str(r.status))
        except (OSError, http.client.HTTPException) as e:
            fail.append(type(e).__name__)
        lat.append(time.perf_counter() - t0)


class Prober:
    """``GET /healthz`` on a new TLS connection every ``period`` s (as the kubelet does),
    from its own process so that the attacking threads do not slow the probes."""

    def __init__(self, port: int, ca: Path, period: float = 0.05) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._stop = multiprocessing.Event()
        self._proc = multiprocessing.Process(
            target=_probe_loop, args=(port, str(ca), period, child, self._stop), daemon=True
        )
        self._proc.start()

    def take(self) -> tuple[list[float], list[str]]:
        """(latencies in seconds, failures) since the last call."""
        self._conn.send("take")
        got, failures = self._conn.recv()
        return list(got), list(failures)

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(10)


def _head(host_port: int, extra: bytes) -> bytes:
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/x-protobuf\r\n" % host_port
    ) + extra


def _tls_socket(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def negative_chunk(port: int, ctx: ssl.SSLContext, junk_mb: int = 100) -> str:
    """Four connections: chunk size -1, then up to ``junk_mb`` MiB of junk each."""
    outcomes: list[str] = []

    def one() -> None:
        s = _tls_socket(port, ctx)
        sent = 0
        try:
            s.sendall(_head(port, b"Transfer-Encoding: chunked\r\n\r\n-1\r\n"))
            junk = b"x" * (1 << 20)
            for _ in range(junk_mb):
                s.sendall(junk)
                sent += 1
        except OSError:
            pass
        try:
            s.settimeout(5)
            answer = s.recv(200)
        except OSError:
            answer = b""
        s.close()
        status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed"
        outcomes.append(f"{status} after {sent} MiB")

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ", ".join(sorted(outcomes))


def tiny_chunks(port: int, ctx: ssl.SSLContext, body_mb: int = 8) -> str:
    """Two connections, ``body_mb`` MiB each in 2-byte chunks (under the body limit); the
    answer and how much of the body (MiB on the wire, 3.5 per MiB) was sent before it."""
    outcomes: list[str] = []

    def one() -> None:
        s = _tls_socket(port, ctx)
        piece = b"2\r\nxx\r\n" * 16384
        sent = 0
        try:
            s.sendall(_head(port, b"Transfer-Encoding: chunked\r\n\r\n"))
            for _ in range(body_mb * (1 << 20) // (2 * 16384)):
                s.sendall(piece)
                sent += len(piece)
            s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # cut off: the answer may still be there
        try:
            s.settimeout(30)
            answer = s.recv(200)
        except OSError as e:
            answer = type(e).__name__.encode()
        s.close()
        status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else answer or b"closed"
        outcomes.append(f"{status.decode()} after {sent / (1 << 20):.1f} MiB")

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return f"{body_mb} MiB of 2-byte chunks ×2: answered " + ", ".join(sorted(outcomes))


def silent_tls(ports: list[int], n: int, hold_s: float, export: Any) -> str:
    """``n`` TCP connections per port that never handshake, held ``hold_s``; then
    ``export()`` (an mTLS OTLP/HTTP request) must still succeed."""
    held = [socket.create_connection(("127.0.0.1", p)) for p in ports for _ in range(n)]
    time.sleep(hold_s)
    status = export()
    for s in held:
        s.close()
    return f"{len(held)} silent connections held {hold_s:.0f} s; mTLS export → {status}"


def p99(latencies: list[float]) -> float:
    """The 99th percentile (nan for none)."""
    lat = sorted(latencies)
    return lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")


def _https_total(port: int, ctx: ssl.SSLContext) -> Any:
    """``total(name, **labels)`` over the daemon's HTTPS ``/metrics``."""

    def total(name: str, **labels: str) -> float:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        finally:
            c.close()
        return sum(
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    return total


def run(tmp: Path, rounds: int = 3) -> int:
    """Start a TLS daemon, run the attacks, print peak RSS and probe p99 per attack."""
    sys.path.insert(0, str(ROOT / "tests" / "receivers"))
    from tls_certs import make_certs  # the tests' certificate factory (cryptography)

    from bench.soak import free_port

    (tmp / "certs").mkdir(parents=True, exist_ok=True)
    certs = make_certs(tmp / "certs")
    tls = {"cert_file": certs.server_cert, "key_file": certs.server_key}
    settings = [f"--set=http.tls.{k}={v}" for k, v in tls.items()]
    settings += [f"--set=receivers.otlp_http.tls.{k}={v}" for k, v in tls.items()]
    kv = f"tcp://127.0.0.1:{free_port()}"
    settings += [
        f"--set=receivers.otlp_http.tls.client_ca_file={certs.ca}",
        # the chart's sizes (helm/coeffd/values.yaml)
        "--set=receivers.otlp_http.max_body_bytes=16777216",
        "--set=receivers.otlp_http.max_connections=8",
        "--set=pipeline.consumer=counting",
        f"--kv-endpoint={kv}",
        "--set=kv.bind=true",
    ]
    d = DaemonProc(tmp / "daemon", *settings)
    client = ssl.create_default_context(cafile=str(certs.ca))
    client.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    api, otlp = d.ports["http"], d.ports["otlp_http"]

    def export() -> str:
        c = http.client.HTTPSConnection("127.0.0.1", otlp, context=client, timeout=10)
        try:
            c.request("POST", "/v1/traces", body=b"", headers={"Content-Type": PROTOBUF})
            return str(c.getresponse().status)
        except (OSError, http.client.HTTPException) as e:
            return type(e).__name__
        finally:
            c.close()

    prober = Prober(api, certs.ca)
    ok = True

    def row(name: str, outcome: str, lat: list[float], failures: list[str]) -> None:
        nonlocal ok
        peak = d.hwm_mb()
        ok &= peak <= CHART_LIMIT_MB and p99(lat) <= P99_TARGET_S and not failures
        fails = f"; {len(failures)} probes failed ({', '.join(sorted(set(failures)))})"
        print(
            f"  {name:34s} {peak:11.0f} {p99(lat) * 1e3:7.1f} {len(lat):6d}  {outcome}"
            + (fails if failures else "")
        )

    print(
        f"\nHTTP attacks on a TLS daemon (API TLS, OTLP/HTTP mTLS, 16 MiB body limit, 8 "
        f"connections); /healthz probed over HTTPS every 50 ms; chart memory limit "
        f"{CHART_LIMIT_MB:.0f} MB"
    )
    print(f"  {'attack':34s} {'peak RSS MB':>11s} {'p99 ms':>7s} {'probes':>6s}  outcome")
    try:
        time.sleep(1.0)
        prober.take()
        attacks = (
            ("1 negative chunk size ×4", lambda: negative_chunk(otlp, client)),
            ("1 negative chunk size on the API", lambda: negative_chunk(api, client, 20)),
            ("2 tiny chunks", lambda: tiny_chunks(otlp, client)),
        )
        for name, attack in attacks:
            outcome = attack()
            row(name, outcome, *prober.take())
        idle: list[float] = []
        flood: list[float] = []
        for i in range(rounds):
            time.sleep(3.0)
            lat, failures = prober.take()
            row(f"idle (reference), round {i + 1}", "—", lat, failures)
            idle += lat
            outcome = silent_tls([api, otlp], 300, 3, export)
            lat, failures = prober.take()
            row(f"3 never-handshaking, round {i + 1}", outcome, lat, failures)
            flood += lat
        print(
            f"  3 /healthz p99 pooled over {rounds} rounds: idle {p99(idle) * 1e3:.1f} ms "
            f"({len(idle)} probes), under the flood {p99(flood) * 1e3:.1f} ms "
            f"({len(flood)}): {p99(flood) / p99(idle):.2f}x idle"
        )
        print(f"  after the attacks: mTLS export → {export()}")
        forged = forged_frame(_https_total(api, client), kv, zmq.Context.instance())
        ok &= forged.ok
        print(f"  4 KV forged frame: {forged}")
    finally:
        prober.stop()
        d.stop()
    verdict = "met" if ok else "MISSED"
    print(
        f"target: peak RSS ≤ {CHART_LIMIT_MB:.0f} MB, /healthz p99 ≤ 50 ms, no failed probe, "
        f"every valid KV batch accepted: {verdict}"
    )
    return 0 if ok else 1


PROTOBUF = "application/x-protobuf"


def _cap_server(cap: int, port_file: str, stop: Any) -> None:
    """The child process of :func:`cap_flood`: a plain server, ``/healthz`` on its loop
    as the daemon's is, until ``stop`` is set."""
    from coeffd.base.http import HttpServer, Response, Router

    router = Router()
    router.add_route("GET", "/healthz", lambda _req: Response.text(200, "ok"), inline=True)
    server = HttpServer("127.0.0.1", 0, router, max_connections=cap)
    server.start()
    Path(port_file).write_text(str(server.port))
    stop.wait()
    server.stop()


def cap_flood(tmp: Path, cap: int = 64, floods: int = 3, n: int = 600) -> int:
    """Issue 32's silent flood on a plain server at a connection cap: the server in one
    process (this tree's ``coeffd``), ``n`` silent connections held 3 s from this one, a
    prober in a third asking ``GET /healthz`` every 50 ms over a new connection; 2 s idle
    before each flood. Prints the probes' p99 and max per flood; target p99 ≤ 50 ms and
    no failed probe. At a cap below ``n`` every connection past it cuts another."""
    port_file = tmp / "cap-port"
    stop = multiprocessing.Event()
    server = multiprocessing.Process(
        target=_cap_server, args=(cap, str(port_file), stop), daemon=True
    )
    server.start()
    for _ in range(300):
        if port_file.exists() and port_file.read_text():
            break
        time.sleep(0.05)
    port = int(port_file.read_text())
    conn, child = multiprocessing.Pipe()
    probe_stop = multiprocessing.Event()
    prober = multiprocessing.Process(
        target=_probe_loop, args=(port, None, 0.05, child, probe_stop), daemon=True
    )
    prober.start()
    ok = True
    print(f"\nSilent flood on a plain server at max_connections {cap}: {n} connections held 3 s")
    print(f"  {'flood':5s} {'p99 ms':>7s} {'max ms':>7s} {'probes':>6s}  idle p99 ms")
    try:
        time.sleep(1.0)
        for i in range(floods):
            time.sleep(2.0)
            conn.send("take")
            idle, _ = conn.recv()
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
            time.sleep(3.0)
            conn.send("take")
            lat, failures = conn.recv()
            for s in held:
                s.close()
            ok &= p99(lat) <= P99_TARGET_S and not failures
            fails = f"; {len(failures)} probes failed ({', '.join(sorted(set(failures)))})"
            print(
                f"  {i + 1:5d} {p99(lat) * 1e3:7.1f} {max(lat, default=0) * 1e3:7.1f} "
                f"{len(lat):6d}  {p99(idle) * 1e3:.1f}" + (fails if failures else "")
            )
    finally:
        probe_stop.set()
        prober.join(10)
        stop.set()
        server.join(10)
    print(f"target: /healthz p99 ≤ 50 ms, no failed probe: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1
