"""KV events: framing, both encodings, TP copies (§5.8), CacheLoadCommitted off-by-one."""

from __future__ import annotations

import collections
import io
from dataclasses import replace

import msgspec

from coeffd import simfleet
from coeffd.receivers.kv.decode import batch_records, parse_payload
from coeffd.receivers.kv.jsonl import read_kv_jsonl
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import KVBlocks, KVCacheCommit, KVTransfer
from coeffd.simfleet.kv import MemoryKVSink
from coeffd.simfleet.scenarios import build


def _offload_tp2() -> simfleet.EngineSpec:
    spec = {e.name: e for e in build("fleet", 1.0)}["fleet-llama8b-a100-offload"]
    # a small GPU pool forces CPU-tier hits (loads); TP 2 makes every transfer appear twice
    return replace(spec, serving=replace(spec.serving, tp=2, num_gpu_blocks=900))


def test_offload_events_tp_copies_and_step_tags():
    sink = MemoryKVSink()
    res = simfleet.run([_offload_tp2()], 6.0, seed=3, kv_sinks=[sink], drain_s=10.0)
    assert [s for _t, s, _p, _src in sink.batches] == list(range(len(sink.batches)))
    load_commit: dict[str, int] = {}
    load_init: dict[str, int] = {}
    store_commit: dict[str, list[int]] = collections.defaultdict(list)
    store_init: dict[str, list[int]] = collections.defaultdict(list)
    durations = []
    started: dict[int, float] = {}
    cpu_stored = gpu_stored = 0
    for _topic, _seq, payload, _src in sink.batches:
        raw = msgspec.msgpack.decode(payload)
        assert len(raw) == 4 and raw[2] == 0 and raw[3] is None  # fork batch, dp rank 0
        evs = raw[1]
        i = 0
        while i < len(evs):
            ev = evs[i]
            tag = ev[0]
            if tag in ("TransferInitiated", "TransferCompleted"):
                assert evs[i + 1] == ev  # TP=2: two identical adjacent copies
                assert i + 2 >= len(evs) or evs[i + 2] != ev
                if tag == "TransferInitiated":
                    started[ev[1]] = raw[0]
                    if ev[3] == "CPU":
                        load_init[ev[2]] = ev[6]
                    else:
                        store_init[ev[2]].append(ev[6])
                else:
                    assert ev[6] is True
                    durations.append((ev[1], raw[0] - started[ev[1]]))
                i += 2
                continue
            if tag == "CacheLoadCommitted":
                load_commit[ev[1]] = ev[4]
            if tag == "CacheStoreCommitted":
                store_commit[ev[1]].append(ev[4])
            if tag == "BlockStored":
                if ev[6] == "CPU":
                    cpu_stored += 1
                    assert all(isinstance(h, bytes) for h in ev[1]) and ev[3] == []
                else:
                    gpu_stored += 1
                    assert all(isinstance(h, int) for h in ev[1])
                    assert len(ev[3]) == 16 * len(ev[1])
            i += 1
    assert cpu_stored and gpu_stored and durations
    assert load_commit, "no CPU-tier load happened"
    for rid, step in load_commit.items():
        assert load_init[rid] == step + 1  # committed while admitting in N, tagged N-1
    assert store_commit
    for rid, steps in store_commit.items():
        # store planned in N is submitted with the next step's batch, tagged with it
        assert all(i > c for c, i in zip(steps, store_init[rid], strict=False)), rid
    truth = res.truth["configurations"][0]
    assert truth["kv_bytes_per_block"] > 0
    assert res.engines[0].num_transfers == len(started)


def test_map_encoding_and_receiver_decoding():
    spec = _offload_tp2()
    for form in ("array", "map"):
        sink = MemoryKVSink()
        simfleet.run([spec], 2.0, seed=4, kv_sinks=[sink], kv_form=form, drain_s=5.0)
        kinds = collections.Counter()
        for topic, seq, payload, src in sink.batches:
            raw = parse_payload(payload)
            assert raw.form == form
            recs = batch_records(raw, source_from_attributes(src), topic.decode(), seq)
            kinds.update(type(r).__name__ for r in recs)
        assert kinds["KVBlocks"] and kinds["KVTransfer"] and kinds["KVCacheCommit"]
        if form == "map":
            ev = msgspec.msgpack.decode(sink.batches[0][2])
            assert len(ev) == 3 and isinstance(ev[1][0], dict) and "type" in ev[1][0]


def test_kv_jsonl_file_replays_through_the_receiver():
    buf = io.StringIO()
    simfleet.run([_offload_tp2()], 2.0, seed=4, kv_out=buf, drain_s=5.0)
    buf.seek(0)
    counts: collections.Counter[str] = collections.Counter()
    recs = [r for batch in read_kv_jsonl(buf, counts) for r in batch]
    assert not counts
    assert any(isinstance(r, KVBlocks) for r in recs)
    assert any(isinstance(r, KVTransfer) for r in recs)
    assert any(isinstance(r, KVCacheCommit) and not r.load for r in recs)


def test_cpu_tier_eviction_events():
    """A small CPU tier evicts (LRU): CacheEviction right before its CacheStoreCommitted,
    CPU BlockRemoved with raw hash bytes; every event decodes with the KV receiver."""
    spec = _offload_tp2()
    spec = replace(spec, serving=replace(spec.serving, cpu_offload_gib=0.25))
    sink = MemoryKVSink()
    simfleet.run([spec], 4.0, seed=6, kv_sinks=[sink], drain_s=5.0)
    evictions = 0
    for _topic, seq, payload, src in sink.batches:
        raw = msgspec.msgpack.decode(payload)
        tags = [e[0] for e in raw[1]]
        for i, ev in enumerate(raw[1]):
            if ev[0] == "CacheEviction":
                evictions += 1
                assert ev[1] == "CPU" and ev[2] > 0 and ev[3] == "lru" and ev[5] is None
                assert tags[i + 1] == "CacheStoreCommitted" and raw[1][i + 1][4] == ev[4]
            if ev[0] == "BlockRemoved" and ev[2] == "CPU":
                assert all(isinstance(h, bytes) and len(h) == 8 for h in ev[1])
        counts: collections.Counter[str] = collections.Counter()
        raw_batch = parse_payload(payload, counts)
        assert not counts and len(raw_batch.events) == len(raw[1])  # nothing rejected
        assert batch_records(raw_batch, source_from_attributes(src), "", seq)
    assert evictions > 0
