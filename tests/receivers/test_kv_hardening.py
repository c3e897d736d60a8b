"""The KV subscriber against hostile senders (issue 17, items 2 and 4): every message in
the corpus is counted under its reason and the thread keeps serving; forged stream keys
and sequence numbers cost bounded memory and are not counted as gaps."""

from __future__ import annotations

import threading
import tracemalloc

import msgspec
import zmq
from corpus_inputs import kv_cases
from prometheus_client import CollectorRegistry

from coeffd.receivers.kv import KVSubscriber, SequenceTracker
from coeffd.receivers.kv.decode import decode_kv_message
from coeffd.records.events import KVRecord, Source

WAIT_S = 30.0  # a safety net against hangs, not a timing assertion
SOURCE = Source(id="s", attributes=())


def _good(seq: int, dp_rank: int = 0, ts: float = 1767225600.0) -> list[bytes]:
    payload = msgspec.msgpack.encode([ts, [["AllBlocksCleared"]], dp_rank, None])
    return [b"kv", seq.to_bytes(8, "big"), payload]


def test_every_corpus_message_is_rejected_with_its_reason() -> None:
    for name, frames, reason in kv_cases():
        records, got = decode_kv_message(frames, SOURCE)
        assert (records, got) == ([], reason), name


def test_corpus_through_a_real_socket_leaves_the_subscriber_alive() -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    got: list[KVRecord] = []
    cond = threading.Condition()

    def offer(records: list[KVRecord]) -> bool:
        with cond:
            got.extend(records)
            cond.notify_all()
        return True

    registry = CollectorRegistry()
    cases = list(kv_cases())
    try:
        with KVSubscriber(f"tcp://127.0.0.1:{port}", "", offer, registry=registry) as sub:
            seq = 0
            with cond:  # PUB/SUB slow joiner: probe until one batch arrives
                while not got:
                    pub.send_multipart(_good(seq, dp_rank=99))
                    seq += 1
                    cond.wait(0.05)
            for _name, frames, _reason in cases:
                pub.send_multipart(frames)
            pub.send_multipart(_good(0, dp_rank=1))
            with cond:
                assert cond.wait_for(lambda: any(r.batch.dp_rank == 1 for r in got), WAIT_S)
            thread = sub._thread
            assert thread is not None and thread.is_alive()
    finally:
        pub.close()
    for reason in {r for _n, _f, r in cases}:
        expected = sum(1 for _n, _f, r in cases if r == reason)
        assert sub.counts[reason] == expected, reason
        sample = registry.get_sample_value(
            "coeffd_events_rejected_total", {"receiver": "kv", "reason": reason}
        )
        assert sample == expected, reason
    assert sub.counts["internal_error"] == 0


def test_forged_ranks_and_jumps_stay_bounded() -> None:
    """1,000 forged data_parallel_rank keys, each jumping by 10^9 (confirmed by the next
    number: the tracker must remember the newest missing ones), then by 5,000 (another
    remembered gap): memory stays small (it was 908 MB)."""
    sub = KVSubscriber("tcp://127.0.0.1:1", "", lambda records: True, registry=CollectorRegistry())
    tracemalloc.start()
    try:
        for rank in range(1000):
            sub.handle(_good(0, dp_rank=rank))
            sub.handle(_good(10**9, dp_rank=rank, ts=1767225601.0))
            sub.handle(_good(10**9 + 1, dp_rank=rank, ts=1767225601.5))
            sub.handle(_good(10**9 + 5_001, dp_rank=rank, ts=1767225602.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A few remembered ranges per key; the old tracker kept 10,000 ints per key
    # (~0.9 MB each). 10 MB is 1/90 of what it used.
    assert peak < 10 << 20, peak
    assert sub.counts["sequence_jumps"] == 1000
    assert sub.counts["gap_batches"] == 1000 * (10**9 + 4_999)


def test_sequence_2_pow_64_minus_1_is_a_jump_not_a_gap() -> None:
    registry = CollectorRegistry()
    sub = KVSubscriber("tcp://127.0.0.1:1", "", lambda records: True, registry=registry)
    sub.handle(_good(5))
    sub.handle(_good(2**64 - 1, ts=1767225601.0))
    sub.handle(_good(6, ts=1767225602.0))  # the real publisher goes on: the jump was an outlier
    gaps = registry.get_sample_value("coeffd_kv_sequence_gaps_total", {"endpoint": sub.endpoint})
    jumps = registry.get_sample_value("coeffd_kv_sequence_jumps_total", {"endpoint": sub.endpoint})
    assert (gaps or 0.0) == 0.0 and jumps == 1.0
    assert sub.counts["restarts"] == 0 and sub.counts["batches"] == 2


def test_one_forged_frame_does_not_silence_the_stream() -> None:
    """Issue 32 item 4: after 100 valid batches one frame numbered 2^62 (stamped in the
    future) made the next 2,000 valid batches "duplicates". Now the frame is the outlier
    (counted, dropped) and every valid batch is accepted."""
    registry = CollectorRegistry()
    got: list[KVRecord] = []

    def offer(records: list[KVRecord]) -> bool:
        got.extend(records)
        return True

    sub = KVSubscriber("tcp://127.0.0.1:1", "", offer, registry=registry)
    t0 = 1767225600.0
    for seq in range(100):
        sub.handle(_good(seq, ts=t0 + seq))
    sub.handle(_good(2**62, ts=t0 + 10**6))
    for seq in range(100, 2100):
        sub.handle(_good(seq, ts=t0 + seq))
    jumps = registry.get_sample_value("coeffd_kv_sequence_jumps_total", {"endpoint": sub.endpoint})
    assert jumps == 1.0
    assert sub.counts["duplicate"] == 0 and sub.counts["batches"] == 2100
    assert sorted({r.batch.seq for r in got}) == list(range(2100))
    # A second forged frame, even one continuing the first, is outvoted by the live stream.
    sub.handle(_good(2**62 + 1, ts=t0 + 10**6))
    sub.handle(_good(2100, ts=t0 + 2100))
    assert sub.counts["batches"] == 2101 and sub.counts["sequence_jumps"] == 2


def test_a_real_skip_is_believed_when_the_stream_goes_on_from_it() -> None:
    """A publisher that really skipped far ahead: its first batch is held as an outlier,
    the next one (the old line silent meanwhile) moves the baseline and counts the gap."""
    t = SequenceTracker()
    assert t.observe("k", 0, 1.0) == ("first", 0)
    assert t.observe("k", 50_000, 2.0) == ("jump", 0)
    assert t.last_seq("k") == 0
    assert t.observe("k", 50_001, 2.1) == ("gap", 50_000)
    assert t.observe("k", 50_002, 2.2) == ("ok", 0)
    assert t.observe("k", 50_000, 2.0) == ("recovered", 0)  # the held one, from replay


def test_tracker_forgets_the_least_recently_seen_stream() -> None:
    t = SequenceTracker(max_keys=3)
    for key in "abc":
        t.observe(key, 0, 1.0)
    t.observe("a", 1, 2.0)  # a is now the most recent
    t.observe("d", 0, 1.0)  # evicts b
    assert len(t) == 3 and t.evicted == 1
    assert t.last_seq("b") is None and t.last_seq("a") == 1


def test_remembered_gaps_keep_the_newest_numbers() -> None:
    t = SequenceTracker(max_missing=10, max_ranges=2)
    t.observe("k", 0, 1.0)
    assert t.observe("k", 5, 2.0) == ("gap", 4)  # 1-4 missing
    assert t.observe("k", 20, 3.0) == ("gap", 14)  # keeps 10..19; 1-4 dropped (max 10)
    assert t.observe("k", 3, 1.5) == ("duplicate", 0)
    assert t.observe("k", 12, 2.5) == ("recovered", 0)
    assert t.observe("k", 12, 2.5) == ("duplicate", 0)
    assert t.observe("k", 19, 2.9) == ("recovered", 0)
