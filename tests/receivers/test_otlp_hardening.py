"""The OTLP receivers against hostile senders (issue 17, items 3, 5, 7, 9, 12; issue 19's
OTLP/HTTP error bodies): every corpus input gets its documented status with a
``google.rpc.Status`` body in the request's encoding, is counted, and the daemon keeps
serving. Real gRPC and HTTP servers on free ports, answers read over real sockets."""

from __future__ import annotations

import gzip
import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from conftest import metric, scrape
from corpus_inputs import TEST_LIMITS, TEST_MAX_BYTES, empty_resource_spans, otlp_cases
from google.rpc import status_pb2
from otlp_builders import core_span, journey, request

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.daemon.settings import Settings

GOOD = request(("vllm.scheduler", [core_span(journey())])).SerializeToString()
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
CASES = list(otlp_cases())


def _settings(limits: dict[str, int] | None = None, **http: Any) -> Settings:
    return Settings.model_validate(
        {
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0", "max_message_bytes": TEST_MAX_BYTES},
                "otlp_http": {
                    "endpoint": "127.0.0.1:0",
                    "max_body_bytes": TEST_MAX_BYTES,
                    **http,
                },
                "limits": TEST_LIMITS if limits is None else limits,
            },
            "http": {"endpoint": "127.0.0.1:0"},
            "log": {"rate_limit_seconds": 0.0},
            "state": {"state_dir": ""},
        }
    )


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    a = App(_settings(), consumer=CountingConsumer())
    a.start()
    yield a
    a.stop()


def post(
    app: App, body: bytes, ctype: str, encoding: str = ""
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(
        f"http://127.0.0.1:{app.otlp_http_port}/v1/traces", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _status(body: bytes, ctype: str) -> status_pb2.Status:
    """The error body as the OTLP/HTTP spec says: a google.rpc.Status in the request's
    encoding (raises if it is anything else)."""
    if ctype == "application/json":
        obj = json.loads(body)
        return status_pb2.Status(code=obj["code"], message=obj["message"])
    return status_pb2.Status.FromString(body)


def _outcomes(app: App, receiver: str) -> dict[str, float]:
    m = scrape(app)
    return {
        o: metric(m, "coeffd_receiver_requests_total", receiver=receiver, outcome=o)
        for o in ("ok", "invalid", "limit")
    }


@pytest.mark.parametrize(("name", "body", "expect"), CASES, ids=[c[0] for c in CASES])
def test_corpus_over_http(app: App, name: str, body: bytes, expect: dict[str, Any]) -> None:
    before = _outcomes(app, "otlp_http")
    code, answer, headers = post(app, body, expect["content_type"], expect["encoding"])
    assert code == expect["http"], answer[:200]
    assert headers["Content-Type"] == expect["content_type"]
    status = _status(answer, expect["content_type"])
    assert status.code != 0 and status.message
    after = _outcomes(app, "otlp_http")
    outcome = "limit" if code == 413 else "invalid"
    assert after[outcome] == before[outcome] + 1
    assert post(app, GOOD, "application/x-protobuf")[0] == 200
    assert app.supervisor.dead() == []


GRPC_CASES = [c for c in CASES if c[2]["grpc"]]


@pytest.mark.parametrize(("name", "body", "expect"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_corpus_over_grpc(app: App, name: str, body: bytes, expect: dict[str, Any]) -> None:
    before = _outcomes(app, "otlp_grpc")
    with grpc.insecure_channel(
        f"127.0.0.1:{app.grpc_port}", options=[("grpc.max_send_message_length", -1)]
    ) as ch:
        raw = ch.unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as ei:
            raw(body, timeout=30)
        assert ei.value.code().name == expect["grpc"]
        assert raw(GOOD, timeout=30) == b""
    after = _outcomes(app, "otlp_grpc")
    outcome = "limit" if expect["http"] == 413 else "invalid"
    assert after[outcome] == before[outcome] + 1


def test_32mb_of_empty_resource_spans_is_refused_at_default_limits() -> None:
    """The attack of issue 17.3 at full size and default settings (bench dos measures
    its cost): refused, counted by limit, over both receivers."""
    body = empty_resource_spans(16_000_000)
    s = Settings.model_validate(
        {
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                "otlp_http": {"endpoint": "127.0.0.1:0"},
            },
            "http": {"endpoint": "127.0.0.1:0"},
            "state": {"state_dir": ""},
        }
    )
    with App(s, consumer=CountingConsumer()) as a:
        code, answer, _ = post(a, body, "application/x-protobuf")
        assert code == 413 and "ResourceSpans" in _status(answer, "application/x-protobuf").message
        with (
            grpc.insecure_channel(
                f"127.0.0.1:{a.grpc_port}", options=[("grpc.max_send_message_length", -1)]
            ) as ch,
            pytest.raises(grpc.RpcError) as ei,
        ):
            ch.unary_unary(EXPORT)(body, timeout=60)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        m = scrape(a)
        for receiver in ("otlp_http", "otlp_grpc"):
            assert (
                metric(
                    m,
                    "coeffd_receiver_limit_exceeded_total",
                    receiver=receiver,
                    limit="resource_spans",
                )
                == 1
            )


def test_grpc_message_over_the_limit_is_counted(app: App) -> None:
    """grpc refuses it unread (RESOURCE_EXHAUSTED); counted all the same, at any size
    (a unary handler never ran for these, so they went uncounted)."""
    name = "coeffd_receiver_limit_exceeded_total"
    key = {"receiver": "otlp_grpc", "limit": "message_bytes"}
    for size in (TEST_MAX_BYTES + 2, 4 * TEST_MAX_BYTES):
        before = metric(scrape(app), name, **key)
        with (
            grpc.insecure_channel(
                f"127.0.0.1:{app.grpc_port}", options=[("grpc.max_send_message_length", -1)]
            ) as ch,
            pytest.raises(grpc.RpcError) as ei,
        ):
            ch.unary_unary(EXPORT)(b"\x1a\x00" * (size // 2), timeout=30)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert metric(scrape(app), name, **key) == before + 1


def test_json_errors_are_json_status(app: App) -> None:
    code, answer, headers = post(app, b"{not json", "application/json")
    assert code == 400 and headers["Content-Type"] == "application/json"
    assert json.loads(answer)["code"] == 3  # INVALID_ARGUMENT
    code, answer, headers = post(app, b"x", "text/plain")
    assert code == 415 and status_pb2.Status.FromString(answer).code == 3


def test_gzip_within_the_limit_still_accepted(app: App) -> None:
    assert post(app, gzip.compress(GOOD), "application/x-protobuf", "gzip")[0] == 200


def test_second_daemon_on_the_same_grpc_port_fails_to_start(app: App) -> None:
    s = _settings()
    s.receivers.otlp_grpc.endpoint = f"127.0.0.1:{app.grpc_port}"
    other = App(s, consumer=CountingConsumer())
    with pytest.raises(OSError, match="another process"):
        other.start()


def _connect(app: App) -> socket.socket:
    return socket.create_connection(("127.0.0.1", app.otlp_http_port or 0), timeout=30)


def test_idle_connection_is_closed() -> None:
    with App(_settings(idle_timeout_seconds=0.2), consumer=CountingConsumer()) as a:
        with _connect(a) as sock:
            assert sock.recv(1) == b""  # closed by the server, not by our 30 s safety net
        with _connect(a) as sock:  # stalls inside a request: closed too
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: c\r\nContent-Length: 100\r\n\r\nabc")
            assert sock.recv(1) == b""


def test_trickling_client_is_cut_off() -> None:
    """Slowloris: a header byte every 50 ms keeps each read under the 0.5 s idle timeout;
    the whole request may still not take longer than it."""
    with (
        App(_settings(idle_timeout_seconds=0.5), consumer=CountingConsumer()) as a,
        _connect(a) as sock,
    ):
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nX-Slow: ")
        closed = False
        for _ in range(600):  # 30 s: a safety net, not a timing assertion
            try:
                sock.sendall(b"a")  # one header line that never ends
                time.sleep(0.05)
                sock.setblocking(False)
                try:
                    closed = sock.recv(1) == b""
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
            except OSError:  # reset by the server
                closed = True
            if closed:
                break
        assert closed


def test_idle_connections_never_lock_out_a_new_client() -> None:
    """At the connection cap the longest-idle connection is cut for the new one (the soak:
    100 idle sockets held every slot and probes got 503), and the cut is counted."""
    with App(_settings(max_connections=2), consumer=CountingConsumer()) as a:
        held = [_connect(a), _connect(a)]
        try:
            time.sleep(0.05)  # the first waits longest
            with _connect(a) as third:
                body = b'{"resourceSpans": []}'
                third.sendall(
                    b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                answer = third.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:40]
            assert held[0].recv(1) == b""  # the longest-idle one was closed by the server
        finally:
            for s in held:
                s.close()
        m = scrape(a)
        assert (
            metric(
                m, "coeffd_receiver_limit_exceeded_total", receiver="otlp_http", limit="connections"
            )
            == 1
        )


def test_probes_answer_while_idle_connections_fill_the_api_port() -> None:
    """64 idle connections on the API port (its cap): /healthz still answers 200."""
    with App(_settings(), consumer=CountingConsumer()) as a:
        port = a.http_port
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(64)]
        try:
            time.sleep(0.1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                assert r.status == 200
        finally:
            for s in held:
                s.close()


def test_decoder_sources_are_bounded_by_bytes() -> None:
    """300 exports with distinct 60 KB resource attributes (under max_resource_bytes):
    the decoder's source cache stays within its byte bound (1 MB attributes held 998 MB)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from coeffd.receivers.otlp.decode import Decoder

    decoder = Decoder(max_source_bytes=4 << 20)
    for i in range(300):
        req = ExportTraceServiceRequest()
        kv = req.resource_spans.add().resource.attributes.add(key="big")
        kv.value.string_value = f"{i:06d}" + "x" * 60_000
        decoder.decode(req)
        assert decoder._source_bytes <= 4 << 20
    assert 0 < len(decoder._sources) <= (4 << 20) // 60_000


def test_wrong_path_and_method_answer_a_status_too(app: App) -> None:
    for method, path, code in (("GET", "/v1/traces", 405), ("POST", "/v1/logs", 404)):
        req = urllib.request.Request(
            f"http://127.0.0.1:{app.otlp_http_port}{path}",
            data=b"" if method == "POST" else None,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(req, timeout=30)
        assert ei.value.code == code
        assert json.loads(ei.value.read())["message"]


def test_idle_grpc_connection_is_closed() -> None:
    s = _settings()
    s.receivers.otlp_grpc.idle_timeout_seconds = 0.3
    with App(s, consumer=CountingConsumer()) as a:
        seen: list[grpc.ChannelConnectivity] = []
        idle_again = threading.Event()

        def watch(state: grpc.ChannelConnectivity) -> None:
            seen.append(state)
            if state == grpc.ChannelConnectivity.IDLE and grpc.ChannelConnectivity.READY in seen:
                idle_again.set()  # the server sent GOAWAY "connection idle"

        with grpc.insecure_channel(f"127.0.0.1:{a.grpc_port}") as ch:
            ch.subscribe(watch, try_to_connect=True)
            assert idle_again.wait(30)  # safety net, not a timing assertion
            ch.unsubscribe(watch)


def test_listen_backlog_takes_a_burst_of_connects() -> None:
    """60 connects while nothing accepts (the server not started): each completes in the
    kernel's accept queue. With socketserver's default backlog of 5, the rest stalled in
    SYN retries (9 of 60 connects took ~1 s in the attack run)."""
    from coeffd.base.http import HttpServer

    server = HttpServer("127.0.0.1", 0)
    socks: list[socket.socket] = []
    try:
        for _ in range(60):
            s = socket.socket()
            s.settimeout(0.0)
            s.connect_ex(("127.0.0.1", server.port))
            socks.append(s)
        deadline = time.monotonic() + 30  # a safety net (a dropped SYN waits 1 s+)
        for s in socks:
            # Writable = handshake done.
            _, writable, _ = select.select([], [s], [], max(0.0, deadline - time.monotonic()))
            assert writable and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    finally:
        for s in socks:
            s.close()
        server.stop()
