"""KV JSON-lines replay: simfleet's recording format (base64 msgpack) and decoded-JSON payloads."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

from kv_support import MAP_EVENTS, POSITIONAL_EVENTS, TS

from coeffd.receivers.kv import read_kv_jsonl
from coeffd.receivers.kv.decode import decode_kv_message, parse_payload
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import KVBlocks


def test_reads_simfleet_recording(tmp_path: Path) -> None:
    from coeffd.simfleet.kv import KVJsonlWriter, encode_batch

    path = tmp_path / "kv.jsonl"
    attrs = {"service.name": "vllm", "coeffd.model": "llama"}
    with path.open("w") as fh:
        writer = KVJsonlWriter(fh)
        writer.publish(
            b"kv-events", 5, encode_batch(TS, [tuple(e) for e in POSITIONAL_EVENTS], 0), attrs
        )
        writer.publish(
            b"kv-events",
            6,
            encode_batch(TS + 1, [tuple(e) for e in POSITIONAL_EVENTS], 0, "map"),
            attrs,
        )
        writer.close()
        fh.write("not json\n")
        fh.write(json.dumps({"seq": 7, "payload": "!!notbase64"}) + "\n")
        fh.write(json.dumps({"seq": 8}) + "\n")
    counts: Counter[str] = Counter()
    batches = list(read_kv_jsonl(path, counts))
    assert [len(b) for b in batches] == [2, 2]
    first = batches[0][0]
    assert isinstance(first, KVBlocks) and first.batch.seq == 5
    assert first.batch.source == source_from_attributes(attrs)
    # Same records as the live ZMQ path for the same payload.
    live, err = decode_kv_message(
        [
            b"kv-events",
            (5).to_bytes(8, "big"),
            encode_batch(TS, [tuple(e) for e in POSITIONAL_EVENTS], 0),
        ],
        source_from_attributes(attrs),
    )
    assert err is None and live == batches[0]
    assert counts == Counter({"bad_line": 3})


def test_decoded_json_payload() -> None:
    line = json.dumps({"topic": "kv-events", "seq": 1, "payload": [TS, MAP_EVENTS, 0]})
    batches = list(read_kv_jsonl(io.StringIO(line + "\n\n")))
    assert len(batches) == 1 and batches[0][1].stored  # type: ignore[union-attr]
    assert parse_payload(b"\x93\xcb" + b"\x00" * 8 + b"\x90\x00").events == []


def test_source_id_matches_otlp_decoder() -> None:
    """KV and OTLP streams of one engine must share a source id (joiner pairs them)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    from coeffd.receivers.otlp.decode import source_for_resource

    attrs: dict[str, str | int | float | bool] = {
        "service.name": "vllm",
        "k8s.pod.name": "pod-1",
        "coeffd.tp": 2,
    }
    res = Resource(
        attributes=[
            KeyValue(key="service.name", value=AnyValue(string_value="vllm")),
            KeyValue(key="k8s.pod.name", value=AnyValue(string_value="pod-1")),
            KeyValue(key="coeffd.tp", value=AnyValue(int_value=2)),
        ]
    )
    assert source_from_attributes(attrs) == source_for_resource(res)
