"""KVSubscriber through real ZMQ PUB -> SUB sockets on loopback, with real 3-frame messages."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from kv_support import (
    OFFLOAD_EVENTS,
    POSITIONAL_EVENTS,
    TOPIC,
    frames,
    map_payload,
    positional_payload,
)
from prometheus_client import CollectorRegistry

from coeffd.receivers.kv import KVMetrics, KVSubscriber, SequenceTracker
from coeffd.receivers.metrics import ReceiverMetrics
from coeffd.records.events import KVRecord

WAIT_S = 30.0  # a safety net against hangs, not a timing assertion


class Sink:
    """The pipeline's offer(): collects records; can simulate a full queue."""

    def __init__(self, accept: bool = True) -> None:
        self.records: list[KVRecord] = []
        self.accept = accept
        self.cond = threading.Condition()

    def offer(self, records: list[KVRecord]) -> bool:
        with self.cond:
            self.records.extend(records)
            self.cond.notify_all()
        return self.accept

    def wait_for(self, pred: Callable[[list[KVRecord]], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.records), WAIT_S), "records never arrived"


def _publish_until_subscribed(pub: zmq.Socket[Any], sink: Sink) -> None:
    """PUB/SUB 'slow joiner': send probe batches on DP rank 99 until one arrives."""
    seq = 0
    while True:
        pub.send_multipart(
            frames(positional_payload([["AllBlocksCleared"]], dp_rank=99, ts=1.0 + seq), seq=seq)
        )
        seq += 1
        with sink.cond:
            if sink.cond.wait_for(lambda: any(r.batch.dp_rank == 99 for r in sink.records), 0.05):
                return


@pytest.fixture
def pub() -> Iterator[tuple[zmq.Socket[Any], str]]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield sock, f"tcp://127.0.0.1:{port}"
    finally:
        sock.close()


def test_pub_sub_counts_gaps_duplicates_and_bad_input(pub: tuple[zmq.Socket[Any], str]) -> None:
    sock, endpoint = pub
    registry = CollectorRegistry()
    receiver_metrics = ReceiverMetrics(registry)  # the app's families: shared, not re-registered
    metrics = KVMetrics(
        registry,
        events_rejected=receiver_metrics.events_rejected,
        events_received=receiver_metrics.events_received,
    )
    sink = Sink()
    with KVSubscriber(endpoint, "kv-events", sink.offer, metrics=metrics) as sub:
        _publish_until_subscribed(sock, sink)
        ts = 1767225600.0

        def send(
            seq: int, t: float, events: list[Any] = POSITIONAL_EVENTS, form: str = "array"
        ) -> None:
            payload = positional_payload(events, ts=t) if form == "array" else map_payload(ts=t)
            sock.send_multipart(frames(payload, seq=seq))

        send(1, ts + 1)
        send(2, ts + 2, form="map")
        send(3, ts + 3, OFFLOAD_EVENTS)
        send(6, ts + 6)  # 4 and 5 dropped by the publisher: gap of 2
        send(2, ts + 2)  # re-sent: already seen -> duplicate, not offered
        send(6, ts + 6)  # re-sent again
        send(4, ts + 4)  # one of the missing ones arrives late: recovered, offered
        sock.send_multipart([TOPIC, b"\x00" * 8])  # wrong frame count
        sock.send_multipart([TOPIC, b"\x00" * 8, b"\xc1\xc1 garbage"])  # not msgpack
        sock.send_multipart([TOPIC, b"\x00\x01", positional_payload()])  # short sequence frame
        send(7, ts + 7, [["SomethingNew", 1], ["BlockRemoved", "bad", "GPU"], *POSITIONAL_EVENTS])
        sock.send_multipart(
            [b"other-topic", (8).to_bytes(8, "big"), positional_payload()]
        )  # filtered by SUB
        send(0, ts + 100)  # engine restart: seq back to 0 with newer ts
        send(1, ts + 101, [["AllBlocksCleared"]])  # end marker
        sink.wait_for(
            lambda recs: any(r.batch.seq == 1 and r.batch.wall_ns > (ts + 100) * 1e9 for r in recs)
        )

    stream = [r for r in sink.records if r.batch.dp_rank == 0]
    assert [r.batch.seq for r in stream] == [1, 1, 2, 2] + [3] * len(OFFLOAD_EVENTS) + [
        6,
        6,
        4,
        4,
        7,
        7,
        0,
        0,
        1,
    ]
    assert all(r.batch.source == sub.source and r.batch.topic == "kv-events" for r in stream)
    assert sub.counts["gap_batches"] == 2
    assert sub.counts["recovered"] == 1
    assert sub.counts["duplicate"] == 2
    assert sub.counts["restarts"] == 1
    assert (
        sub.counts["frame_count"] == 1
        and sub.counts["bad_msgpack"] == 1
        and sub.counts["bad_sequence"] == 1
    )
    assert sub.counts["unknown_tag"] == 1 and sub.counts["bad_event"] == 1
    sample = registry.get_sample_value
    src = {"endpoint": sub.endpoint}  # one series per subscriber, not per engine
    assert sample("coeffd_kv_sequence_gaps_total", src) == 2
    assert sample("coeffd_kv_batches_total", src) == sub.counts["batches"]
    for reason, n in [
        ("duplicate", 2),
        ("frame_count", 1),
        ("bad_msgpack", 1),
        ("unknown_tag", 1),
        ("bad_event", 1),
    ]:
        assert sample("coeffd_events_rejected_total", {"receiver": "kv", "reason": reason}) == n
    assert sample("coeffd_events_received_total", {"receiver": "kv", "kind": "KVTransfer"}) == 2


def test_bind_mode_with_simfleet_publisher() -> None:
    """Fan-in: the receiver binds, the fleet's own publisher connects (spec §5.1 heuristic)."""
    from coeffd.simfleet.kv import ZmqPublisher, encode_batch

    sink = Sink()
    with KVSubscriber(
        "tcp://127.0.0.1:*", "", sink.offer, bind=True, registry=CollectorRegistry()
    ) as sub:
        assert sub.bound_endpoint is not None
        publisher = ZmqPublisher(sub.bound_endpoint)  # no '*': connects
        try:
            seq = 0
            while True:  # slow joiner: resend until the first batch lands, then one more
                publisher.publish(
                    b"t", seq, encode_batch(1.0 + seq, [("AllBlocksCleared",)], 0, "map"), {}
                )
                seq += 1
                with sink.cond:
                    if sink.cond.wait_for(lambda: bool(sink.records), 0.05):
                        break
            last = seq
            publisher.publish(
                b"t", last, encode_batch(1.0 + last, [("BlockRemoved", [7], "GPU")], 0), {}
            )
            sink.wait_for(lambda recs: any(r.batch.seq == last for r in recs))
        finally:
            publisher.close()
    assert sub.counts["gap_batches"] == 0 and sub.counts["duplicate"] == 0


def test_offer_false_counts_drops() -> None:
    registry = CollectorRegistry()
    sink = Sink(accept=False)
    sub = KVSubscriber("tcp://127.0.0.1:1", "", sink.offer, registry=registry)  # never started
    sub.handle(frames(positional_payload()))
    assert sub.counts["queue_full"] == 2
    assert (
        registry.get_sample_value(
            "coeffd_events_rejected_total", {"receiver": "kv", "reason": "queue_full"}
        )
        == 2
    )


def test_bad_endpoint_raises_on_start() -> None:
    with pytest.raises(zmq.ZMQError):
        KVSubscriber("not-an-endpoint", "", Sink().offer).start()


def test_sequence_tracker_keys_are_independent() -> None:
    t = SequenceTracker()
    assert t.observe(("e", 0), 10, 1.0) == ("first", 0)
    assert t.observe(("e", 1), 50, 1.0) == ("first", 0)
    assert t.observe(("e", 0), 11, 2.0) == ("ok", 0)
    assert t.observe(("e", 0), 15, 3.0) == ("gap", 3)
    assert t.observe(("e", 0), 12, 2.5) == ("recovered", 0)  # was missing
    assert t.observe(("e", 0), 12, 2.5) == ("duplicate", 0)
    assert t.observe(("e", 0), 11, 2.0) == ("duplicate", 0)
    assert t.observe(("e", 1), 51, 1.5) == ("ok", 0)
    assert t.observe(("e", 0), 0, 9.0) == ("restart", 0)
    assert t.observe(("e", 0), 1, 9.1) == ("ok", 0)


def test_gap_triggers_replay_request_and_recovers(pub: tuple[zmq.Socket[Any], str]) -> None:
    """A real ROUTER replay socket (spec §5.1): the gap is filled from the publisher's buffer."""
    sock, endpoint = pub
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    buffer = {seq: positional_payload(POSITIONAL_EVENTS, ts=1000.0 + seq) for seq in range(1, 6)}
    requests: list[int] = []

    def serve_replay() -> None:
        if not router.poll(int(WAIT_S * 1000)):
            return
        identity, _empty, start = router.recv_multipart()
        requests.append(int.from_bytes(start, "big"))
        for seq in sorted(s for s in buffer if s >= requests[-1]):
            router.send_multipart([identity, b"", seq.to_bytes(8, "big"), buffer[seq]])
        router.send_multipart([identity, b"", b"\xff" * 8, b""])

    replayer = threading.Thread(target=serve_replay)
    replayer.start()
    sink = Sink()
    try:
        with KVSubscriber(
            endpoint, "", sink.offer, replay_endpoint=f"tcp://127.0.0.1:{replay_port}"
        ) as sub:
            _publish_until_subscribed(sock, sink)
            for seq in (1, 2, 5):  # 3 and 4 dropped by PUB
                sock.send_multipart(frames(buffer[seq], seq=seq))
            sink.wait_for(
                lambda recs: {r.batch.seq for r in recs if r.batch.dp_rank == 0} >= {1, 2, 3, 4, 5}
            )
            replayer.join(WAIT_S)
    finally:
        router.close()
    assert requests == [3]
    stream = [r.batch.seq for r in sink.records if r.batch.dp_rank == 0]
    assert (
        sorted(set(stream)) == [1, 2, 3, 4, 5] and len(stream) == 10
    )  # each batch once (2 records)
    assert sub.counts["gap_batches"] == 2 and sub.counts["recovered"] == 2
    assert sub.counts["replay_skipped"] == 1 and sub.counts["replay_requests"] == 1
