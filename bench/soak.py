"""``python -m bench soak``: one ``coeffd serve`` under valid traffic, garbage and attacks.

Issue 17's hardening criteria, measured on one daemon process (pinned to one core, the
sender and attackers on the other) for ``--duration`` seconds (default 10 minutes):

* **valid traffic**: simfleet's fleet replayed live over OTLP/gRPC (:class:`LiveSender`,
  data time = real time) at ``--rate`` events/s, plus a valid KV-event batch every second;
* **garbage**: random bytes on OTLP/gRPC, OTLP/HTTP (protobuf, JSON, gzip) and ZMQ, random
  API paths and methods;
* **the attacks of issue 17**: resource attributes naming files (a FIFO, a large file)
  as the model / GPU; undecodable and deeply nested ZMQ messages; forged KV sequence
  numbers (1,000 DP ranks jumping to 10⁹, a seq of 2⁶⁴−1); decode amplification (bodies
  as large as the chart allows, of empty ``ResourceSpans`` / empty spans, also three at once); distinct 1 MB
  resource attributes; over-size gRPC messages; gzip bombs; JSON nested 2,000 deep;
  ``?version=`` with 300 digits, Unicode digits, ``1_0``; idle and half-sent
  connections; connect bursts; a checkpoint with a valid checksum but a list inside
  (placed before start-up); a second daemon started on the same gRPC port;
* **issue 32's**: a chunk size of -1 followed by 50 MiB of junk, 8 MiB in 2-byte chunks
  (both on OTLP/HTTP); 600 connections that never send a byte (300 per HTTP port; the
  soak's ports are plain, the TLS variant of item 3 is ``bench dos --part http``); after
  the attacks, item 4's exact case on the live KV subscriber (:mod:`bench.kvforge`: 100
  valid batches, one numbered 2⁶², 2,000 valid ones, all counted back from ``/metrics``).

The daemon runs with the Helm chart's receiver bounds (request bytes, items, threads:
``helm/coeffd/values.yaml``, whose memory limit is derived from them). First, unless
``--baseline 0``, the same valid traffic alone runs on its own daemon (default: half the
duration), the baseline of the ratios. Reported, with targets: crashes (0: the process
never exits, the pipeline worker is never reported dead), ``/healthz`` answering 200 to
every probe of a 10 Hz prober that opens a new connection per probe like kubelet, and its
p99 (≤ 50 ms, issue 32; also against the baseline's), peak RSS (``VmHWM``) against the idle RSS
and the baseline's (within the chart's memory limit), learning
(``coeffd_learner_observations_total`` rises between every two samples after the first
join window), nothing lost that was acknowledged (every event of an acknowledged valid
request is counted received or sampled out, the queue drains, no consumer error, the SIGTERM drain
completes), the KV subscriber still counting valid batches after the attacks, a second
daemon refused the port. Each attack's answers and slowest answer, and the daemon's
warnings and errors by event, are listed, so an attack that still hurts shows by name.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
import zmq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.kvforge import ForgedFrameResult, forged_frame
from bench.serve import EXPORT, RATES, ROOT, DaemonProc, LiveSender, Recording, _pin, record
from coeffd.daemon.learning.checkpoints import encode_state
from coeffd.simfleet import replica
from coeffd.simfleet.kv import encode_batch

WINDOW_S = 30.0  # the daemon's default joiner.window_s: learning starts a window late
HEALTH_P99_TARGET_S = 0.05
NO_STOP_LINE = 'no "coeffd stopped" log line'
VALUES = ROOT / "helm" / "coeffd" / "values.yaml"


def chart_bounds() -> tuple[list[str], float, int]:
    """The chart's receiver bounds as ``--set`` flags, its memory limit (MiB) and its
    largest request (bytes): the soak runs the daemon as the chart deploys it."""
    values = yaml.safe_load(VALUES.read_text())
    r = values["settings"]["receivers"]
    keys = {
        "receivers.otlp_grpc.max_message_bytes": r["otlp_grpc"]["max_message_bytes"],
        "receivers.otlp_grpc.workers": r["otlp_grpc"]["workers"],
        "receivers.otlp_http.max_body_bytes": r["otlp_http"]["max_body_bytes"],
        "receivers.otlp_http.max_connections": r["otlp_http"]["max_connections"],
        **{f"receivers.limits.{k}": v for k, v in r["limits"].items()},
    }
    flags = [f for k, v in keys.items() for f in ("--set", f"{k}={v}")]
    limit = str(values["resources"]["limits"]["memory"])
    mib = float(limit[:-2]) * (1024 if limit.endswith("Gi") else 1)
    biggest = max(r["otlp_grpc"]["max_message_bytes"], r["otlp_http"]["max_body_bytes"])
    return flags, mib, int(biggest)


FLAGS, RSS_LIMIT_MB, BIG = chart_bounds()
#: The bench kills a daemon past this RSS and counts an OOM crash (Kubernetes would at
#: the chart's limit already); it protects the machine from an unfixed amplification.
RSS_GUARD_MB = 2 * RSS_LIMIT_MB


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def empty_resource_spans(size: int) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``size // 2`` empty ``ResourceSpans``."""
    return b"\x0a\x00" * (size // 2)


def empty_spans(size: int) -> bytes:
    """One resource, one scope, ``~size // 2`` empty spans."""
    spans = b"\x12\x00" * ((size - 16) // 2)
    return _field(1, _field(2, spans))


def deep_json(depth: int) -> bytes:
    return b'{"resourceSpans":' + b"[" * depth + b"]" * depth + b"}"


def deep_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


@dataclass
class Tally:
    """What one attack (or the valid sender) got back."""

    sent: int = 0
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    slowest_s: float = 0.0

    def add(self, answer: str, seconds: float) -> None:
        self.sent += 1
        self.answers[answer] += 1
        self.slowest_s = max(self.slowest_s, seconds)


class Soak:
    """The daemon, the valid senders, the attackers, the prober and the sampler."""

    def __init__(self, d: DaemonProc, rec: Recording, kv_port: int, tmp: Path, rate: float):
        self.d, self.rec, self.tmp, self.rate = d, rec, tmp, rate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.tallies: dict[str, Tally] = collections.defaultdict(Tally)
        self.acked_events = 0
        self.pushbacks = 0
        self.health: list[tuple[float, float, int]] = []  # (t, seconds, status)
        self.health_why: dict[int, str] = {}  # status -> the first answer's body
        self.ready_fail = collections.Counter[str]()
        self.oom = ""
        self.inflight = collections.Counter[str]()
        self.peak_mb = 0.0  # the highest RSS the sampler saw (VmHWM is gone with the process)
        self.timeline: list[tuple[float, float, float, float, float, float]] = []
        self.t0 = time.monotonic()
        self.grpc = grpc.insecure_channel(
            f"127.0.0.1:{d.ports['otlp_grpc']}",
            options=[("grpc.max_send_message_length", 64 << 20)],
        )
        self.export = self.grpc.unary_unary(EXPORT)
        self.zctx = zmq.Context.instance()
        self.kv_endpoint = f"tcp://127.0.0.1:{kv_port}"
        self.engine_requests = [
            r
            for r in rec.requests
            if any(
                s.name.startswith("scheduler_steps")
                for rs in r.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            )
        ] or rec.requests
        fifo = tmp / "model.fifo"
        os.mkfifo(fifo)
        big = tmp / "gpu.bin"
        with big.open("wb") as f:  # reads as 256 MB of zeros, like a bounded /dev/zero
            f.truncate(256 << 20)
        self.fifo, self.bigfile = fifo, big
        self.bodies = {
            "empty_resource_spans": empty_resource_spans(BIG - 64),
            "empty_spans": empty_spans(BIG - 64),
        }
        self.gzip_bomb = gzip.compress(b"\0" * (BIG + (1 << 20)), 9)
        self.gzip_mb = (BIG >> 20) + 1

    # ----------------------------------------------------------------- plumbing
    def url(self, port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.d.ports[port]}{path}"

    def tally(self, name: str, answer: str, seconds: float) -> None:
        with self.lock:
            self.tallies[name].add(answer, seconds)

    @contextlib.contextmanager
    def attacking(self, name: str) -> Iterator[None]:
        """Mark ``name`` in flight (an OOM kill names the attacks it interrupted)."""
        with self.lock:
            self.inflight[name] += 1
        try:
            yield
        finally:
            with self.lock:
                self.inflight[name] -= 1

    def call_grpc(self, name: str, body: bytes, timeout: float = 120.0) -> None:
        t = time.monotonic()
        with self.attacking(name):
            try:
                self.export(body, timeout=timeout)
                answer = "OK"
            except grpc.RpcError as e:
                answer = e.code().name
        self.tally(name, answer, time.monotonic() - t)

    def call_http(
        self, name: str, port: str, path: str, body: bytes | None = None, method: str = "GET",
        headers: dict[str, str] | None = None, timeout: float = 120.0,
    ) -> None:  # fmt: skip
        req = urllib.request.Request(self.url(port, path), data=body, method=method)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        t = time.monotonic()
        with self.attacking(name):
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    r.read()
                    answer = str(r.status)
            except urllib.error.HTTPError as e:
                answer = str(e.code)
            except (OSError, ValueError) as e:
                answer = type(getattr(e, "reason", e)).__name__
        self.tally(name, answer, time.monotonic() - t)

    def live(self, req: ExportTraceServiceRequest, tag: int) -> ExportTraceServiceRequest:
        """A copy of a recorded request as engine ``tag`` sends it now."""
        wall0 = min(
            s.start_time_unix_nano
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        )
        return replica(req, tag, time.time_ns() - wall0 - 2_000_000_000)

    # ------------------------------------------------------------- valid traffic
    def valid_sender(self) -> None:
        sender = LiveSender(self.d.ports["otlp_grpc"], self.rec)
        plan = sender.plan(sender.offered(self.rate))
        inflight: collections.deque[tuple[Any, bytes, int]] = collections.deque()

        def settle(block: bool) -> None:
            while inflight and (block or inflight[0][0].done()):
                fut, body, n = inflight.popleft()
                try:
                    fut.result(timeout=60)
                    with self.lock:
                        self.acked_events += n
                except grpc.RpcError as e:
                    if e.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    ):
                        with self.lock:
                            self.pushbacks += 1
                        time.sleep(0.05)  # as the exporter backs off, then resends
                        inflight.append((sender.export.future(body, timeout=60), body, n))
                    else:
                        self.tally("valid (unexpected answers)", e.code().name, 0.0)
                block = False

        try:
            for due, body, n in plan:
                if self.stop.is_set():
                    break
                while (now := time.monotonic()) < due and not self.stop.is_set():
                    settle(False)
                    time.sleep(min(0.002, due - now))
                if len(inflight) >= 8:
                    settle(True)
                inflight.append((sender.export.future(body, timeout=60), body, n))
            while inflight:
                settle(True)
        finally:
            sender.close()

    def valid_kv(self) -> None:
        sock = self.zctx.socket(zmq.PUB)
        sock.connect(self.kv_endpoint)
        seq = 0
        while not self.stop.wait(1.0):
            payload = encode_batch(time.time(), [("BlockRemoved", [seq + 1], "GPU")], 4096)
            sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])
            seq += 1
        sock.close(0)

    # -------------------------------------------------------------------- attacks
    def a_grpc_garbage(self, rnd: random.Random) -> None:
        self.call_grpc("gRPC random bytes", rnd.randbytes(rnd.randrange(1, 65536)), 30)

    def a_http_garbage(self, rnd: random.Random) -> None:
        body = rnd.randbytes(rnd.randrange(1, 65536))
        ctype = rnd.choice(["application/x-protobuf", "application/json", "text/plain"])
        enc = rnd.choice(["", "gzip", "deflate", "br"])
        headers = {"Content-Type": ctype} | ({"Content-Encoding": enc} if enc else {})
        self.call_http("HTTP random bodies", "otlp_http", "/v1/traces", body, "POST", headers, 30)

    def a_gzip_bomb(self, rnd: random.Random) -> None:
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        self.call_http(
            f"HTTP gzip bomb ({self.gzip_mb} MB inflated)",
            "otlp_http",
            "/",
            self.gzip_bomb,
            "POST",
            headers,
        )

    def a_deep_json(self, rnd: random.Random) -> None:
        self.call_http(
            "HTTP JSON nested 2,000 deep", "otlp_http", "/v1/traces", deep_json(2000), "POST",
            {"Content-Type": "application/json"},
        )  # fmt: skip

    def a_amplification(self, rnd: random.Random) -> None:
        kind = rnd.choice(sorted(self.bodies))
        body = self.bodies[kind]
        if rnd.random() < 0.5:
            self.call_grpc(f"gRPC {BIG >> 20} MB of {kind}", body)
        else:
            headers = {"Content-Type": "application/x-protobuf"}
            self.call_http(
                f"HTTP {BIG >> 20} MB of {kind}", "otlp_http", "/v1/traces", body, "POST", headers
            )

    def a_amplification_x3(self, rnd: random.Random) -> None:
        body = self.bodies["empty_resource_spans"]
        threads = [
            threading.Thread(target=self.call_grpc, args=(f"gRPC 3 × {BIG >> 20} MB at once", body))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def a_oversize(self, rnd: random.Random) -> None:
        over = BIG + (8 << 20)
        self.call_grpc(f"gRPC {over >> 20} MB message (over the limit)", b"\x0a\x00" * (over // 2))

    def a_big_resource(self, rnd: random.Random) -> None:
        req = self.live(rnd.choice(self.engine_requests), 900_000 + rnd.randrange(1 << 20))
        for rs in req.resource_spans:
            kv = rs.resource.attributes.add()
            kv.key = "attack.blob"
            kv.value.string_value = rnd.randbytes(512 << 10).hex()  # 1 MB, distinct
        self.call_grpc("gRPC distinct 1 MB resource attribute", req.SerializeToString())

    def a_file_paths(self, rnd: random.Random) -> None:
        path = rnd.choice([str(self.fifo), str(self.bigfile)])
        key = "coeffd.model" if path == str(self.fifo) else "coeffd.gpu"
        req = self.live(rnd.choice(self.engine_requests), 800_000 + rnd.randrange(1 << 20))
        for rs in req.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key == key:
                    kv.value.string_value = path
                elif kv.key == "service.name":
                    kv.value.string_value = (
                        f"attack-{rnd.randrange(1 << 30)}"  # a new configuration
                    )
        self.call_grpc(
            f"gRPC {key} = a file path ({'FIFO' if 'fifo' in path else '256 MB file'})",
            req.SerializeToString(),
        )

    def _kv_send(self, frames_list: list[list[bytes]], name: str) -> None:
        sock = self.zctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(self.kv_endpoint)
        time.sleep(0.3)  # PUB/SUB: let the subscription arrive
        for frames in frames_list:
            sock.send_multipart(frames)
            self.tally(name, "sent", 0.0)
        sock.close(2000)

    def a_kv_garbage(self, rnd: random.Random) -> None:
        seq = rnd.randrange(1 << 20).to_bytes(8, "big")
        self._kv_send(
            [
                [b"", seq, b"\xa1\xff"],
                [b"", seq, deep_msgpack(2000)],
                *(
                    [b"", rnd.randbytes(8), rnd.randbytes(rnd.randrange(1, 4096))]
                    for _ in range(20)
                ),
                [rnd.randbytes(3)],
                [b"", b"\x01", b"x", b"y", b"z"],
            ],
            "ZMQ invalid UTF-8, 2,000-deep nest, random frames",
        )

    def a_kv_seq(self, rnd: random.Random) -> None:
        ok = encode_batch(time.time(), [("BlockRemoved", [1], "GPU")], 0)
        frames = []
        for rank in range(1000):
            p = encode_batch(time.time(), [("BlockRemoved", [1], "GPU")], rank)
            frames += [[b"", (1).to_bytes(8, "big"), p], [b"", (10**9).to_bytes(8, "big"), p]]
        frames.append([b"", (2**64 - 1).to_bytes(8, "big"), ok])
        self._kv_send(frames, "ZMQ forged seq (1,000 ranks → 10⁹, 2⁶⁴−1)")

    def a_api(self, rnd: random.Random) -> None:
        path = rnd.choice(
            [
                "/v1/coefficients/x?version=" + "9" * 300,
                "/v1/coefficients/x?version=%D9%A1%D9%A2",  # Arabic-Indic digits
                "/v1/coefficients/x?version=1_0",
                "/v1/coefficients/" + "a" * 4000,
                "/v1/configurations?" + "&".join(f"k{i}=v" for i in range(2000)),
                "/" + rnd.randbytes(8).hex(),
                "/v1/coefficients/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
            ]
        )
        method = rnd.choice(["GET", "GET", "POST", "DELETE"])
        self.call_http("API abuse (paths, versions, methods)", "http", path, None, method, None, 30)

    def _sockets(self, port: str, n: int) -> list[socket.socket]:
        out = []
        for _ in range(n):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", self.d.ports[port]), timeout=5)
                out.append(s)
        return out

    def a_idle(self, rnd: random.Random) -> None:
        held = self._sockets("otlp_http", 100) + self._sockets("http", 100)
        for i, s in enumerate(held):  # half send half a request line and stall
            if i % 2:
                with contextlib.suppress(OSError):
                    s.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Length: 1000\r\n")
        self.tally("200 idle / half-sent connections held 60 s", f"{len(held)} opened", 0.0)
        self.stop.wait(60)
        for s in held:
            s.close()

    def _raw_http(self, name: str, head: bytes, body: Iterator[bytes]) -> None:
        """Send ``head`` then ``body``'s pieces on a raw OTLP/HTTP socket; tally the
        status line the daemon answers (or how the connection ended)."""
        t = time.monotonic()
        with self.attacking(name):
            try:
                with socket.create_connection(("127.0.0.1", self.d.ports["otlp_http"]), 30) as s:
                    s.sendall(head)
                    with contextlib.suppress(OSError):  # the daemon may answer and close first
                        for piece in body:
                            s.sendall(piece)
                    got = s.recv(64)
                answer = got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/") else "closed"
            except OSError as e:
                answer = type(e).__name__
        self.tally(name, answer, time.monotonic() - t)

    _CHUNKED = (
        b"POST /v1/traces HTTP/1.1\r\nHost: coeffd\r\nContent-Type: application/x-protobuf\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )

    def a_negative_chunk(self, rnd: random.Random) -> None:
        """Issue 32.1: chunk size -1, then 50 MiB of junk (the old server read it all)."""
        junk = b"x" * (1 << 20)
        self._raw_http(
            "chunk size -1 + 50 MiB junk (issue 32.1)",
            self._CHUNKED + b"-1\r\n",
            (junk for _ in range(50)),
        )

    def a_tiny_chunks(self, rnd: random.Random) -> None:
        """Issue 32.2: 8 MiB in 2-byte chunks (the old server kept an object per chunk)."""
        piece = b"2\r\nxx\r\n" * 16384
        pieces = (piece for _ in range(8 * (1 << 20) // (2 * 16384)))
        self._raw_http(
            "8 MiB in 2-byte chunks (issue 32.2)",
            self._CHUNKED,
            itertools.chain(pieces, [b"0\r\n\r\n"]),
        )

    def a_silent_flood(self, rnd: random.Random) -> None:
        """Issue 32.3 on the plain ports: 300 connections each that never send a byte,
        held 5 s (they may take no slot a probe or an export needs)."""
        held = self._sockets("otlp_http", 300) + self._sockets("http", 300)
        self.tally("600 silent connections held 5 s (issue 32.3)", f"{len(held)} opened", 0.0)
        self.stop.wait(5)
        for s in held:
            s.close()

    def a_connect_burst(self, rnd: random.Random) -> None:
        threads = [
            threading.Thread(
                target=self.call_http,
                args=("60 concurrent connects to /healthz", "http", "/healthz"),
            )
            for _ in range(60)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -------------------------------------------------------------- observation
    def prober(self) -> None:
        url, ready = self.url("http", "/healthz"), self.url("http", "/readyz")
        n = 0
        while not self.stop.wait(0.1):
            t = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
                self.health_why.setdefault(status, e.read().decode(errors="replace").strip())
            except OSError as e:
                status = 0
                self.health_why.setdefault(status, str(e))
            self.health.append((t - self.t0, time.monotonic() - t, status))
            n += 1
            if n % 10 == 0:
                try:
                    with urllib.request.urlopen(ready, timeout=10):
                        pass
                except urllib.error.HTTPError as e:
                    self.ready_fail[e.read().decode(errors="replace").strip()[:120]] += 1
                except OSError as e:
                    self.ready_fail[f"no answer: {e}"] += 1

    def sampler(self) -> None:
        n = 0
        while not self.stop.wait(0.5):
            n += 1
            with contextlib.suppress(OSError):
                rss = self.d.rss_mb()
                self.peak_mb = max(self.peak_mb, rss)
                if rss > RSS_GUARD_MB:
                    with self.lock:
                        busy = sorted(k for k, v in self.inflight.items() if v)
                    self.oom = (
                        f"RSS {rss:.0f} MB at {time.monotonic() - self.t0:.0f} s: killed by the "
                        f"bench's {RSS_GUARD_MB:.0f} MB guard (the pod is OOM-killed at "
                        f"{RSS_LIMIT_MB:.0f} MB); attacks in flight: {', '.join(busy) or 'none'}"
                    )
                    self.d.proc.kill()
                    return
            if n % 10:
                continue
            with contextlib.suppress(Exception):
                obs = self.d.total("coeffd_learner_observations_total")
                depth = self.d.total("coeffd_queue_depth")
                kv = self.d.total("coeffd_kv_batches_total")
                recent = [s for t, s, _ in self.health if t > time.monotonic() - self.t0 - 30]
                p99 = sorted(recent)[int(0.99 * (len(recent) - 1))] if recent else float("nan")
                self.timeline.append(
                    (time.monotonic() - self.t0, self.d.rss_mb(), obs, depth, p99, kv)
                )

    # ------------------------------------------------------------------- the run
    def run(self, duration: float, attack: bool = True) -> None:
        """Valid traffic, prober and sampler for ``duration`` s; with ``attack``, the
        attackers too."""
        attacks: list[tuple[Callable[[random.Random], None], float]] = [
            (self.a_grpc_garbage, 0.2),
            (self.a_http_garbage, 0.2),
            (self.a_api, 0.2),
            (self.a_kv_garbage, 2.0),
            (self.a_deep_json, 5.0),
            (self.a_gzip_bomb, 10.0),
            (self.a_big_resource, 2.0),
            (self.a_file_paths, 15.0),
            (self.a_oversize, 30.0),
            (self.a_amplification, 45.0),
            (self.a_kv_seq, 60.0),
            (self.a_idle, 90.0),
            (self.a_connect_burst, 30.0),
            (self.a_negative_chunk, 20.0),
            (self.a_tiny_chunks, 30.0),
            (self.a_silent_flood, 60.0),
        ]
        if not attack:
            attacks = []
        threads = [
            threading.Thread(target=f, name=f.__name__, daemon=True)
            for f in (self.valid_sender, self.valid_kv, self.prober, self.sampler)
        ]
        for i, (fn, period) in enumerate(attacks):
            threads.append(
                threading.Thread(
                    target=self._every, args=(fn, period, i), name=fn.__name__, daemon=True
                )
            )
        if attack:
            threads.append(
                threading.Thread(
                    target=self._once, args=(self.a_amplification_x3, duration / 2), daemon=True
                )
            )
        for t in threads:
            t.start()
        end = self.t0 + duration
        while time.monotonic() < end and self.d.proc.poll() is None:
            time.sleep(1.0)
        self.stop.set()
        deadline = time.monotonic() + 150  # the slowest call's timeout, plus some
        for t in threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))

    def _every(self, fn: Callable[[random.Random], None], period: float, seed: int) -> None:
        rnd = random.Random(seed)
        # first round staggered so the heavy ones do not all start together
        if self.stop.wait(period * rnd.random() + 3.0):
            return
        while not self.stop.is_set() and self.d.proc.poll() is None:
            with contextlib.suppress(Exception):
                fn(rnd)
            self.stop.wait(period)

    def _once(self, fn: Callable[[random.Random], None], at: float) -> None:
        if not self.stop.wait(at):
            fn(random.Random(99))

    def unblock_fifo(self) -> None:
        """Until the daemon exits, give a reader stuck on the FIFO (a daemon that opens
        paths named by telemetry) an end of file, so that it can shut down."""
        while self.d.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.2)

    def close(self) -> None:
        threading.Thread(target=self.unblock_fifo, daemon=True).start()
        self.grpc.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poisoned_checkpoint(state_dir: Path) -> None:
    """A checkpoint whose checksum is right and whose content is a list (issue 17.6)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "checkpoint.bin").write_bytes(encode_state([1, 2, 3]))


def second_daemon(tmp: Path, grpc_port: int) -> str:
    """Start another daemon on the soak daemon's gRPC port: it must refuse to start."""
    cmd = [
        sys.executable, "-m", "coeffd", "serve", "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint", "127.0.0.1:0", "--http-endpoint", "127.0.0.1:0",
        "--snapshot-dir", str(tmp / "second" / "snapshots"), "--state-dir", str(tmp / "second" / "state"),
    ]  # fmt: skip
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = p.wait(20)  # a daemon starts in ~2 s; one still up after 20 s is serving
        return f"refused (exit {code})"
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
        if p.poll() is None:
            p.kill()
        return "STARTED on the same port (traffic would split silently)"


def baseline(rec: Recording, tmp: Path, seconds: float, rate: float) -> tuple[Soak, float]:
    """The same valid traffic (OTLP/gRPC + KV) on a fresh daemon without attacks, for the
    ratios: the finished run and its peak RSS."""
    tmp.mkdir(parents=True)
    kv_port = free_port()
    d = DaemonProc(
        tmp, "--kv-endpoint", f"tcp://127.0.0.1:{kv_port}", "--set", "kv.bind=true", *FLAGS
    )
    soak = Soak(d, rec, kv_port, tmp, rate)
    try:
        soak.run(seconds, attack=False)
        return soak, d.hwm_mb()
    finally:
        soak.close()
        d.stop()
        soak.zctx.term()


def _rss_at(timeline: Sequence[tuple[float, ...]], at: float) -> float:
    """RSS (MB) of the last sample at or before ``at`` seconds."""
    before = [row[1] for row in timeline if row[0] <= at]
    return before[-1] if before else float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__)
    p.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--rate", type=float, default=5000.0, help="valid events/s (default 5,000)")
    p.add_argument(
        "--baseline",
        type=float,
        default=None,
        help="seconds of the same valid traffic without attacks first (default: half of "
        "--duration; 0 = none)",
    )
    args = p.parse_args(argv)
    base_s = args.duration / 2 if args.baseline is None else args.baseline
    _pin(0)
    print("recording the fleet scenario (simfleet, in memory)…", flush=True)
    rec = record("fleet", 20, 7, RATES)
    print(f"  {len(rec.requests)} export requests, {rec.total:,} events per round", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="coeffd-soak-"))
    base: tuple[Soak, float] | None = None
    if base_s > 0:
        print(f"baseline: {base_s:.0f} s of the valid traffic alone, on its own daemon", flush=True)
        base = baseline(rec, tmp / "baseline", base_s, args.rate)
    kv_port = free_port()
    extra = ("--kv-endpoint", f"tcp://127.0.0.1:{kv_port}", "--set", "kv.bind=true", *FLAGS)
    poisoned_checkpoint(tmp / "state")
    crashes: list[str] = []
    d = DaemonProc(tmp, *extra)
    startup = "started with the poisoned checkpoint"
    if not d.ports:
        failed = d.proc.wait(30)
        crashes.append(f"start-up with a poisoned checkpoint: exit {failed}: {d.last_lines(3)}")
        startup = f"FAILED to start (exit {failed}); restarted without it"
        (tmp / "state" / "checkpoint.bin").unlink()
        d = DaemonProc(tmp, *extra)
    time.sleep(3)
    idle_mb = d.rss_mb()
    port_share = second_daemon(tmp, d.ports["otlp_grpc"])
    soak = Soak(d, rec, kv_port, tmp, args.rate)
    print(
        f"soak: {args.duration:.0f} s, valid ~{args.rate:,.0f} events/s + KV, 14 attack kinds; "
        f"idle RSS {idle_mb:.0f} MB",
        flush=True,
    )
    try:
        soak.run(args.duration)
        alive = d.proc.poll() is None
        if soak.oom:
            crashes.append(soak.oom)
        elif not alive:
            crashes.append(
                f"daemon exited (code {d.proc.returncode}) during the soak: {d.last_lines(5)}"
            )
        drained_queue = False
        kv_after = kv_before = 0.0
        forged: ForgedFrameResult | None = None
        received = sampled_out = 0.0
        consumer_errors = 0.0
        if alive:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if d.total("coeffd_queue_depth") == 0:
                    drained_queue = True
                    break
                time.sleep(1)
            # The KV subscriber still takes valid batches after the attacks.
            kv_before = d.total("coeffd_kv_batches_total")
            sock = soak.zctx.socket(zmq.PUB)
            sock.connect(soak.kv_endpoint)
            time.sleep(0.5)
            for i in range(10):
                payload = encode_batch(time.time(), [("BlockRemoved", [i + 1], "GPU")], 4097)
                sock.send_multipart([b"", i.to_bytes(8, "big"), payload])
            time.sleep(2)
            sock.close(0)
            kv_after = d.total("coeffd_kv_batches_total")
            forged = forged_frame(d.total, soak.kv_endpoint, soak.zctx)
            # engine sampling skips whole engines on purpose under load (counted, not
            # decoded): accounted for, so not lost
            sampled_out = d.total("coeffd_events_sampled_out_total")
            received = d.total("coeffd_events_received_total") + sampled_out
            consumer_errors = d.total("coeffd_pipeline_consumer_errors_total")
            hwm_mb = d.hwm_mb()
        else:
            hwm_mb = soak.peak_mb
    finally:
        soak.close()
        code = d.stop_code()
        drained_line = d.find('"coeffd stopped"')
        soak.zctx.term()
    # ------------------------------------------------------------------ report
    print("\nattacks (answers; slowest answer):")
    for name, tally in sorted(soak.tallies.items()):
        answers = ", ".join(f"{k} ×{v}" for k, v in tally.answers.most_common())
        print(f"  {name:<55} {tally.sent:>6}  {answers}; slowest {tally.slowest_s:.2f} s")
    print(f"  {'second daemon on the same gRPC port':<55} {port_share}")
    print(f"  {'checkpoint with a valid checksum and a list inside':<55} {startup}")
    print(
        "\ntimeline (s, RSS MB, learner observations, queue depth, /healthz p99 over 30 s, "
        "KV batches):"
    )
    for at, rss, n_obs, depth, w_p99, kv in soak.timeline[:: max(1, len(soak.timeline) // 20)]:
        print(
            f"  {at:6.0f}  {rss:7.0f}  {n_obs:>12,.0f}  {depth:>8,.0f}  {w_p99 * 1e3:7.1f} ms"
            f"  {kv:>8,.0f}"
        )
    print("\ndaemon warnings and errors (count, first line):")
    for event, (count, line) in sorted(d.notable.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {count:>6}  {event}: {line[:240]}")
    lat = [s for _, s, _ in soak.health]
    bad = collections.Counter(st for _, _, st in soak.health if st != 200)
    p99 = _pct(lat, 0.99)
    obs = [(t, o) for t, _, o, _, _, _ in soak.timeline if t > WINDOW_S + 10]
    # between every two samples (a scrape can fail while the API port is under attack)
    rising = len(obs) >= 3 and all(b[1] > a[1] for a, b in itertools.pairwise(obs))
    lost = max(0.0, soak.acked_events - received) if alive else float("nan")
    versus = "no baseline run"
    if base is not None:
        b_soak, b_hwm = base
        b_lat = [x for _, x, _ in b_soak.health]
        b_at = b_soak.timeline[-1][0] if b_soak.timeline else 0.0
        b_rss, a_rss = _rss_at(b_soak.timeline, b_at), _rss_at(soak.timeline, b_at)
        versus = (
            f"baseline (valid traffic alone, {base_s:.0f} s): peak RSS {b_hwm:.0f} MB, "
            f"/healthz p99 {_pct(b_lat, 0.99) * 1e3:.1f} ms; under attack: peak "
            f"{hwm_mb / b_hwm:.2f}× the baseline's, RSS at {b_at:.0f} s {a_rss:.0f} vs "
            f"{b_rss:.0f} MB ({a_rss / b_rss:.2f}×), /healthz p99 "
            f"{p99 / _pct(b_lat, 0.99):.2f}× the baseline's"
        )
    print(
        f"\ncrashes: {len(crashes)}" + "".join(f"\n  {c}" for c in crashes)
        + f"\nRSS: idle {idle_mb:.0f} MB, peak (VmHWM) {hwm_mb:.0f} MB = {hwm_mb / idle_mb:.1f}× idle"
        f" (chart memory limit {RSS_LIMIT_MB:.0f} MB)"
        f"\n{versus}"
        f"\n/healthz: {len(lat)} probes, p50 {_pct(lat, 0.5) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
        f"max {max(lat, default=0) * 1e3:.0f} ms; non-200: {dict(bad) or 'none'}"
        + "".join(f"\n  {st}: {why[:200]!r}" for st, why in soak.health_why.items())
        + f"\n/readyz failures: {dict(soak.ready_fail) or 'none'}"
        f"\nlearning: observations {obs[0][1] if obs else 0:,.0f} → {obs[-1][1] if obs else 0:,.0f} "
        f"after the first window; rising between every two of {len(obs)} samples: {rising}"
        f"\nvalid traffic: {soak.acked_events:,} events acknowledged ({soak.pushbacks} push-backs, "
        f"resent); received by the daemon (all receivers) {received:,.0f}, of which "
        f"{sampled_out:,.0f} sampled out by engine sampling; lost {lost:,.0f}; "
        f"queue drained: {drained_queue}; consumer errors {consumer_errors:.0f}"
        f"\nKV after the attacks: {kv_after - kv_before:.0f} of 10 valid batches counted"
        f"\nKV forged frame (issue 32.4): {forged or 'not run (daemon down)'}"
        f"\nSIGTERM: exit {code}; {drained_line or NO_STOP_LINE}"
    )  # fmt: skip
    verdicts = [
        (
            "0 crashes (process up, pipeline worker never reported dead)",
            not crashes and alive and "worker" not in soak.health_why.get(503, ""),
        ),
        ("/healthz answered 200 to every probe", not bad),
        (f"peak RSS within the chart's {RSS_LIMIT_MB:.0f} MB limit", hwm_mb <= RSS_LIMIT_MB),
        ("/healthz p99 ≤ 50 ms", p99 <= HEALTH_P99_TARGET_S),
        ("valid telemetry still learned (observations rise between every two samples)", rising),
        (
            "nothing acknowledged lost (received ≥ acknowledged, queue drained, no consumer "
            "error, drained on SIGTERM)",
            lost == 0
            and drained_queue
            and consumer_errors == 0
            and "true" in (drained_line or "").lower(),
        ),
        ("KV subscriber alive after the attacks", kv_after - kv_before >= 10),
        (
            "KV: one forged frame (seq 2^62) between valid batches; all 2,100 valid accepted",
            forged is not None and forged.ok,
        ),
        ("a second daemon cannot share the gRPC port", port_share.startswith("refused")),
    ]
    for what, ok in verdicts:
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
