"""The receivers' regression corpus: inputs that once crashed, stalled or ballooned the
daemon (issue 17), kept as files under ``corpus/`` with the outcome each must get.

``corpus/manifest.json`` maps each file to its expected outcome; the files are written by
``PYTHONPATH=. python tests/receivers/corpus_inputs.py`` from the builders below, so a new case is one
builder plus a rerun. Inputs too large to keep as files (the 32 MB bodies) are built by
the tests from :func:`empty_resource_spans` and friends instead.

KV files hold one ZMQ message: a msgpack array of its frames (bytes).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from bench.dos import attack_body, field

CORPUS = Path(__file__).parent / "corpus"
MANIFEST = CORPUS / "manifest.json"

_TS = 1767225600.0


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _batch(dp_rank: int = 0, ts: float = _TS) -> bytes:
    return msgspec.msgpack.encode([ts, [["AllBlocksCleared"]], dp_rank, None])


def _nest(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]


#: name -> (frames, the rejection reason it is counted under)
KV: dict[str, tuple[list[bytes], str]] = {
    "payload-invalid-utf8-str": ([b"", _seq(1), b"\xa1\xff"], "bad_msgpack"),
    "payload-nested-2000": ([b"", _seq(1), _nest(2000)], "bad_msgpack"),
    "payload-nested-10000": ([b"", _seq(1), _nest(10_000)], "bad_msgpack"),
    "payload-map-invalid-utf8-key": ([b"", _seq(1), b"\x81\xa1\xff\x00"], "bad_msgpack"),
    "topic-invalid-utf8": ([b"\xff\xfe", _seq(1), _batch()], "bad_topic"),
    "ts-nan": (
        [b"", _seq(1), msgspec.msgpack.encode([float("nan"), [], 0, None])],
        "bad_batch",
    ),
    "ts-beyond-int64-ns": ([b"", _seq(1), msgspec.msgpack.encode([1e300, [], 0])], "bad_batch"),
    "dp-rank-negative": ([b"", _seq(1), _batch(dp_rank=-1)], "bad_batch"),
    "two-frames": ([b"", _seq(1)], "frame_count"),
    "sequence-7-bytes": ([b"", b"\x00" * 7, _batch()], "bad_sequence"),
}


# ----------------------------------------------------------------------- OTLP bodies


def empty_resource_spans(n: int) -> bytes:
    """An ExportTraceServiceRequest of ``n`` empty ResourceSpans (2 bytes each)."""
    return attack_body("empty_resource_spans", n)


def empty_spans(n: int) -> bytes:
    """One ResourceSpans, one ScopeSpans, ``n`` empty spans."""
    return attack_body("empty_spans", n)


def empty_events(n: int) -> bytes:
    """One span with ``n`` empty events."""
    return attack_body("empty_events", n)


def big_resource(attr_bytes: int) -> bytes:
    """One ResourceSpans whose resource carries one string attribute of ``attr_bytes``."""
    value = field(1, b"x" * attr_bytes)  # AnyValue.string_value
    kv = field(1, b"big") + field(2, value)
    return field(1, field(1, field(1, kv)))


def big_scope(attributes: int) -> bytes:
    """One ScopeSpans whose scope carries ``attributes`` empty attributes (2 bytes each)."""
    return field(1, field(2, field(1, field(3, b"") * attributes)))


def nested_any_value(depth: int) -> bytes:
    """A span attribute whose AnyValue nests ``depth`` array values."""
    value = b""
    for _ in range(depth):
        value = field(5, field(1, value))  # AnyValue.array_value.values[0]
    kv = field(1, b"deep") + field(2, value)
    return field(1, field(2, field(2, field(9, kv))))


def nested_json(depth: int) -> bytes:
    """An OTLP/JSON body with an attribute value nested ``depth`` arrays deep."""
    value = "{}"
    for _ in range(depth):
        value = '{"arrayValue":{"values":[' + value + "]}}"
    return (
        '{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"deep","value":'
        + value
        + "}]}]}]}]}"
    ).encode()


def nested_lists(depth: int) -> bytes:
    """``{"resourceSpans": [[[...]]]}``: lists nested ``depth`` deep."""
    return b'{"resourceSpans":' + b"[" * depth + b"]" * depth + b"}"


def gzip_bomb(size: int) -> bytes:
    """A gzip body inflating to ``size`` zero bytes (~1000x smaller than that)."""
    return gzip.compress(b"\x00" * size, compresslevel=9, mtime=0)


#: The receivers' limits while the OTLP corpus is replayed: the defaults scaled down ~10x,
#: so the files stay small; the full-size attacks (32 MB) are built by the tests.
TEST_LIMITS: dict[str, int] = {
    "max_resource_spans": 1_000,
    "max_scope_spans": 1_000,
    "max_spans": 10_000,
    "max_span_items": 10_000,
    "max_items": 100_000,
    "max_resource_bytes": 8_192,
    "max_json_objects": 50_000,
}
TEST_MAX_BYTES = 4 << 20

PB, JSON = "application/x-protobuf", "application/json"

#: name -> (body, content type, content encoding, expected HTTP status, expected gRPC
#: status name, or "" where the body cannot travel over gRPC)
OTLP: dict[str, tuple[Callable[[], bytes], str, str, int, str]] = {
    "pb-empty-resource-spans-2k": (
        lambda: empty_resource_spans(2_000),
        PB,
        "",
        413,
        "INVALID_ARGUMENT",
    ),
    "pb-empty-spans-20k": (lambda: empty_spans(20_000), PB, "", 413, "INVALID_ARGUMENT"),
    "pb-empty-events-20k": (lambda: empty_events(20_000), PB, "", 413, "INVALID_ARGUMENT"),
    "pb-resource-attribute-16k": (lambda: big_resource(16_384), PB, "", 413, "INVALID_ARGUMENT"),
    "pb-scope-attributes-10k": (lambda: big_scope(10_000), PB, "", 413, "INVALID_ARGUMENT"),
    "pb-any-value-nested-200": (lambda: nested_any_value(200), PB, "", 400, "INVALID_ARGUMENT"),
    "pb-body-over-limit": (  # gRPC: grpc's own status for an oversize message
        lambda: empty_spans(1) + b"\x1a\x00" * (TEST_MAX_BYTES // 2),
        PB,
        "",
        413,
        "RESOURCE_EXHAUSTED",
    ),
    "json-nested-250": (lambda: nested_json(250), JSON, "", 400, ""),
    # 1000 and 1020 deep: orjson (limit 1024) parses them, protobuf's ParseDict ran
    # out of stack: a 500 with a traceback before.
    "json-lists-1000": (lambda: nested_lists(1000), JSON, "", 400, ""),
    "json-lists-1020": (lambda: nested_lists(1020), JSON, "", 400, ""),
    "json-nested-1000": (lambda: nested_json(1000), JSON, "", 400, ""),
    "json-empty-resource-spans-2k": (
        lambda: b'{"resourceSpans":[' + b",".join([b"{}"] * 2_000) + b"]}",
        JSON,
        "",
        413,
        "",
    ),
    "json-objects-200k": (lambda: b"[" + b",".join([b"{}"] * 200_000) + b"]", JSON, "", 413, ""),
    "gzip-inflates-past-limit": (lambda: gzip_bomb(TEST_MAX_BYTES + 1), PB, "gzip", 413, ""),
}


def kv_cases() -> Iterator[tuple[str, list[bytes], str]]:
    """(name, frames, reason) of every KV file in the corpus."""
    manifest = json.loads(MANIFEST.read_text())
    for name, reason in sorted(manifest["kv"].items()):
        frames = msgspec.msgpack.decode((CORPUS / "kv" / f"{name}.msgpack").read_bytes())
        yield name, [bytes(f) for f in frames], reason


def otlp_cases() -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """(name, body, expectation) of every OTLP file in the corpus."""
    manifest = json.loads(MANIFEST.read_text())
    for name, expect in sorted(manifest["otlp"].items()):
        yield name, gzip.decompress((CORPUS / "otlp" / f"{name}.bin.gz").read_bytes()), expect


def write() -> None:
    """(Re)write the corpus files and the manifest from the builders above."""
    (CORPUS / "kv").mkdir(parents=True, exist_ok=True)
    (CORPUS / "otlp").mkdir(parents=True, exist_ok=True)
    for name, (frames, _reason) in KV.items():
        (CORPUS / "kv" / f"{name}.msgpack").write_bytes(msgspec.msgpack.encode(frames))
    otlp: dict[str, Any] = {}
    for name, (build, ctype, encoding, http, grpc) in OTLP.items():
        # Stored gzip-compressed (the big ones are mostly repetition); ``encoding`` says
        # whether the body is *sent* compressed.
        body = build()
        (CORPUS / "otlp" / f"{name}.bin.gz").write_bytes(gzip.compress(body, mtime=0))
        otlp[name] = {"content_type": ctype, "encoding": encoding, "http": http, "grpc": grpc}
    manifest = {"kv": {name: reason for name, (_f, reason) in KV.items()}, "otlp": otlp}
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write()
