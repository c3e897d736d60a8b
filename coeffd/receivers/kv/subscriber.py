"""ZMQ SUB receiver for vLLM's KV-event stream (spec ``vllm-telemetry.md`` §5.1-§5.2).

One ``KVSubscriber`` = one SUB socket in one background thread. It either *connects* to
an engine's PUB endpoint (vLLM binds ``tcp://*:5557`` by default; DP rank r binds port
+ r, so use one subscriber per rank) or *binds* an endpoint that engines connect to
(fan-in). Each message is decoded, its sequence checked per ``(endpoint, dp_rank)``, and
the records are handed to ``offer(records) -> bool``, the pipeline's non-blocking
enqueue; ``False`` means the pipeline is full and the records are counted as dropped.
PUB/SUB has no back-pressure, so dropping (and counting) is the only honest option.
Sequence numbers are classified by :class:`~.sequence.SequenceTracker`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import zmq
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from zmq.utils.monitor import recv_monitor_message

from coeffd.receivers.kv.decode import KVDecodeError, batch_records, parse_message
from coeffd.receivers.kv.sequence import SequenceTracker
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import KVRecord, Source

log = structlog.get_logger(__name__)

RECEIVER = "kv"
_END_OF_REPLAY = b"\xff" * 8  # seq -1 (signed) ends a replay reply
#: Rejection reason of a message whose handling raised (a bug, counted, not fatal).
INTERNAL_ERROR = "internal_error"
Offer = Callable[[list[KVRecord]], bool]


#: Connection outcomes of a connecting SUB (refused attempts are retried, not fatal).
_CONNECT_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED


class KVMetrics:
    """KV receiver metrics (CONTRIBUTING "Metric names").

    ``events_rejected``/``events_received`` are shared families: pass the app's existing
    counters (e.g. ``receivers.metrics.ReceiverMetrics``) so nothing is registered twice on
    one registry; they are created here only when absent.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        events_rejected: PromCounter | None = None,
        events_received: PromCounter | None = None,
        events_sampled_out: PromCounter | None = None,
    ) -> None:
        #: ``coeffd_events_sampled_out_total`` (engine sampling), when the app has it.
        self.sampled_out = events_sampled_out
        self.batches = PromCounter(
            "coeffd_kv_batches_total",
            "KV-event batches (ZMQ messages) accepted, by the endpoint they arrived on (one "
            "series per subscriber, not per engine: a fan-in endpoint serves many).",
            ["endpoint"],
            registry=registry,
        )
        self.gaps = PromCounter(
            "coeffd_kv_sequence_gaps_total",
            "KV-event batches missing from the sequence (publisher drops), by endpoint.",
            ["endpoint"],
            registry=registry,
        )
        self.jumps = PromCounter(
            "coeffd_kv_sequence_jumps_total",
            "KV-event batches whose sequence number jumped ahead by more than any real "
            "gap (forged or corrupt): dropped as outliers, the baseline kept unless the "
            "stream goes on from the jump; not counted as gaps. By endpoint.",
            ["endpoint"],
            registry=registry,
        )
        self.rejected = events_rejected or PromCounter(
            "coeffd_events_rejected_total",
            "Spans/events rejected as malformed, by receiver and reason.",
            ["receiver", "reason"],
            registry=registry,
        )
        self.received = events_received or PromCounter(
            "coeffd_events_received_total",
            "Records accepted into the pipeline, by receiver and kind.",
            ["receiver", "kind"],
            registry=registry,
        )


class KVSubscriber:
    """Background SUB socket feeding decoded KV records to ``offer``.

    ``endpoint``: e.g. ``tcp://vllm:5557`` (connect) or, with ``bind=True``,
    ``tcp://*:5557``. ``topic``: subscription prefix (``""`` = all). ``source``: identity
    of the stream's engine (default: derived from the endpoint). ``metrics`` or
    ``registry``: where to count (one of them, or neither for an uncounted subscriber).
    ``replay_endpoint``: the publisher's ROUTER replay socket (e.g. ``tcp://vllm:5558``);
    on a sequence gap the subscriber asks it (DEALER, §5.1) for the batches from the first
    missing one and accepts those it lacks; one request is in flight at a time.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str,
        offer: Offer,
        *,
        bind: bool = False,
        source: Source | None = None,
        metrics: KVMetrics | None = None,
        registry: CollectorRegistry | None = None,
        context: zmq.Context[Any] | None = None,
        rcvhwm: int = 100_000,
        poll_ms: int = 100,
        replay_endpoint: str | None = None,
        topic_sources: bool = False,
        count_received: bool = True,
        engine_filter: Callable[[str], bool] | None = None,
    ) -> None:
        self.endpoint = endpoint
        # Fan-in (one bound SUB, many engines connecting): each engine publishes under its
        # own topic, which names it; the topic then becomes the stream's identity
        # (``coeffd.engine=<topic>``, which the joiner links to that engine's spans) and
        # part of the sequence key, since every engine numbers its batches from 0.
        self.topic_sources = topic_sources
        # Engine sampling (daemon.load): with topic sources, the batches of engines
        # whose spans are skipped are counted (``sampled_out``) and not turned into records.
        self.engine_filter = engine_filter if topic_sources else None
        # False when ``offer`` is the daemon pipeline, which counts accepted records itself.
        self.count_received = count_received
        self._topic_source: dict[str, Source] = {}
        self.topic = topic
        self.bind = bind
        self.source = source or source_from_attributes({"kv.endpoint": endpoint})
        self._offer = offer
        self.metrics = metrics or (KVMetrics(registry) if registry is not None else None)
        if self.metrics is not None:  # the series exist (at 0) before the first batch
            for family in (self.metrics.batches, self.metrics.gaps, self.metrics.jumps):
                family.labels(endpoint)
            for reason in ("duplicate", "queue_full"):
                self.metrics.rejected.labels(RECEIVER, reason)
        self._ctx = context or zmq.Context.instance()
        self._rcvhwm = rcvhwm
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.tracker = SequenceTracker()
        self.counts: Counter[str] = Counter()  # plain totals, also without a registry
        self.bound_endpoint: str | None = None
        self.replay_endpoint = replay_endpoint
        self._dealer: zmq.Socket[Any] | None = None
        self._replay_in_flight = False
        self._replay_topic = topic
        #: Connecting subscribers: whether the publisher is connected now (readiness and
        #: ``coeffd_kv_connected``: ZMQ retries in the background, so an unreachable
        #: endpoint raised nothing). None when binding.
        self.connected: bool | None = None if bind else False
        #: Connection attempts that failed or were lost since start (connecting only).
        self.connect_failures = 0

    # -- lifecycle

    def start(self) -> KVSubscriber:
        """Open the socket in the worker thread; returns once it is connected/bound."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(
            target=self._run, name=f"kv-sub {self.endpoint}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (False before start and after it died)."""
        return self._thread is not None and self._thread.is_alive()

    def restart(self) -> None:
        """Open a new socket in a new thread after the old thread died (supervision)."""
        if self.alive or self._stop.is_set():
            return
        self._thread = None
        self._ready.clear()
        self._error = None
        self.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> KVSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- worker

    def _run(self) -> None:
        try:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            monitor = None
            if self.bind:
                sock.bind(self.endpoint)
                self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                # Watch whether anything accepts (before connecting, to see the first
                # outcome): a SUB and a PUB that both connect never meet, and ZMQ retries
                # silently forever (issue 19): say so once.
                monitor = sock.get_monitor_socket(_CONNECT_EVENTS)
                sock.connect(self.endpoint)
            if self.replay_endpoint:
                self._dealer = self._ctx.socket(zmq.DEALER)
                self._dealer.setsockopt(zmq.LINGER, 0)
                self._dealer.connect(self.replay_endpoint)
        except zmq.ZMQError as exc:
            log.error("kv subscriber failed to open", endpoint=self.endpoint, error=str(exc))
            self._error = exc
            self._ready.set()
            return
        log.info(
            "kv subscriber started", endpoint=self.bound_endpoint or self.endpoint, bind=self.bind
        )
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self._dealer is not None:
            poller.register(self._dealer, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(self._poll_ms))
                if not events:
                    continue
                if monitor is not None and monitor in events:
                    self._connection_events(monitor)
                while True:  # drain what is queued before polling again
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle(frames)
                if self._dealer is not None:
                    self._drain_replay(self._dealer)
        finally:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
                self.connected = False
            sock.close(linger=0)
            if self._dealer is not None:
                self._dealer.close(linger=0)
            log.info("kv subscriber stopped", endpoint=self.endpoint, **dict(self.counts))

    def _connection_events(self, monitor: zmq.Socket[Any]) -> None:
        """Count connection attempts; warn once when nothing accepts at the endpoint."""
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
                self.counts["connected"] += 1
                log.info("kv subscriber connected", endpoint=self.endpoint)
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
                self.connect_failures += 1
                log.warning("kv publisher disconnected; retrying", endpoint=self.endpoint)
            elif event == zmq.EVENT_CONNECT_RETRIED:
                self.connected = False
                self.connect_failures += 1
                self.counts["connect_retries"] += 1
                if self.counts["connect_retries"] == 1 and not self.counts["connected"]:
                    log.warning(
                        "kv subscriber: nothing accepts connections at the endpoint; no KV "
                        "events until a publisher binds it (vLLM binds tcp://*:5557 and coeffd "
                        "connects; if the engines connect to coeffd instead, set kv.bind=true)",
                        endpoint=self.endpoint,
                    )

    def _request_replay(self, start_seq: int, topic: str) -> None:
        if self._dealer is None or self._replay_in_flight:
            return
        # Replay replies carry no topic: they belong to the stream whose gap asked for them.
        self._replay_topic = topic
        try:
            self._dealer.send_multipart([b"", start_seq.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.Again:
            return
        self._replay_in_flight = True
        self.counts["replay_requests"] += 1

    def _drain_replay(self, dealer: zmq.Socket[Any]) -> None:
        """Replies are ``["", seq(8 B), payload]`` per batch, then ``["", 2**64-1, ""]``."""
        while True:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                self._reject("bad_replay")
                continue
            if frames[1] == _END_OF_REPLAY:
                self._replay_in_flight = False
                continue
            self.handle([self._replay_topic.encode(), frames[1], frames[2]], replayed=True)

    def _reject(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n
        if self.metrics is not None:
            self.metrics.rejected.labels(RECEIVER, reason).inc(n)

    def _source_for(self, topic: str) -> Source:
        if not self.topic_sources or not topic:
            return self.source
        src = self._topic_source.get(topic)
        if src is None:
            if len(self._topic_source) >= 4096:  # bound: topics come from the network
                return self.source
            src = self._topic_source[topic] = source_from_attributes({"coeffd.engine": topic})
        return src

    def handle(self, frames: Sequence[bytes], *, replayed: bool = False) -> None:
        """Process one multipart message (public for tests and in-process feeding).

        ``replayed``: it came from the replay socket, where batches we already have are
        expected and skipped without counting them as rejected duplicates.

        Never raises: anyone who reaches the socket is a sender, and one message must not
        end the stream. What the decoder does not foresee is counted as ``internal_error``
        and logged once with its traceback.
        """
        try:
            self._handle(frames, replayed)
        except Exception as exc:
            if self.counts[INTERNAL_ERROR] == 0:
                log.error(
                    "kv message failed; skipped",
                    endpoint=self.endpoint,
                    error=repr(exc),
                    exc_info=True,
                )
            self._reject(INTERNAL_ERROR)

    def _handle(self, frames: Sequence[bytes], replayed: bool) -> None:
        event_counts: Counter[str] = Counter()
        try:
            msg = parse_message(frames, event_counts)
        except KVDecodeError as exc:
            if self.counts[exc.reason] == 0:  # log once per reason, count always
                log.warning(
                    "kv message rejected",
                    reason=exc.reason,
                    detail=str(exc),
                    endpoint=self.endpoint,
                )
            self._reject(exc.reason)
            return
        for reason, n in event_counts.items():
            self._reject(reason, n)
        source = self._source_for(msg.topic)
        key = (self.endpoint, msg.topic, msg.batch.dp_rank)
        previous = self.tracker.last_seq(key)
        outcome, missing = self.tracker.observe(key, msg.seq, msg.batch.ts)
        if outcome == SequenceTracker.DUPLICATE:
            if replayed:
                self.counts["replay_skipped"] += 1
            else:
                self._reject("duplicate")
            return
        if outcome == SequenceTracker.RECOVERED:
            self.counts["recovered"] += 1
        elif outcome == SequenceTracker.GAP:
            self.counts["gap_batches"] += missing
            if self.metrics is not None:
                self.metrics.gaps.labels(self.endpoint).inc(missing)
            if previous is not None:
                self._request_replay(previous + 1, msg.topic)
        elif outcome == SequenceTracker.JUMP:
            # An outlier until the stream goes on from it (sequence.py): dropped, so a
            # forged number neither enters the joiner nor silences the real stream.
            self.counts["sequence_jumps"] += 1
            if self.metrics is not None:
                self.metrics.jumps.labels(self.endpoint).inc()
            if self.counts["sequence_jumps"] == 1:
                log.warning(
                    "kv sequence number jumped too far to be a gap; batch dropped, the "
                    "baseline kept unless the stream goes on from it",
                    endpoint=self.endpoint,
                    dp_rank=msg.batch.dp_rank,
                    previous=previous,
                    seq=msg.seq,
                )
            return
        elif outcome == SequenceTracker.RESTART:
            self.counts["restarts"] += 1
            log.info(
                "kv publisher restarted",
                endpoint=self.endpoint,
                dp_rank=msg.batch.dp_rank,
                seq=msg.seq,
            )
        self.counts["batches"] += 1
        if self.metrics is not None:
            self.metrics.batches.labels(self.endpoint).inc()
        if self.engine_filter is not None and not self.engine_filter(msg.topic):
            n = len(msg.batch.events)
            self.counts["sampled_out"] += n
            if self.metrics is not None and self.metrics.sampled_out is not None:
                self.metrics.sampled_out.labels(RECEIVER).inc(n)
            return
        records = batch_records(msg.batch, source, msg.topic, msg.seq)
        if not records:
            return
        if not self._offer(records):
            self._reject("queue_full", len(records))
            return
        self.counts["records"] += len(records)
        if self.metrics is not None and self.count_received:
            kinds = Counter(type(r).__name__ for r in records)
            for kind, n in kinds.items():
                self.metrics.received.labels(RECEIVER, kind).inc(n)
