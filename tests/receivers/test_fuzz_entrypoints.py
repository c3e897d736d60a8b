"""Fuzzing every receiver entry point (issue 17, "Done when"): OTLP/gRPC, OTLP/HTTP with
protobuf, JSON and gzip bodies, and ZMQ KV messages. For each input: no crash, no dead
thread, a clear status (one the receiver documents, with a body that parses), and the
input counted exactly once in its receiver's outcome counters.

Inputs are random bytes, mutations of valid requests (flipped, cut, spliced bytes) and
structurally random messages, against a real App's servers on free ports. Bounded to
about 20 s in all (example counts below; no timing assertion).
"""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator
from typing import Any

import grpc
import msgspec
import pytest
from corpus_inputs import TEST_LIMITS, TEST_MAX_BYTES
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from otlp_builders import core_span, journey, request, step_span, summary_attrs
from prometheus_client import CollectorRegistry

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.daemon.settings import Settings
from coeffd.receivers.kv import KVSubscriber

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
VALID = request(
    ("vllm.scheduler.step", [step_span(summary_attrs())]),
    ("vllm.scheduler", [core_span(journey(), journey("SCHEDULED"))]),
)
VALID_PB = VALID.SerializeToString()
VALID_JSON = json_format.MessageToJson(VALID, indent=None).encode()
OUTCOMES = ("ok", "partial", "invalid", "retry", "limit")


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    s = Settings.model_validate(
        {
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0", "max_message_bytes": TEST_MAX_BYTES},
                "otlp_http": {"endpoint": "127.0.0.1:0", "max_body_bytes": TEST_MAX_BYTES},
                "limits": TEST_LIMITS,
            },
            "http": {"endpoint": "127.0.0.1:0"},
            "log": {"rate_limit_seconds": 60.0},  # one line per kind of problem, not per input
            "state": {"state_dir": ""},
        }
    )
    a = App(s, consumer=CountingConsumer())
    a.start()
    yield a
    a.stop()


def _counted(app: App, receiver: str) -> float:
    return sum(
        app.registry.get_sample_value(
            "coeffd_receiver_requests_total", {"receiver": receiver, "outcome": o}
        )
        or 0.0
        for o in OUTCOMES
    )


def _mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """``valid`` with bytes flipped, a cut, or random bytes spliced in."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = bytearray(valid)
        for _ in range(draw(st.integers(1, 8))):
            op = draw(st.sampled_from(("flip", "cut", "splice")))
            i = draw(st.integers(0, max(len(data) - 1, 0)))
            if op == "flip" and data:
                data[i] ^= draw(st.integers(1, 255))
            elif op == "cut":
                del data[i : i + draw(st.integers(1, 64))]
            else:
                data[i:i] = draw(st.binary(min_size=1, max_size=32))
        return bytes(data)

    return build()


PB_BODIES = st.one_of(st.binary(max_size=512), _mutated(VALID_PB))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=40,
)
JSON_BODIES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["resourceSpans", "x"]), JSON_VALUES, max_size=2).map(
        lambda v: json.dumps(v).encode()
    ),
    _mutated(VALID_JSON),
)


class _Http:
    """One keep-alive connection, reopened when the server closes it (as clients do)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request("POST", "/v1/traces", body=body, headers=headers)
                r = self.conn.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return r.status, r.getheader("Content-Type", ""), data
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _check_http_answer(status: int, ctype: str, data: bytes, sent: str) -> None:
    assert status in (200, 400, 413, 415, 503), status
    if status == 200:
        if sent == "application/json":
            json.loads(data)
        else:
            trace_service_pb2.ExportTraceServiceResponse.FromString(data)
        return
    # OTLP/HTTP: a google.rpc.Status, JSON for JSON requests, protobuf otherwise.
    if sent == "application/json":
        assert ctype == "application/json"
        body = json.loads(data)
        assert body["code"] > 0 and body["message"]
    else:
        assert ctype == "application/x-protobuf"
        parsed = status_pb2.Status.FromString(data)
        assert parsed.code > 0 and parsed.message


@pytest.fixture(scope="module")
def http_client(app: App) -> Iterator[_Http]:
    c = _Http(app.otlp_http_port or 0)
    yield c
    c.conn.close()


def _fuzz_http(app: App, client: _Http, body: bytes, ctype: str, encoding: str = "") -> None:
    before = _counted(app, "otlp_http")
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    status, got_type, data = client.post(body, headers)
    _check_http_answer(status, got_type, data, ctype)
    assert _counted(app, "otlp_http") == before + 1
    assert app.supervisor.dead() == []


@FUZZ
@given(body=PB_BODIES)
def test_fuzz_http_protobuf(app: App, http_client: _Http, body: bytes) -> None:
    _fuzz_http(app, http_client, body, "application/x-protobuf")


@FUZZ
@given(body=JSON_BODIES)
def test_fuzz_http_json(app: App, http_client: _Http, body: bytes) -> None:
    _fuzz_http(app, http_client, body, "application/json")


@FUZZ
@given(
    body=st.one_of(
        PB_BODIES.map(gzip.compress),
        _mutated(gzip.compress(VALID_PB)),
        st.binary(max_size=256),
    )
)
def test_fuzz_http_gzip(app: App, http_client: _Http, body: bytes) -> None:
    _fuzz_http(app, http_client, body, "application/x-protobuf", "gzip")


@pytest.fixture(scope="module")
def grpc_export(app: App) -> Iterator[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        yield ch.unary_unary(EXPORT)


@FUZZ
@given(body=PB_BODIES)
def test_fuzz_grpc(app: App, grpc_export: Any, body: bytes) -> None:
    before = _counted(app, "otlp_grpc")
    try:
        answer = grpc_export(body, timeout=30)
        trace_service_pb2.ExportTraceServiceResponse.FromString(answer)
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE)
        assert e.details()
    assert _counted(app, "otlp_grpc") == before + 1
    assert app.supervisor.dead() == []


# ------------------------------------------------------------------------------ ZMQ

_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
_VALID_KV = msgspec.msgpack.encode(
    [1767225600.0, [["BlockStored", [1, 2], None, [1, 2, 3], 16, None, "GPU", None]], 0, 7]
)
_KV_FRAMES = st.one_of(
    st.lists(st.binary(max_size=24), max_size=4),
    st.tuples(
        st.binary(max_size=8),
        st.integers(0, 2**64 - 1).map(lambda n: n.to_bytes(8, "big")),
        st.one_of(
            _MSGPACK_VALUES.map(msgspec.msgpack.encode),
            _mutated(_VALID_KV),
            st.binary(max_size=64),
        ),
    ).map(list),
)
#: Each message lands in exactly one of these (event-level reasons come on top).
_PER_MESSAGE = (
    "batches",
    "duplicate",
    # a batch whose number jumps too far is dropped and counted here, not in "batches"
    "sequence_jumps",
    "frame_count",
    "bad_sequence",
    "bad_topic",
    "bad_msgpack",
    "bad_batch",
    "internal_error",
)


@pytest.fixture(scope="module")
def kv_sub() -> KVSubscriber:
    # handle() is what the socket thread calls for each received message; fed directly
    # so hypothesis controls every frame (test_kv_hardening drives the real socket).
    return KVSubscriber("tcp://127.0.0.1:1", "", lambda records: True, registry=CollectorRegistry())


@settings(max_examples=400, deadline=None, database=None)
@given(frames=_KV_FRAMES)
def test_fuzz_zmq(kv_sub: KVSubscriber, frames: list[bytes]) -> None:
    before = sum(kv_sub.counts[k] for k in _PER_MESSAGE)
    kv_sub.handle(frames)
    assert sum(kv_sub.counts[k] for k in _PER_MESSAGE) == before + 1
    assert kv_sub.counts["internal_error"] == 0
    assert len(kv_sub.tracker) <= kv_sub.tracker.max_keys
