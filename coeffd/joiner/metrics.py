"""Prometheus metrics of the joiner (names fixed by CONTRIBUTING.md)."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

OUTCOMES = ("joined", "expired", "duplicate", "late", "unmatched", "rejected", "shed")
OBSERVATIONS = ("step", "request", "kv_transfer")


class JoinerMetrics:
    """Join outcome counters, window gauges and observation counters.

    Also keeps plain in-process tallies (``outcomes``, ``reasons``) so the window summary
    log line and tests can read them without scraping.

    >>> m = JoinerMetrics(CollectorRegistry())
    >>> m.outcome("step", "rejected", "empty_step")
    >>> m.outcomes[("step", "rejected")], m.reasons[("step", "rejected", "empty_step")]
    (1, 1)
    >>> m.sync()
    >>> m.registry.get_sample_value(
    ...     "coeffd_join_outcomes_total", {"observation": "step", "outcome": "rejected"})
    1.0
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.join_outcomes = PromCounter(
            "coeffd_join_outcomes_total",
            "Join outcomes by observation kind",
            ["observation", "outcome"],
            registry=self.registry,
        )
        self.window_entries = Gauge(
            "coeffd_join_window_entries",
            "Entries currently held in the join window",
            ["kind"],
            registry=self.registry,
        )
        self.observations = PromCounter(
            "coeffd_observations_total",
            "Observations emitted by the joiner",
            ["observation"],
            registry=self.registry,
        )
        # Pre-create children so dashboards see zeros, and cache them: ``labels()`` costs
        # a dict lookup under a lock on every call.
        self._outcome_children = {
            (o, k): self.join_outcomes.labels(o, k) for o in OBSERVATIONS for k in OUTCOMES
        }
        self._obs_children = {o: self.observations.labels(o) for o in OBSERVATIONS}
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.reasons: Counter[tuple[str, str, str]] = Counter()
        self.observed: Counter[str] = Counter()
        self._pushed_outcomes: Counter[tuple[str, str]] = Counter()
        self._pushed_observed: Counter[str] = Counter()
        self.journey_steps_total = PromCounter(
            "coeffd_journey_steps_total",
            "Unsampled steps considered as journey-pinned period observations, by outcome "
            "(joined, or why not: prefill, preempted, idle, incomplete, unpinned, ...)",
            ["outcome"],
            registry=self.registry,
        )
        self.loop_wait_total = PromCounter(
            "coeffd_loop_wait_total",
            "Request observations by how their QUEUED loop wait (removed for alpha0) was "
            "decided: busy, idle, or why it is unknown",
            ["outcome"],
            registry=self.registry,
        )
        self.composition_waits_total = PromCounter(
            "coeffd_composition_waits_total",
            "Sampled steps that waited past the join window for the journeys of their "
            "running requests, by how the wait ended: completed (exact batch), expired "
            "(deadline: summary totals), capacity (max_composition_waits: totals), "
            "unusable (a request no journey can rebuild: totals), mismatch (totals), "
            "ended (end of stream, engine restarted or forgotten: totals)",
            ["outcome"],
            registry=self.registry,
        )
        self.journey_steps: Counter[str] = Counter()
        self.loop_waits: Counter[str] = Counter()
        self.composition_waits: Counter[str] = Counter()
        self._pushed_plain: dict[str, Counter[str]] = {
            "journey": Counter(),
            "wait": Counter(),
            "composition": Counter(),
        }

    def outcome(self, observation: str, outcome: str, reason: str = "", n: int = 1) -> None:
        """Count ``n`` join outcomes (``reason`` only goes to the summary log).

        Counted in plain Python and pushed to Prometheus by :meth:`sync` (the joiner calls
        it on every sweep): a prometheus-client ``inc`` takes a lock, which at 10⁵–10⁶
        events/s is a visible share of the joiner's time.
        """
        self.outcomes[(observation, outcome)] += n
        if reason:
            self.reasons[(observation, outcome, reason)] += n

    def emitted(self, observation: str, n: int = 1) -> None:
        """Count ``n`` emitted observations (and ``joined`` outcomes)."""
        if n:
            self.observed[observation] += n
            self.outcomes[(observation, "joined")] += n

    def sync(self) -> None:
        """Push the counts accumulated since the last call to the Prometheus counters."""
        for key, n in self.outcomes.items():
            d = n - self._pushed_outcomes[key]
            if d:
                self._outcome_children[key].inc(d)
                self._pushed_outcomes[key] = n
        for key2, n in self.observed.items():
            d = n - self._pushed_observed[key2]
            if d:
                self._obs_children[key2].inc(d)
                self._pushed_observed[key2] = n
        for name, tally, metric in (
            ("journey", self.journey_steps, self.journey_steps_total),
            ("wait", self.loop_waits, self.loop_wait_total),
            ("composition", self.composition_waits, self.composition_waits_total),
        ):
            pushed = self._pushed_plain[name]
            for key3, n in tally.items():
                if n != pushed[key3]:
                    metric.labels(key3).inc(n - pushed[key3])
                    pushed[key3] = n

    def entries(self, kind: str, n: int) -> None:
        """Set the window gauge of ``kind``."""
        self.window_entries.labels(kind).set(n)
