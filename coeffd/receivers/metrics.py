"""The metric families of the ingest path (names: CONTRIBUTING.md, "Metric names").

Registered on the registry the daemon hands over (each daemon has its own, so several
can live in one test process). The receivers count requests, records, decode times and
rejections here, labelled by ``receiver`` (the KV receiver reuses the event families
through ``KVMetrics``, so nothing is registered twice); the queue they hand records to
(their next consumer, ``daemon.pipeline.Pipeline``) counts its depth and its worker's time
and errors here too, so one object describes records from the wire to the consumer.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ReceiverMetrics"]

#: Decode times of a request range from ~50 µs (one span) to ~100 ms (a 4 MB batch).
_DECODE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class ReceiverMetrics:
    """The ingest path's metric families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events_received = Counter(
            "coeffd_events_received_total",
            "Records (spans and events) accepted into the pipeline, by receiver and kind.",
            ["receiver", "kind"],
            registry=registry,
        )
        self.events_rejected = Counter(
            "coeffd_events_rejected_total",
            "Spans/events rejected as malformed, by receiver and reason.",
            ["receiver", "reason"],
            registry=registry,
        )
        self.events_ignored = Counter(
            "coeffd_events_ignored_total",
            "Well-formed spans/events of unknown scopes, names or kinds, skipped.",
            ["receiver"],
            registry=registry,
        )
        self.events_sampled_out = Counter(
            "coeffd_events_sampled_out_total",
            "Spans/events of engines skipped by engine sampling (pipeline.sample_engines), "
            "by receiver; counted, not decoded.",
            ["receiver"],
            registry=registry,
        )
        self.dropped_upstream = Counter(
            "coeffd_upstream_dropped_events_total",
            "Span events the exporting SDK dropped before sending (droppedEventsCount; "
            "more than OTEL_SPAN_EVENT_COUNT_LIMIT events on one span).",
            ["receiver"],
            registry=registry,
        )
        self.requests = Counter(
            "coeffd_receiver_requests_total",
            "Export requests by outcome: ok, partial (some rejected), invalid, retry (full).",
            ["receiver", "outcome"],
            registry=registry,
        )
        self.limit_exceeded = Counter(
            "coeffd_receiver_limit_exceeded_total",
            "Requests refused whole for crossing a bound on the work of one request "
            "(receivers.limits, body/message size, connections), by receiver and limit.",
            ["receiver", "limit"],
            registry=registry,
        )
        self.decode_seconds = Histogram(
            "coeffd_receiver_decode_seconds",
            "Time to decode one export request into records.",
            ["receiver"],
            buckets=_DECODE_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "coeffd_queue_depth",
            "Records waiting for the pipeline worker.",
            registry=registry,
        )
        self.consumer_errors = Counter(
            "coeffd_pipeline_consumer_errors_total",
            "Exceptions raised by the pipeline consumer (the batch is skipped).",
            ["stage"],
            registry=registry,
        )
        self.stage_seconds = Histogram(
            "coeffd_pipeline_stage_seconds",
            "Time the pipeline worker spends per consumer call (consume: one batch; tick: "
            "window expiry, learning what it released, publishing).",
            ["stage"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )

    def track_queue_depth(self, fn: Callable[[], float]) -> None:
        """Read the depth at scrape time instead of updating a gauge per batch."""
        self.queue_depth.set_function(fn)
