"""One stream identity across receivers: the OTLP decoder (protobuf and JSON), the live
ZMQ KV subscriber and the KV JSON-lines reader give the same resource attributes the
same source id (``receivers.source``: the joiner pairs an engine's KV transfers with its
spans by it). They used to compute it in two places."""

from __future__ import annotations

import io
import threading
from typing import Any

import zmq
from google.protobuf import json_format
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from otlp_builders import request, step_span, summary_attrs

from coeffd.receivers.kv import KVSubscriber, read_kv_jsonl
from coeffd.receivers.otlp.decode import Decoder, decode_json
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import KVRecord, Record
from coeffd.simfleet.kv import KVJsonlWriter, encode_batch

ATTRS: dict[str, Any] = {"service.name": "vllm", "coeffd.engine": "engine-a", "coeffd.tp": 2}
WAIT_S = 30.0  # a safety net against hangs, not a timing assertion


def _value(v: Any) -> AnyValue:
    return AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=v)


def _otlp_sources(attrs: list[tuple[str, Any]]) -> set[str]:
    """Source ids of the records the OTLP decoder makes of a request with this resource,
    through the protobuf bytes (gRPC, OTLP/HTTP protobuf) and OTLP/JSON."""
    req = request(("vllm.scheduler.step", [step_span(summary_attrs())]))
    resource = req.resource_spans[0].resource
    resource.CopyFrom(Resource(attributes=[KeyValue(key=k, value=_value(v)) for k, v in attrs]))
    records: list[Record] = []
    records += Decoder().decode_bytes(req.SerializeToString()).records
    records += decode_json(json_format.MessageToJson(req).encode()).records
    assert records, "the request decodes to no records"
    return {r.span.source.id for r in records}  # type: ignore[union-attr]


def test_otlp_and_kv_jsonl_give_the_same_id() -> None:
    buf = io.StringIO()
    KVJsonlWriter(buf).publish(
        b"kv-events", 1, encode_batch(1.0, [("AllBlocksCleared",)], 0), ATTRS
    )
    (kv,) = list(read_kv_jsonl(io.StringIO(buf.getvalue())))
    kv_ids = {r.batch.source.id for r in kv}
    # the OTLP resource lists the attributes in another order: the id does not depend on it
    assert _otlp_sources(sorted(ATTRS.items(), reverse=True)) == kv_ids
    assert kv_ids == {source_from_attributes(ATTRS).id}


def test_otlp_and_the_live_kv_stream_of_one_engine_give_the_same_id() -> None:
    # fan-in: the engine publishes under its own topic, which names it (coeffd.engine)
    got: list[KVRecord] = []
    arrived = threading.Event()

    def offer(records: list[KVRecord]) -> bool:
        got.extend(records)
        arrived.set()
        return True

    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        with KVSubscriber(f"tcp://127.0.0.1:{port}", "", offer, topic_sources=True):
            seq = 0
            while not arrived.wait(0.05):  # PUB/SUB's slow joiner: resend until heard
                assert seq < WAIT_S / 0.05, "no KV batch arrived"
                payload = encode_batch(1.0 + seq, [("AllBlocksCleared",)], 0)
                pub.send_multipart([b"engine-a", seq.to_bytes(8, "big"), payload])
                seq += 1
    finally:
        pub.close()
    kv_ids = {r.batch.source.id for r in got}
    assert _otlp_sources([("coeffd.engine", "engine-a")]) == kv_ids
    assert len(kv_ids) == 1


def test_a_key_repeated_with_values_of_two_types_is_an_id_not_an_error() -> None:
    # OTLP forbids repeated keys; a sender may still send them, once as int, once as text
    # (the sort of the pairs used to raise TypeError, failing the whole request)
    ids = _otlp_sources([("coeffd.tp", 2), ("coeffd.tp", "2"), ("service.name", "vllm")])
    again = _otlp_sources([("coeffd.tp", "2"), ("service.name", "vllm"), ("coeffd.tp", 2)])
    assert len(ids) == 1 and ids == again
    assert ids != _otlp_sources([("coeffd.tp", 2), ("service.name", "vllm")])
