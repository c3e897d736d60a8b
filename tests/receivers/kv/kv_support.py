"""The spec §6.2 KV batch in both encodings (unique module name: no __init__.py in tests)."""

from __future__ import annotations

from typing import Any

import msgspec

TS = 1767225600.016412
TOPIC = b"kv-events"
SEQ = 1287
REMOVED_HASH = 15224618933070120907
STORED_HASH = 4819278823910183522
PARENT_HASH = 10335297741502385047
TOKENS = [791, 4320, 315, 9822, 374, 12366, 13, 3639, 374, 279, 6864, 315, 279, 15457, 30, 128009]

POSITIONAL_EVENTS: list[Any] = [
    ["BlockRemoved", [REMOVED_HASH], "GPU"],
    ["BlockStored", [STORED_HASH], PARENT_HASH, TOKENS, 16, None, "GPU", None],
]
MAP_EVENTS: list[Any] = [
    {"type": "BlockRemoved", "block_hashes": [REMOVED_HASH], "medium": "GPU"},
    {
        "type": "BlockStored",
        "block_hashes": [STORED_HASH],
        "parent_block_hash": PARENT_HASH,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    },
]
REQ = "chatcmpl-3f2a9c1e5b7d4a60-7c1d2e3f"
OFFLOAD_EVENTS: list[Any] = [
    ["CacheStoreCommitted", REQ, "CPU", 2, 1042],
    ["TransferInitiated", 1, REQ, "GPU", "CPU", 2, 1043],
    ["TransferCompleted", 1, REQ, "GPU", "CPU", 2, True, 1043],
    ["CacheEviction", "CPU", 4, "lru", 1042, None],
    ["CacheLoadCommitted", "internal-1", "CPU", 2, 1041],
    ["RemoteTransferInitiated", (1 << 32) | 7, REQ, "NIXL", 1, 0, 3],
    ["RemoteTransferCompleted", (1 << 32) | 7, REQ, "NIXL", 1, 0, 3, False],
    ["BlockStored", [b"\x01" * 32], None, [], 16, None, "CPU", None],
    ["AllBlocksCleared"],
]


def positional_payload(
    events: list[Any] = POSITIONAL_EVENTS, dp_rank: int = 0, ts: float = TS
) -> bytes:
    return msgspec.msgpack.encode([ts, events, dp_rank, None])


def map_payload(events: list[Any] = MAP_EVENTS, dp_rank: int = 0, ts: float = TS) -> bytes:
    return msgspec.msgpack.encode([ts, events, dp_rank])


def frames(payload: bytes, seq: int = SEQ, topic: bytes = TOPIC) -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload]
