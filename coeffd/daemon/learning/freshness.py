"""Freshness: how long an observation waits until a snapshot on disk includes it.

Two histograms (``coeffd_snapshot_freshness_seconds`` from the observation's arrival,
``coeffd_step_freshness_seconds`` from its step summary's arrival, the joiner's window
included). Freshness ends when the writer thread has the snapshot on disk, not when the
worker hands it over: a slow fsync is part of what a reader waits for.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Sequence

from coeffd.daemon.learning.metrics import ServeMetrics
from coeffd.daemon.publish.snapshot import Snapshot
from coeffd.records.events import BatchSummary, Record
from coeffd.records.observations import StepObservation

__all__ = ["Freshness"]

_ARRIVAL_SAMPLE_MASK = 15  # step freshness is measured on every 16th step (see __init__)
_MAX_ARRIVALS = 20_000


class Freshness:
    """Arrival times in, freshness histograms out (worker thread; :meth:`written` on the
    writer's)."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics
        # Arrival time of every 16th step summary (``step % 16 == 0``, unrelated to timing,
        # so the freshness histogram stays unbiased), until its observation is learned.
        # Bounded: many summaries never become observations; the oldest are forgotten.
        # (Keeping every summary's arrival cost ~80 B each for 30 s: 8 MB at 100 engines.)
        self._summary_arrival: collections.OrderedDict[tuple[str, int], float] = (
            collections.OrderedDict()
        )
        # Per configuration: (version, oldest observation arrival, oldest step arrival) of
        # snapshots handed to the writer and not yet on disk (freshness ends on disk).
        self._unwritten: dict[str, list[tuple[int, float | None, float | None]]] = {}
        self._unwritten_lock = threading.Lock()

    def arrived(
        self, records: Sequence[Record], now: float, keep: Callable[[int], bool] | None
    ) -> None:
        """Note the arrival of the sampled step summaries in ``records``; ``keep``: the
        load controller's step filter (None: every step is built)."""
        arrival = self._summary_arrival
        # only steps that can become observations: under load the others would crowd
        # the bounded map and push out the kept ones before their window has passed
        for r in records:
            if (
                type(r) is BatchSummary
                and not r.step & _ARRIVAL_SAMPLE_MASK
                and not r.partial
                and (keep is None or keep(r.step))
            ):
                arrival[(r.span.source.id, r.step)] = now
        while len(arrival) > _MAX_ARRIVALS:
            arrival.popitem(last=False)

    def first_step_arrival(self, batch: Iterable[StepObservation]) -> float | None:
        """The oldest noted summary arrival of the steps learned in ``batch`` (forgotten)."""
        arrival = self._summary_arrival
        first: float | None = None
        for obs in batch:
            if obs.step & _ARRIVAL_SAMPLE_MASK:
                continue
            t = arrival.pop((obs.source.id, obs.step), None)
            if t is not None and (first is None or t < first):
                first = t
        return first

    def handed(self, cid: str, version: int, first: float | None, first_step: float | None) -> None:
        """Snapshot ``version`` of ``cid`` went to the writer, covering observations that
        arrived from ``first`` (steps from ``first_step``) on."""
        with self._unwritten_lock:
            self._unwritten.setdefault(cid, []).append((version, first, first_step))

    def written(self, snap: Snapshot, at: float) -> None:
        """Writer thread: a snapshot is on disk; it and every older one replaced by it
        while pending are now fresh."""
        with self._unwritten_lock:
            pending = self._unwritten.get(snap.config_id, [])
            done = [e for e in pending if e[0] <= snap.version]
            self._unwritten[snap.config_id] = [e for e in pending if e[0] > snap.version]
        for _, first, first_step in done:
            if first is not None:
                self.metrics.freshness.observe(max(0.0, at - first))
            if first_step is not None:
                self.metrics.step_freshness.observe(max(0.0, at - first_step))
