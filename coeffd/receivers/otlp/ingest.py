"""Shared by every OTLP receiver: decode → enqueue → count → log once → outcome.

The receivers differ only in how they read bytes and how they answer; what happens to
a decoded request (and what is counted) must be identical, so it lives here.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from coeffd.base.ratelimit import RateLimiter
from coeffd.receivers.host import Host
from coeffd.receivers.metrics import ReceiverMetrics
from coeffd.receivers.otlp.decode import Decoder, DecodeResult

__all__ = ["Ingestor", "Outcome"]

log = structlog.get_logger(__name__)

Offer = Callable[[Sequence[Any], str], bool]


class Outcome(enum.StrEnum):
    """Request outcome label of ``coeffd_receiver_requests_total``."""

    OK = "ok"
    PARTIAL = "partial"  # accepted, but some spans/events were rejected
    INVALID = "invalid"  # undecodable body
    RETRY = "retry"  # pipeline full: client told to retry
    LIMIT = "limit"  # over a bound on the work of one request: refused before decoding


@dataclass(slots=True)
class Ingested:
    """Result of :meth:`Ingestor.ingest`."""

    outcome: Outcome
    result: DecodeResult


class Ingestor:
    """Decode a request, offer its records to the pipeline, account for everything."""

    def __init__(
        self,
        receiver: str,
        decoder: Decoder,
        offer: Offer,
        metrics: ReceiverMetrics,
        limiter: RateLimiter | None = None,
        closed: Callable[[], bool] = lambda: False,
        room: Callable[[int], bool] | None = None,
    ) -> None:
        self._closed = closed
        # ``room(n)``: could the pipeline take ``n`` more records now? Asked before
        # decoding, with the typical request size, so that a full pipeline costs a retry
        # answer and not a decode thrown away (under overload that waste, repeated for
        # every resend, made throughput collapse instead of level off).
        self._room = room
        self._typical = 0.0  # moving average of records per request
        self.receiver = receiver
        self.decoder = decoder
        self.offer = offer
        self.metrics = metrics
        self.limiter = limiter or RateLimiter()
        self._decode_hist = metrics.decode_seconds.labels(receiver)
        self._requests = {o: metrics.requests.labels(receiver, o.value) for o in Outcome}
        self._ignored = metrics.events_ignored.labels(receiver)
        self._sampled_out = metrics.events_sampled_out.labels(receiver)
        self._dropped = metrics.dropped_upstream.labels(receiver)
        # a series at 0 from the start (its other reasons appear as they occur): a
        # dashboard's reject panel shows 0, not "No data"
        metrics.events_rejected.labels(receiver, "undecodable")

    @classmethod
    def for_host(cls, host: Host, receiver: str) -> Ingestor:
        """An ingestor feeding ``host``'s pipeline, with the host's decoder and metrics."""
        pipeline = host.pipeline
        return cls(
            receiver,
            host.decoder,
            pipeline.offer,
            host.metrics,
            RateLimiter(host.log_rate_limit_seconds),
            closed=lambda: pipeline.closed,
            room=pipeline.has_room,
        )

    def ingest(self, req: Any, peer: str = "", wait: bool = False) -> Ingested:
        """Decode and enqueue ``req``. ``RETRY`` means nothing was enqueued or counted
        as received (the client will resend the same request).

        ``wait=True`` (replay: there is no client to push back on) retries the offer
        until the pipeline has room or is closed, instead of answering ``RETRY``.
        """
        if not wait and self._room is not None and not self._room(math.ceil(self._typical)):
            return self._retry(DecodeResult(), peer)
        t0 = time.perf_counter()
        res = self.decoder.decode(req)
        self._decode_hist.observe(time.perf_counter() - t0)
        n = len(res.records)
        self._typical = n if not self._typical else self._typical + 0.1 * (n - self._typical)
        accepted = self.offer(res.records, self.receiver)
        while not accepted and wait and not self._closed():
            time.sleep(0.005)
            accepted = self.offer(res.records, self.receiver)
        if not accepted:
            return self._retry(res, peer)
        if res.ignored:
            self._ignored.inc(res.ignored)
        if res.sampled_out:
            self._sampled_out.inc(res.sampled_out)
        if res.dropped_upstream:
            self._dropped.inc(res.dropped_upstream)
            self._warn(
                "dropped_upstream",
                "exporter dropped span events (raise OTEL_SPAN_EVENT_COUNT_LIMIT)",
                peer,
                dropped=res.dropped_upstream,
            )
        if res.rejected:
            for reason, n in res.reasons.items():
                self.metrics.events_rejected.labels(self.receiver, reason).inc(n)
            self._requests[Outcome.PARTIAL].inc()
            self._warn(
                "rejected",
                "rejected malformed spans/events",
                peer,
                rejected=res.rejected,
                accepted=len(res.records),
                reasons=dict(res.reasons),
            )
            return Ingested(Outcome.PARTIAL, res)
        self._requests[Outcome.OK].inc()
        return Ingested(Outcome.OK, res)

    def _retry(self, res: DecodeResult, peer: str) -> Ingested:
        self._requests[Outcome.RETRY].inc()
        self._warn(
            "retry",
            "pipeline full; client told to retry",
            peer,
            records=len(res.records) or None,  # None: refused before decoding
        )
        return Ingested(Outcome.RETRY, res)

    def invalid(self, reason: str, peer: str = "", size: int = 0) -> None:
        """Account for an undecodable request body (counted, logged once)."""
        self._requests[Outcome.INVALID].inc()
        self.metrics.events_rejected.labels(self.receiver, "undecodable").inc()
        self._warn("invalid", "undecodable export request", peer, reason=reason, bytes=size)

    def refused(self, limit: str, reason: str, peer: str = "", size: int = 0) -> None:
        """Account for a request refused whole for crossing a bound (counted, logged
        once per rate-limit period)."""
        self._requests[Outcome.LIMIT].inc()
        self.metrics.limit_exceeded.labels(self.receiver, limit).inc()
        self._warn(
            "limit", "request over a limit refused", peer, limit=limit, reason=reason, bytes=size
        )

    def _warn(self, key: str, message: str, peer: str, **fields: Any) -> None:
        """Log ``message`` at most once per rate-limit period per ``key``, with context
        and the number of lines suppressed since the last one."""
        ok, suppressed = self.limiter.allow(key)
        if ok:
            log.warning(message, receiver=self.receiver, **fields, peer=peer, suppressed=suppressed)
