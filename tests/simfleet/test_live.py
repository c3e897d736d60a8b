"""Live export: the real OTLP exporters (HTTP and gRPC) and the ZMQ PUB socket."""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer

import grpc
import zmq
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from coeffd import simfleet
from coeffd.receivers.otlp.decode import Decoder

RATES = simfleet.SampleRates(1.0, 0.2, 0.0, 10)


def _count_core(reqs: list[trace_service_pb2.ExportTraceServiceRequest]) -> int:
    dec = Decoder()
    n = 0
    for r in reqs:
        res = dec.decode(r)
        assert res.rejected == 0
        n += sum(type(x).__name__ == "CoreSpan" for x in res.records)
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_otlp_http_protobuf_exporter():
    got: list[tuple[str, bytes, str]] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, body, self.headers["Content-Type"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res = simfleet.run(
            "steady",
            2.0,
            seed=1,
            rates=RATES,
            otlp_endpoint=f"127.0.0.1:{srv.server_port}",
            otlp_protocol="http/protobuf",
            drain_s=10.0,
        )
    finally:
        srv.shutdown()
    assert got and all(p == "/v1/traces" and ct == "application/x-protobuf" for p, _b, ct in got)
    reqs = [trace_service_pb2.ExportTraceServiceRequest.FromString(b) for _p, b, _ct in got]
    assert _count_core(reqs) == res.requests_finished


def test_otlp_grpc_exporter():
    got: list[trace_service_pb2.ExportTraceServiceRequest] = []

    class Svc(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            got.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Svc(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        res = simfleet.run(
            "steady",
            2.0,
            seed=1,
            rates=RATES,
            otlp_endpoint=f"http://127.0.0.1:{port}",
            otlp_protocol="grpc",
            drain_s=10.0,
        )
    finally:
        server.stop(None)
    assert _count_core(got) == res.requests_finished


def test_zmq_pub_three_frames():
    port = _free_port()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.bind(f"tcp://127.0.0.1:{port}")
    frames: list[list[bytes]] = []
    done = threading.Event()

    def receive() -> None:
        # a bound SUB only attaches the publisher's pipe (and sends its subscription)
        # while the application calls into it, so keep receiving throughout the run
        while not done.is_set():
            try:
                frames.append(sub.recv_multipart())
            except zmq.Again:
                continue

    th = threading.Thread(target=receive, daemon=True)
    th.start()
    try:
        mem = simfleet.MemoryKVSink()
        simfleet.run(
            "steady",
            2.0,
            seed=1,
            rates=RATES,
            kv_endpoint=f"tcp://127.0.0.1:{port}",
            kv_sinks=[mem],
            drain_s=10.0,
        )
        deadline = threading.Event()
        for _ in range(50):
            if len(frames) >= len(mem.batches):
                break
            deadline.wait(0.1)
    finally:
        done.set()
        th.join()
        sub.close(0)
    assert len(frames) == len(mem.batches) > 0
    for (topic, seq, payload), (t2, s2, p2, _src) in zip(frames, mem.batches, strict=True):
        assert topic == t2 == b""
        assert int.from_bytes(seq, "big") == s2 and len(seq) == 8
        assert payload == p2
