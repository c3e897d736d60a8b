"""``python -m bench simfleet``: simulated steps per wall second at full sampling.

One ``steady`` engine (Llama-3.1-8B/H100), journey and step sampling 1.0, rich 0.001,
closure 100, measured in the same run as:

* **baseline** — the engine with telemetry off (scheduler + true latencies only);
* **file** — OTLP/JSON lines + KV JSON lines to a temporary directory;
* **otlp-grpc** / **otlp-http** — the SDK's BatchSpanProcessor + OTLP exporter to a local
  in-process receiver that only counts requests (so the receiver's cost is not measured);
* **zmq** — KV events over a ZMQ PUB socket to a local SUB.

Reported: steps/s, simulated seconds per wall second, and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from functools import partial
from typing import Any

import grpc
import zmq
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from coeffd import simfleet
from coeffd.simfleet.run import RunResult

RATES = simfleet.SampleRates(1.0, 1.0, 0.001, 100)


class _Counter(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests = 0
        self.spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        self.requests += 1
        return trace_service_pb2.ExportTraceServiceResponse()


def _grpc_server() -> tuple[grpc.Server, int, _Counter]:
    counter = _Counter()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(counter, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, counter


def _http_server() -> tuple[Any, int, list[int]]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    count = [0]

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            count[0] += 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_port, count


def _measure(name: str, fn: Callable[[], RunResult]) -> tuple[str, RunResult, float]:
    t0 = time.perf_counter()
    res = fn()
    return name, res, time.perf_counter() - t0


def main(argv: list[str]) -> int:
    """Run the benchmark; prints one line per mode."""
    ap = argparse.ArgumentParser(prog="python -m bench simfleet", description=__doc__)
    ap.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="baseline,file,otlp-grpc,otlp-http,zmq")
    args = ap.parse_args(argv)
    d, seed = args.duration, args.seed
    modes = args.modes.split(",")
    rows: list[tuple[str, RunResult, float, str]] = []
    full = partial(simfleet.run, "steady", d, seed, rates=RATES)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            note = ""
            if mode == "baseline":
                r = _measure(mode, partial(simfleet.run, "steady", d, seed, telemetry=False))
            elif mode == "file":
                tp, kp = os.path.join(tmp, "t.jsonl"), os.path.join(tmp, "kv.jsonl")
                with open(tp, "wb") as t, open(kp, "w") as k:
                    r = _measure(mode, partial(full, trace_out=t, kv_out=k))
                note = f"{os.path.getsize(tp) / 1e6:.0f} MB traces, {os.path.getsize(kp) / 1e6:.0f} MB KV"
            elif mode == "otlp-grpc":
                server, port, counter = _grpc_server()
                try:
                    url = f"http://127.0.0.1:{port}"
                    r = _measure(mode, partial(full, otlp_endpoint=url, otlp_protocol="grpc"))
                finally:
                    server.stop(None)
                note = f"{counter.requests} export requests"
            elif mode == "otlp-http":
                srv, port, count = _http_server()
                try:
                    url = f"127.0.0.1:{port}"
                    proto = "http/protobuf"
                    r = _measure(mode, partial(full, otlp_endpoint=url, otlp_protocol=proto))
                finally:
                    srv.shutdown()
                note = f"{count[0]} export requests"
            elif mode == "zmq":
                ctx = zmq.Context.instance()
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.setsockopt(zmq.RCVTIMEO, 100)
                port = sub.bind_to_random_port("tcp://127.0.0.1")
                got = [0]
                stop = threading.Event()

                def recv(
                    sub: Any = sub, got: list[int] = got, stop: threading.Event = stop
                ) -> None:
                    while not stop.is_set():
                        try:
                            sub.recv_multipart()
                            got[0] += 1
                        except zmq.Again:
                            pass

                th = threading.Thread(target=recv, daemon=True)
                th.start()
                try:
                    kv = f"tcp://127.0.0.1:{port}"
                    no_spans = simfleet.SampleRates(1.0, 0.0, 0.0, 100)
                    r = _measure(mode, partial(full, rates=no_spans, kv_endpoint=kv))
                finally:
                    time.sleep(0.5)
                    stop.set()
                    th.join()
                    sub.close(0)
                note = f"{got[0]} KV batches received (spans: none exported)"
            else:
                print(f"unknown mode {mode!r}")
                return 2
            rows.append((r[0], r[1], r[2], note))
    base = next((w for n, _r, w, _ in rows if n == "baseline"), None)
    print(f"simfleet steady, {d:.0f} s simulated, sampling journey/step/rich = 1.0/1.0/0.001")
    for name, res, wall, note in rows:
        sps = res.steps / wall
        ratio = f"{base / wall:5.2f}x baseline speed" if base else ""
        print(
            f"  {name:10s} {res.steps:7d} steps  {wall:6.2f} s wall  {sps:8.0f} steps/s  "
            f"{res.sim_seconds / wall:6.1f} sim-s/s  {ratio}  {note}"
        )
    return 0
