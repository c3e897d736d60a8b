"""KV decoding: the spec §6.2 batch in both forms, all event types, and bad input."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest
from kv_support import (
    MAP_EVENTS,
    OFFLOAD_EVENTS,
    PARENT_HASH,
    POSITIONAL_EVENTS,
    REMOVED_HASH,
    REQ,
    SEQ,
    STORED_HASH,
    TOKENS,
    frames,
    map_payload,
    positional_payload,
)

from coeffd.receivers.kv import decode_kv_message, parse_payload
from coeffd.receivers.kv.decode import parse_message
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import (
    KVAllCleared,
    KVBatchInfo,
    KVBlocks,
    KVCacheCommit,
    KVCacheEviction,
    KVRemoteTransfer,
    KVTransfer,
)

SOURCE = source_from_attributes({"service.name": "vllm", "kv.endpoint": "tcp://vllm:5557"})
INFO = KVBatchInfo(
    source=SOURCE, topic="kv-events", seq=SEQ, wall_ns=1767225600016412000, dp_rank=0
)
EXPECTED = [
    KVBlocks(INFO, stored=False, medium="GPU", num_blocks=1),
    KVBlocks(INFO, stored=True, medium="GPU", num_blocks=1, num_tokens=16, block_size=16),
]


def test_spec_bytes_positional() -> None:
    payload = positional_payload()
    # spec §6.2: "129 bytes msgpack, starts 94 cb 41 da 55 6e 40 01 0c e5 92"
    assert len(payload) == 129
    assert payload[:11] == bytes.fromhex("94cb41da556e40010ce592")
    f = frames(payload)
    assert f[0].hex() == "6b762d6576656e7473" and f[1].hex() == "0000000000000507"


@pytest.mark.parametrize("payload", [positional_payload(), map_payload()], ids=["fork", "upstream"])
def test_spec_batch_both_forms(payload: bytes) -> None:
    msg = parse_message(frames(payload))
    assert (msg.topic, msg.seq) == ("kv-events", 1287)
    batch = msg.batch
    assert batch.dp_rank == 0 and batch.scheduler_step is None
    removed, stored = batch.events
    assert removed.tag == "BlockRemoved" and removed.fields["block_hashes"] == [REMOVED_HASH]
    assert stored.tag == "BlockStored"
    assert stored.fields["block_hashes"] == [STORED_HASH]
    assert stored.fields["parent_block_hash"] == PARENT_HASH
    assert stored.fields["token_ids"] == TOKENS
    records, error = decode_kv_message(frames(payload), SOURCE)
    assert error is None
    assert records == EXPECTED


def test_both_forms_equal() -> None:
    a = parse_payload(positional_payload())
    b = parse_payload(map_payload())
    assert a.events == b.events
    assert (a.form, b.form) == ("array", "map")


def test_all_event_types_positional_and_map() -> None:
    from coeffd.simfleet.kv import (
        FIELDS,  # the fleet's own declaration order, as an independent check
    )

    map_events = [
        {"type": e[0], **dict(zip(FIELDS.get(e[0], ()), e[1:], strict=False))}
        for e in OFFLOAD_EVENTS
    ]
    # RemoteTransfer* are not in simfleet's table: name them by hand.
    names = (
        "transfer_id",
        "request_id",
        "connector_type",
        "source_rank",
        "dest_rank",
        "block_count",
        "success",
    )
    for ev, raw in zip(map_events, OFFLOAD_EVENTS, strict=True):
        if raw[0].startswith("RemoteTransfer"):
            ev.update(dict(zip(names, raw[1:], strict=False)))
    pos, err1 = decode_kv_message(frames(positional_payload(OFFLOAD_EVENTS, dp_rank=1)), SOURCE)
    mp, err2 = decode_kv_message(frames(map_payload(map_events, dp_rank=1)), SOURCE)
    assert err1 is None and err2 is None
    assert pos == mp
    info = pos[0].batch
    assert info.dp_rank == 1
    assert pos == [
        KVCacheCommit(
            info, load=False, request_id=REQ, medium="CPU", block_count=2, scheduler_step=1042
        ),
        KVTransfer(info, False, 1, REQ, "GPU", "CPU", 2, 1043),
        KVTransfer(info, True, 1, REQ, "GPU", "CPU", 2, 1043, success=True),
        KVCacheEviction(info, medium="CPU", blocks_evicted=4, reason="lru", scheduler_step=1042),
        KVCacheCommit(
            info,
            load=True,
            request_id="internal-1",
            medium="CPU",
            block_count=2,
            scheduler_step=1041,
        ),
        KVRemoteTransfer(info, False, (1 << 32) | 7, REQ, "NIXL", 1, 0, 3),
        KVRemoteTransfer(info, True, (1 << 32) | 7, REQ, "NIXL", 1, 0, 3, success=False),
        KVBlocks(info, stored=True, medium="CPU", num_blocks=1, num_tokens=0, block_size=16),
        KVAllCleared(info),
    ]


def test_tolerates_extra_trailing_elements_and_unknown_keys() -> None:
    events: list[Any] = [[*POSITIONAL_EVENTS[0], "future", 1], [*POSITIONAL_EVENTS[1], {"x": 1}]]
    records, error = decode_kv_message(frames(positional_payload(events)), SOURCE)
    assert error is None and records == EXPECTED
    map_events = [
        dict(MAP_EVENTS[0], extra_keys=None),
        dict(MAP_EVENTS[1], group_idx=0, kv_cache_spec_kind="full"),
    ]
    del map_events[1]["lora_id"], map_events[1]["lora_name"]  # default-valued keys may be omitted
    records, error = decode_kv_message(frames(map_payload(map_events)), SOURCE)
    assert error is None and records == EXPECTED


def test_bytes_hashes() -> None:
    events = [["BlockRemoved", [b"\xff" * 32, b"\x00" * 32], "CPU"]]
    batch = parse_payload(positional_payload(events))
    assert batch.events[0].fields["block_hashes"] == [b"\xff" * 32, b"\x00" * 32]


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        ([b"kv-events", b"\x00" * 8], "frame_count"),
        ([b"kv-events", b"\x00" * 8, b"\x90", b"x"], "frame_count"),
        ([b"kv-events", b"\x00" * 4, positional_payload()], "bad_sequence"),
        ([b"\xff\xfe", b"\x00" * 8, positional_payload()], "bad_topic"),
        ([b"", b"\x00" * 8, b"\xc1garbage"], "bad_msgpack"),
        ([b"", b"\x00" * 8, positional_payload()[:50]], "bad_msgpack"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode({"ts": 1.0})], "bad_batch"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, []])], "bad_batch"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode(["x", [], 0])], "bad_batch"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, {}, 0])], "bad_batch"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, [], -1])], "bad_batch"),
        ([b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, [], 0, "step"])], "bad_batch"),
    ],
)
def test_bad_messages_rejected_with_reason(msg: list[bytes], reason: str) -> None:
    records, error = decode_kv_message(msg, SOURCE)
    assert (records, error) == ([], reason)


def test_bad_and_unknown_events_counted_others_kept() -> None:
    events: list[Any] = [
        ["FutureEvent", 1, 2],
        {"type": "AnotherFuture"},
        ["BlockRemoved", "not-a-list", "GPU"],
        ["BlockStored", [1], None],  # truncated
        ["TransferCompleted", 1, REQ, "GPU", "CPU", 2, "yes", 1043],  # success not bool
        {"type": "CacheEviction", "medium": "CPU"},  # missing required keys
        {"no_type": 1},
        [],
        [42],
        "scalar",
        ["BlockRemoved", [1.5], "GPU"],  # hash neither int nor bytes
        *POSITIONAL_EVENTS,
    ]
    counts: Counter[str] = Counter()
    records, error = decode_kv_message(frames(positional_payload(events)), SOURCE, counts)
    assert error is None
    assert records == EXPECTED
    assert counts == Counter({"unknown_tag": 2, "bad_event": 9})
