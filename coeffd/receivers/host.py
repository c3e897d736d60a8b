"""What a receiver needs from whoever runs it: the receivers' interface to the daemon.

The OpenTelemetry Collector's shape: a receiver knows its own config
(:mod:`coeffd.receivers.config`) and the interface of the next consumer, nothing of
the process around it. ``daemon.app.App`` implements :class:`Host` (structurally: no
import of it here, so the arrows point from the daemon down to the receivers only), and
``daemon.pipeline.Pipeline`` implements :class:`RecordSink`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from coeffd.base.security import AuthMetrics
    from coeffd.receivers.metrics import ReceiverMetrics
    from coeffd.receivers.occupancy import Occupancy
    from coeffd.receivers.otlp.decode import Decoder
    from coeffd.records.events import Record

__all__ = ["Host", "RecordSink"]


class RecordSink(Protocol):
    """Where a receiver hands its records: a bounded queue that never blocks.

    A receiver asks :meth:`has_room` before it decodes (a full queue costs a "retry
    later" answer, not a decode thrown away), then :meth:`offer`\\ s the records; on
    ``False`` it tells its client to retry (back-pressure reaches the exporter).
    """

    @property
    def closed(self) -> bool:
        """True once shutdown began: offers are refused from then on."""
        ...

    def has_room(self, n: int) -> bool:
        """Whether an offer of ``n`` records would be accepted now (a hint)."""
        ...

    def offer(self, records: Sequence[Record], receiver: str) -> bool:
        """Enqueue ``records`` as one batch; ``False`` = full or closing: retry later."""
        ...


class Host(Protocol):
    """What the daemon gives each receiver it runs."""

    @property
    def pipeline(self) -> RecordSink:
        """The next consumer."""
        ...

    @property
    def decoder(self) -> Decoder:
        """The OTLP decoder, shared by the OTLP receivers (engine sampling sets its
        ``source_filter``)."""
        ...

    @property
    def metrics(self) -> ReceiverMetrics:
        """The receivers' metric families, on the daemon's registry."""
        ...

    @property
    def auth_metrics(self) -> AuthMetrics:
        """Refusals by the listeners' TLS and token guards."""
        ...

    @property
    def grpc_occupancy(self) -> Occupancy:
        """How full the OTLP/gRPC receiver's worker pool runs (load control reads it)."""
        ...

    @property
    def log_rate_limit_seconds(self) -> float:
        """Minimum seconds between two log lines about the same recurring problem."""
        ...
