"""Decode vLLM's ZMQ KV-event messages into ``receivers.records`` KV records.

Spec: ``vllm-telemetry.md`` §5. A message is 3 frames: topic (UTF-8), sequence (8-byte
unsigned big-endian), msgpack payload. The payload is a positional batch
``[ts, events, data_parallel_rank(, scheduler_step)]``: 4 elements from the fork, 3 from
upstream. Each event is either

* an **array** (fork, ``array_like``): ``[tag, field1, field2, ...]`` in declaration
  order; extra trailing elements (a newer publisher) are ignored; or
* a **map** (upstream after vLLM #42892): ``{"type": tag, name: value, ...}``; unknown
  keys are ignored and fields with a ``None`` default may be absent.

Decoding is two steps so tests (and tools) can see the exact wire values: ``parse_payload``
normalises both forms into ``RawKVBatch`` (tag + fields by name, hashes kept as u64 ints or
bytes), then ``batch_records`` maps that onto the record contract. Untyped msgpack decoding
plus hand dispatch is used instead of typed msgspec structs because array-like structs
reject extra trailing elements and a map/array union per event is not expressible as one
msgspec type.

Bad input never raises out of ``decode_kv_message``: a malformed message is returned as
``([], reason)``; a malformed or unknown event inside a good batch is skipped and counted
in the caller's ``counts`` (reasons ``bad_event``, ``unknown_tag``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import msgspec

from coeffd.records.events import (
    KVAllCleared,
    KVBatchInfo,
    KVBlocks,
    KVCacheCommit,
    KVCacheEviction,
    KVRecord,
    KVRemoteTransfer,
    KVTransfer,
    Source,
)

# Message-level rejection reasons (label values of coeffd_events_rejected_total{receiver="kv"}).
FRAME_COUNT = "frame_count"
BAD_SEQUENCE = "bad_sequence"
BAD_TOPIC = "bad_topic"
BAD_MSGPACK = "bad_msgpack"
BAD_BATCH = "bad_batch"
# Event-level reasons (the batch's other events are kept).
BAD_EVENT = "bad_event"
UNKNOWN_TAG = "unknown_tag"

_U64 = 1 << 64
#: Largest batch ``ts`` (seconds) whose nanoseconds fit an int64, like OTLP timestamps.
MAX_TS = ((1 << 63) - 1) / 1e9


class KVDecodeError(ValueError):
    """A whole message is unusable; ``reason`` is a short metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


# --------------------------------------------------------------------- field checkers

Checker = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_hash(v: Any) -> bool:
    # GPU hashes are u64 ints by default (some encoders emit them as signed i64),
    # CPU-tier hashes and VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 give raw bytes.
    return (_is_int(v) and -(1 << 63) <= v < _U64) or isinstance(v, bytes)


def _list_of(check: Checker) -> Checker:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _nullable(check: Checker) -> Checker:
    return lambda v: v is None or check(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


_INT = _is_int
_STR = _is_str
_HASHES = _list_of(_is_hash)
_OPT_INT = _nullable(_is_int)
_OPT_STR = _nullable(_is_str)

Field = tuple[str, Checker, bool]  # (name, checker, required in the map form)

_TRANSFER: tuple[Field, ...] = (
    ("transfer_id", _INT, True),
    ("request_id", _STR, True),
    ("source_medium", _STR, True),
    ("dest_medium", _STR, True),
    ("block_count", _INT, True),
)
_REMOTE: tuple[Field, ...] = (
    ("transfer_id", _INT, True),
    ("request_id", _STR, True),
    ("connector_type", _STR, True),
    ("source_rank", _INT, True),
    ("dest_rank", _INT, True),
    ("block_count", _INT, True),
)
_COMMIT: tuple[Field, ...] = (
    ("request_id", _STR, True),
    ("medium", _STR, True),
    ("block_count", _INT, True),
    ("scheduler_step", _OPT_INT, False),
)
_STEP: Field = ("scheduler_step", _OPT_INT, False)
_SUCCESS: Field = ("success", _is_bool, True)

#: tag -> fields in the fork's declaration order (spec §5.4).
SCHEMA: dict[str, tuple[Field, ...]] = {
    "BlockStored": (
        ("block_hashes", _HASHES, True),
        ("parent_block_hash", _nullable(_is_hash), False),
        ("token_ids", _list_of(_is_int), True),
        ("block_size", _INT, True),
        ("lora_id", _OPT_INT, False),
        ("medium", _OPT_STR, False),
        ("lora_name", _OPT_STR, False),
    ),
    "BlockRemoved": (("block_hashes", _HASHES, True), ("medium", _OPT_STR, False)),
    "AllBlocksCleared": (),
    "TransferInitiated": (*_TRANSFER, _STEP),
    "TransferCompleted": (*_TRANSFER, _SUCCESS, _STEP),
    "RemoteTransferInitiated": _REMOTE,
    "RemoteTransferCompleted": (*_REMOTE, _SUCCESS),
    "CacheLoadCommitted": _COMMIT,
    "CacheStoreCommitted": _COMMIT,
    "CacheEviction": (
        ("medium", _STR, True),
        ("blocks_evicted", _INT, True),
        ("eviction_reason", _STR, True),
        _STEP,
        ("block_hashes", _nullable(_HASHES), False),
    ),
}


# -------------------------------------------------------------------------- raw form


class RawKVEvent(msgspec.Struct, frozen=True):
    """One event with its wire values by field name (both encodings normalise to this)."""

    tag: str
    fields: dict[str, Any]


class RawKVBatch(msgspec.Struct, frozen=True):
    """One ``KVEventBatch`` as sent; ``form`` is ``array``, ``map``, ``mixed`` or ``empty``."""

    ts: float
    events: list[RawKVEvent]
    dp_rank: int
    scheduler_step: int | None
    form: str


class KVMessage(msgspec.Struct, frozen=True):
    """A decoded 3-frame message."""

    topic: str
    seq: int
    batch: RawKVBatch


def _parse_event(ev: Any, counts: Counter[str]) -> tuple[RawKVEvent | None, str]:
    if isinstance(ev, list):
        if not ev or not isinstance(ev[0], str):
            counts[BAD_EVENT] += 1
            return None, ""
        tag = ev[0]
        schema = SCHEMA.get(tag)
        if schema is None:
            counts[UNKNOWN_TAG] += 1
            return None, ""
        values = ev[1:]
        # Positional: every field up to the last required one must be there (the fork
        # always sends all fields; a shorter array is truncated, not "defaulted").
        n_required = max((i + 1 for i, (_f, _c, req) in enumerate(schema) if req), default=0)
        if len(values) < n_required:
            counts[BAD_EVENT] += 1
            return None, ""
        fields = {
            name: (values[i] if i < len(values) else None)
            for i, (name, _c, _r) in enumerate(schema)
        }
        form = "array"
    elif isinstance(ev, dict):
        map_tag = ev.get("type")
        if not isinstance(map_tag, str):
            counts[BAD_EVENT] += 1
            return None, ""
        tag = map_tag
        schema = SCHEMA.get(tag)
        if schema is None:
            counts[UNKNOWN_TAG] += 1
            return None, ""
        if any(req and name not in ev for name, _c, req in schema):
            counts[BAD_EVENT] += 1
            return None, ""
        fields = {name: ev.get(name) for name, _c, _r in schema}
        form = "map"
    else:
        counts[BAD_EVENT] += 1
        return None, ""
    for name, check, _req in schema:
        if not check(fields[name]):
            counts[BAD_EVENT] += 1
            return None, ""
    return RawKVEvent(tag, fields), form


def parse_batch(obj: Any, counts: Counter[str] | None = None) -> RawKVBatch:
    """Normalise a decoded batch (msgpack or JSON objects); raises ``KVDecodeError``."""
    if counts is None:
        counts = Counter()
    if not isinstance(obj, list) or len(obj) < 3:
        raise KVDecodeError(BAD_BATCH, "batch is not an array of 3 or 4 elements")
    ts, events, dp_rank = obj[0], obj[1], obj[2]
    step = obj[3] if len(obj) > 3 else None
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts <= MAX_TS:
        # (NaN fails the comparison too.) Wall-clock ns must fit OTLP's int64.
        raise KVDecodeError(BAD_BATCH, f"ts {ts!r} is not a time in seconds since the epoch")
    if not isinstance(events, list):
        raise KVDecodeError(BAD_BATCH, "events is not an array")
    if not _is_int(dp_rank) or dp_rank < 0:
        raise KVDecodeError(BAD_BATCH, f"data_parallel_rank {dp_rank!r} is not an int >= 0")
    if not _OPT_INT(step):
        raise KVDecodeError(BAD_BATCH, f"scheduler_step {step!r} is not an int or nil")
    out: list[RawKVEvent] = []
    forms: set[str] = set()
    for ev in events:
        raw, form = _parse_event(ev, counts)
        if raw is not None:
            out.append(raw)
            forms.add(form)
    form = forms.pop() if len(forms) == 1 else ("mixed" if forms else "empty")
    return RawKVBatch(float(ts), out, dp_rank, step, form)


_decoder = msgspec.msgpack.Decoder()


def parse_payload(payload: bytes, counts: Counter[str] | None = None) -> RawKVBatch:
    """msgpack frame 2 -> ``RawKVBatch``; raises ``KVDecodeError``."""
    try:
        obj = _decoder.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # A msgpack str with invalid UTF-8 raises UnicodeDecodeError, not DecodeError.
        raise KVDecodeError(BAD_MSGPACK, str(exc)) from exc
    except RecursionError:
        # msgspec recurses per nesting level: a few thousand nested arrays exhaust the
        # stack. No valid batch nests deeper than 3 levels.
        raise KVDecodeError(BAD_MSGPACK, "nested too deeply") from None
    return parse_batch(obj, counts)


def parse_message(frames: Sequence[bytes], counts: Counter[str] | None = None) -> KVMessage:
    """3 frames -> ``KVMessage``; raises ``KVDecodeError``."""
    if len(frames) != 3:
        raise KVDecodeError(FRAME_COUNT, f"expected 3 frames, got {len(frames)}")
    topic_b, seq_b, payload = (bytes(f) for f in frames)
    if len(seq_b) != 8:
        raise KVDecodeError(BAD_SEQUENCE, f"sequence frame has {len(seq_b)} bytes, expected 8")
    try:
        topic = topic_b.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KVDecodeError(BAD_TOPIC, "topic is not UTF-8") from exc
    return KVMessage(topic, int.from_bytes(seq_b, "big"), parse_payload(payload, counts))


# --------------------------------------------------------------------------- records


def wall_ns_from_seconds(ts: float) -> int:
    """Float seconds -> int ns via the float's shortest decimal spelling.

    At 2026 epochs a float64 second count has ~240 ns resolution, so ``round(ts * 1e9)``
    (or the float's exact binary value) lands up to ~120 ns away from the value the
    publisher's clock read; the shortest repr is that value whenever it had ≤ 7 decimals.

    >>> wall_ns_from_seconds(1767225600.016412)
    1767225600016412000
    """
    return int((Decimal(repr(float(ts))) * 1_000_000_000).to_integral_value(ROUND_HALF_EVEN))


def batch_records(raw: RawKVBatch, source: Source, topic: str, seq: int) -> list[KVRecord]:
    """Map a normalised batch onto the record contract (one record per event, in order)."""
    info = KVBatchInfo(
        source=source,
        topic=topic,
        seq=seq,
        wall_ns=wall_ns_from_seconds(raw.ts),
        dp_rank=raw.dp_rank,
    )
    out: list[KVRecord] = []
    for ev in raw.events:
        f = ev.fields
        tag = ev.tag
        if tag == "BlockStored":
            out.append(
                KVBlocks(
                    info,
                    stored=True,
                    medium=f["medium"],
                    num_blocks=len(f["block_hashes"]),
                    num_tokens=len(f["token_ids"]),
                    block_size=f["block_size"],
                )
            )
        elif tag == "BlockRemoved":
            out.append(
                KVBlocks(info, stored=False, medium=f["medium"], num_blocks=len(f["block_hashes"]))
            )
        elif tag == "AllBlocksCleared":
            out.append(KVAllCleared(info))
        elif tag in ("TransferInitiated", "TransferCompleted"):
            completed = tag == "TransferCompleted"
            out.append(
                KVTransfer(
                    info,
                    completed=completed,
                    transfer_id=f["transfer_id"],
                    request_id=f["request_id"],
                    source_medium=f["source_medium"],
                    dest_medium=f["dest_medium"],
                    block_count=f["block_count"],
                    scheduler_step=f["scheduler_step"],
                    success=f["success"] if completed else None,
                )
            )
        elif tag in ("RemoteTransferInitiated", "RemoteTransferCompleted"):
            completed = tag == "RemoteTransferCompleted"
            out.append(
                KVRemoteTransfer(
                    info,
                    completed=completed,
                    transfer_id=f["transfer_id"],
                    request_id=f["request_id"],
                    connector_type=f["connector_type"],
                    source_rank=f["source_rank"],
                    dest_rank=f["dest_rank"],
                    block_count=f["block_count"],
                    success=f["success"] if completed else None,
                )
            )
        elif tag in ("CacheLoadCommitted", "CacheStoreCommitted"):
            out.append(
                KVCacheCommit(
                    info,
                    load=tag == "CacheLoadCommitted",
                    request_id=f["request_id"],
                    medium=f["medium"],
                    block_count=f["block_count"],
                    scheduler_step=f["scheduler_step"],
                )
            )
        elif tag == "CacheEviction":
            out.append(
                KVCacheEviction(
                    info,
                    medium=f["medium"],
                    blocks_evicted=f["blocks_evicted"],
                    reason=f["eviction_reason"],
                    scheduler_step=f["scheduler_step"],
                )
            )
    return out


def decode_kv_message(
    frames: Sequence[bytes], source: Source, counts: Counter[str] | None = None
) -> tuple[list[KVRecord], str | None]:
    """3 ZMQ frames -> ``(records, None)``, or ``([], reason)`` for a rejected message.

    Skipped events of an accepted batch are added to ``counts`` (``bad_event``,
    ``unknown_tag``) when given.
    """
    try:
        msg = parse_message(frames, counts)
    except KVDecodeError as exc:
        return [], exc.reason
    return batch_records(msg.batch, source, msg.topic, msg.seq), None
