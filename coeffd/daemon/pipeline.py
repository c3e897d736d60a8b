"""Pipeline runtime: receivers → bounded queue → ONE worker → :class:`Consumer`.

The queue is bounded in *records* (not requests) because memory and worker time scale
with records. :meth:`Pipeline.offer` never blocks: a receiver that gets ``False`` answers
its client with a retryable status (gRPC ``UNAVAILABLE`` + RetryInfo, HTTP 503 +
``Retry-After``), so back-pressure reaches the vLLM exporter instead of records being
dropped silently here. A single worker thread calls the consumer, so consumers (joiner →
learners → publisher) need no locking.

>>> from coeffd.daemon.pipeline import CountingConsumer, Pipeline
>>> p = Pipeline(CountingConsumer(), capacity=3)
>>> p.offer([1, 2], "test"), p.offer([3, 4], "test"), p.depth
(True, False, 2)
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import structlog

from coeffd.base.ratelimit import RateLimiter
from coeffd.receivers.metrics import ReceiverMetrics
from coeffd.receivers.otlp.decode import count_kinds
from coeffd.records.events import Record

__all__ = ["Consumer", "CountingConsumer", "Pipeline"]

log = structlog.get_logger(__name__)


@runtime_checkable
class Consumer(Protocol):
    """What the pipeline worker drives. All three are called from the worker thread only."""

    def consume(self, records: Sequence[Record]) -> None:
        """Handle one accepted batch (one export request's records, in request order)."""

    def tick(self, now: float) -> None:
        """Called about once per second even when idle; ``now`` is wall-clock seconds."""

    def close(self) -> None:
        """Called once after the queue was drained at shutdown."""


class CountingConsumer:
    """The default consumer until the joiner exists: counts records by kind.

    >>> c = CountingConsumer()
    >>> c.consume([]); c.total
    0
    """

    def __init__(self) -> None:
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.batches = 0
        self.ticks = 0
        self.closed = False
        self.records: list[Record] | None = None

    @classmethod
    def keeping(cls) -> CountingConsumer:
        """A counting consumer that also keeps every record (tests)."""
        c = cls()
        c.records = []
        return c

    def consume(self, records: Sequence[Record]) -> None:
        """Count the batch."""
        self.batches += 1
        self.total += len(records)
        self.by_kind.update(count_kinds(records))
        if self.records is not None:
            self.records.extend(records)

    def tick(self, now: float) -> None:
        """Count ticks."""
        self.ticks += 1

    def close(self) -> None:
        """Log what was counted (the one outcome line of a counting-only run)."""
        self.closed = True
        log.info(
            "counting consumer closed",
            records=self.total,
            batches=self.batches,
            by_kind=dict(self.by_kind),
        )


class Pipeline:
    """Bounded record queue + the single worker thread that feeds the consumer.

    The receivers' next consumer (``receivers.host.RecordSink``); given their metrics, it
    counts there what it accepts, its depth and its worker's time and errors.
    """

    def __init__(
        self,
        consumer: Consumer,
        capacity: int,
        metrics: ReceiverMetrics | None = None,
        *,
        tick_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        rate_limit_seconds: float = 10.0,
    ) -> None:
        self.consumer = consumer
        self.capacity = capacity
        self.metrics = metrics
        self.tick_interval = tick_interval
        self._clock = clock
        self._queue: collections.deque[Sequence[Any]] = collections.deque()
        self._depth = 0
        self._cond = threading.Condition()
        self._paused = False
        self._closed = False  # no more offers
        self._stop = False  # worker must exit
        self._busy = False
        self._thread: threading.Thread | None = None
        self._limiter = RateLimiter(rate_limit_seconds)
        self._label_cache: dict[tuple[str, str], Any] = {}
        if metrics is not None:
            metrics.track_queue_depth(lambda: self._depth)

    # ------------------------------------------------------------------ producers
    @property
    def depth(self) -> int:
        """Records waiting for the worker."""
        return self._depth

    @property
    def closed(self) -> bool:
        """True once shutdown began; offers are refused from then on."""
        return self._closed

    def has_room(self, n: int) -> bool:
        """Whether :meth:`offer` of ``n`` records would be accepted now (a hint: no lock)."""
        depth = self._depth
        return not self._closed and (depth == 0 or depth + n <= self.capacity)

    def offer(self, records: Sequence[Any], receiver: str) -> bool:
        """Enqueue ``records`` as one batch; never blocks. ``False`` = full (or closing).

        A batch larger than the whole capacity is still accepted into an *empty* queue,
        otherwise such a request could never be delivered and the client would retry it
        forever.
        """
        n = len(records)
        with self._cond:
            if self._closed:
                return False
            if self._depth + n > self.capacity and self._depth > 0:
                return False
            if n:
                self._queue.append(records)
                self._depth += n
                self._cond.notify()
        if n and self.metrics is not None:
            self._count(records, receiver)
        return True

    def _count(self, records: Sequence[Any], receiver: str) -> None:
        kinds = count_kinds(records)
        cache = self._label_cache
        assert self.metrics is not None
        for kind, k in kinds.items():
            child = cache.get((receiver, kind))
            if child is None:
                child = cache[(receiver, kind)] = self.metrics.events_received.labels(
                    receiver, kind
                )
            child.inc(k)

    # --------------------------------------------------------------------- worker
    def start(self) -> None:
        """Start the worker thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="coeffd-pipeline", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def restart(self) -> None:
        """Start a new worker after the old one died (the supervisor calls this); the
        batch it was inside is lost, the queue is kept."""
        with self._cond:
            if self.alive or self._stop:
                return
            self._thread = None
            self._busy = False
        self.start()

    def pause(self) -> None:
        """Stop handing batches to the consumer (tests: build up back-pressure)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the queue is empty and the worker is not inside ``consume``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def _run(self) -> None:
        next_tick = time.monotonic() + self.tick_interval
        while True:
            batch: Sequence[Any] | None = None
            with self._cond:
                while True:
                    if self._stop:
                        return
                    if self._queue and not self._paused:
                        batch = self._queue.popleft()
                        self._depth -= len(batch)
                        self._busy = True
                        break
                    wait = next_tick - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
            if batch is not None:
                self._call("consume", self.consumer.consume, batch)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            if time.monotonic() >= next_tick:
                self._call("tick", self.consumer.tick, self._clock())
                next_tick = time.monotonic() + self.tick_interval

    def _call(self, stage: str, fn: Callable[[Any], None], arg: Any) -> None:
        t0 = time.perf_counter()
        try:
            fn(arg)
            if self.metrics is not None:
                self.metrics.stage_seconds.labels(stage).observe(time.perf_counter() - t0)
        except Exception as e:
            # A consumer bug must not kill the worker (the queue would fill and every
            # receiver would answer "retry" forever); count, log (rate-limited), go on.
            if self.metrics is not None:
                self.metrics.consumer_errors.labels(stage).inc()
            ok, suppressed = self._limiter.allow("consumer:" + stage)
            if ok:
                log.error(
                    "pipeline consumer failed; batch skipped",
                    stage=stage,
                    error=repr(e),
                    suppressed=suppressed,
                    exc_info=True,
                )

    def close(self, drain_timeout: float = 10.0) -> bool:
        """Refuse new offers, drain the queue (≤ ``drain_timeout`` s), close the consumer.

        Returns True if everything queued was consumed.
        """
        with self._cond:
            self._closed = True
            self._paused = False
            self._cond.notify_all()
        drained = True
        if self._thread is not None:
            drained = self.wait_idle(drain_timeout)
            with self._cond:
                self._stop = True
                dropped = self._depth
                self._queue.clear()
                self._depth = 0
                self._cond.notify_all()
            self._thread.join(timeout=max(drain_timeout, 1.0))
            stuck = self._thread.is_alive()
            self._thread = None
            if dropped:
                log.warning("shutdown drain timed out; records dropped", dropped=dropped)
            if stuck:
                # The consumer is single-threaded by contract: closing it while the
                # worker is still inside consume() could corrupt its state.
                log.error("pipeline worker did not stop; consumer.close() skipped")
                return False
        try:
            self.consumer.close()
        except Exception as e:
            log.error("consumer close failed", error=repr(e), exc_info=True)
        return drained
