"""KV-cache events exactly as the fork's ZMQ publisher sends them (spec §5).

Events are kept as plain tuples ``(tag, field1, field2, ...)`` in the fork's declaration
order, which makes both encodings a cheap rearrangement:

* positional (fork, default): each event is ``[tag, *fields]`` and the batch is the
  4-element ``[ts, events, data_parallel_rank, scheduler_step=None]``;
* map (upstream after vLLM #42892): each event is ``{"type": tag, name: value, ...}`` and
  the batch is the 3-element ``[ts, events, data_parallel_rank]``.

Sinks: a ZMQ PUB socket (3-frame multipart: topic, 8-byte big-endian sequence, msgpack)
and a JSON-lines file holding the exact msgpack payload (base64) per batch.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

import msgspec

KVEvent = tuple[Any, ...]

FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
    "TransferInitiated": (
        "transfer_id",
        "request_id",
        "source_medium",
        "dest_medium",
        "block_count",
        "scheduler_step",
    ),
    "TransferCompleted": (
        "transfer_id",
        "request_id",
        "source_medium",
        "dest_medium",
        "block_count",
        "success",
        "scheduler_step",
    ),
    "CacheLoadCommitted": ("request_id", "medium", "block_count", "scheduler_step"),
    "CacheStoreCommitted": ("request_id", "medium", "block_count", "scheduler_step"),
    "CacheEviction": (
        "medium",
        "blocks_evicted",
        "eviction_reason",
        "scheduler_step",
        "block_hashes",
    ),
}

_ENC = msgspec.msgpack.Encoder()


def encode_batch(ts: float, events: list[KVEvent], dp_rank: int, form: str = "array") -> bytes:
    """msgpack payload of one ``KVEventBatch`` (spec §5.3–§5.5)."""
    if form == "array":
        return _ENC.encode([ts, [list(e) for e in events], dp_rank, None])
    if form == "map":
        evs = [{"type": e[0], **dict(zip(FIELDS[e[0]], e[1:], strict=True))} for e in events]
        return _ENC.encode([ts, evs, dp_rank])
    raise ValueError(f"unknown KV encoding {form!r} (array|map)")


class KVSink(Protocol):
    """Receives one encoded batch per publish."""

    def publish(self, topic: bytes, seq: int, payload: bytes, source: Mapping[str, Any]) -> None:
        """Send or store one batch."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


class KVEndpointError(RuntimeError):
    """A connecting KV publisher with nothing to connect to (the message says what to do)."""


def require_listener(endpoint: str, timeout_s: float = 2.0) -> None:
    """Raise :class:`KVEndpointError` unless something accepts TCP connections at
    ``endpoint``: a PUB that connects to a SUB that also connects never meets it, and
    ZMQ retries silently forever — every KV event would be lost without a word."""
    if not endpoint.startswith("tcp://"):
        return
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise KVEndpointError(
            f"nothing accepts connections at {endpoint} ({exc}): a KV publisher that "
            f"connects needs a subscriber bound there (coeffd serve --kv-endpoint {endpoint} "
            "--set kv.bind=true --set kv.topic_sources=true), or let the engines bind "
            f"(--kv-endpoint 'tcp://*:{port}') and coeffd connect to them"
        ) from None


class ZmqPublisher:
    """One PUB socket per engine, vLLM's bind/connect heuristic (spec §5.1).

    Binds if the endpoint contains ``*`` or ``::`` or is ipc/inproc, else connects (the
    natural fan-in for a fleet: every engine connects to the receiver's bound SUB).
    ``port_offset`` mirrors vLLM's DP-rank port offset for bound TCP endpoints.
    """

    def __init__(self, endpoint: str, port_offset: int = 0, hwm: int = 100_000) -> None:
        import zmq

        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 2000)
        bind = "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
        if port_offset and endpoint.startswith("tcp://") and bind:
            host, _, port = endpoint.rpartition(":")
            endpoint = f"{host}:{int(port) + port_offset}"
        if bind:
            self._sock.bind(endpoint)
        else:
            require_listener(endpoint)
            self._sock.connect(endpoint)
        self._zmq = zmq

    def publish(self, topic: bytes, seq: int, payload: bytes, source: Mapping[str, Any]) -> None:
        # PUB semantics: drop above HWM (receivers detect the sequence gap)
        with contextlib.suppress(self._zmq.Again):
            self._sock.send_multipart(
                [topic, seq.to_bytes(8, "big"), payload], flags=self._zmq.NOBLOCK
            )

    def close(self) -> None:
        self._sock.close()


@dataclass(frozen=True, slots=True)
class KVFileRecord:
    """One line of a KV JSON-lines recording."""

    source: dict[str, Any]  # resource attributes of the engine (same as its OTLP resource)
    topic: bytes
    seq: int
    payload: bytes  # exact msgpack frame 2


class KVJsonlWriter:
    """``{"source": {...}, "topic": str, "seq": int, "payload": base64}`` per batch."""

    def __init__(self, fh: IO[str]) -> None:
        self._fh = fh

    def publish(self, topic: bytes, seq: int, payload: bytes, source: Mapping[str, Any]) -> None:
        self._fh.write(
            json.dumps(
                {
                    "source": dict(source),
                    "topic": topic.decode(),
                    "seq": seq,
                    "payload": base64.b64encode(payload).decode(),
                },
                separators=(",", ":"),
            )
        )
        self._fh.write("\n")

    def close(self) -> None:
        self._fh.flush()


def read_kv_jsonl(fh: IO[str]) -> Iterator[KVFileRecord]:
    """Read a recording written by ``KVJsonlWriter`` (for replay and tests)."""
    for line in fh:
        if not line.strip():
            continue
        d = json.loads(line)
        yield KVFileRecord(
            d.get("source", {}),
            d.get("topic", "").encode(),
            int(d["seq"]),
            base64.b64decode(d["payload"]),
        )


class MemoryKVSink:
    """Keeps ``(topic, seq, payload, source)`` in memory (tests, in-process embedding)."""

    def __init__(self) -> None:
        self.batches: list[tuple[bytes, int, bytes, dict[str, Any]]] = []

    def publish(self, topic: bytes, seq: int, payload: bytes, source: Mapping[str, Any]) -> None:
        self.batches.append((topic, seq, payload, dict(source)))

    def close(self) -> None:
        pass
