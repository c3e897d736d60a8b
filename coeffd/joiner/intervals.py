"""Pure helpers for the period reconstruction: anchor intervals and their combination.

A step start ``S(n)`` is known exactly from a BATCH_SUMMARY, or bounded by journey
events of the same EngineCore (same ``CLOCK_MONOTONIC``): each anchor at mono time ``t``
says ``S(n) ∈ [t + lo, t + hi]``. Several anchors are intersected; a period is the
difference of two such intervals. All values are nanoseconds (float for the bounds).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def intersect(intervals: Iterable[Interval]) -> Interval | None:
    """Intersection of closed intervals; None if there are none.

    An empty intersection (the anchors disagree: an offset outside its calibrated
    range) is returned as ``(lo, hi)`` with ``lo > hi`` so the caller can count it.

    >>> intersect([(0.0, 10.0), (5.0, 20.0)])
    (5.0, 10.0)
    >>> intersect([]) is None
    True
    """
    lo = float("-inf")
    hi = float("inf")
    seen = False
    for a, b in intervals:
        seen = True
        if a > lo:
            lo = a
        if b < hi:
            hi = b
    return (lo, hi) if seen else None


def shifted(times: Sequence[int], bounds: Interval) -> list[Interval]:
    """Intervals ``[t + lo, t + hi]`` for anchor times ``t`` and offset bounds (ns).

    >>> shifted([100], (-10.0, 0.0))
    [(90.0, 100.0)]
    """
    lo, hi = bounds
    return [(t + lo, t + hi) for t in times]


def difference(start: Interval, end: Interval) -> tuple[float, float]:
    """Midpoint and half-width of ``end - start`` for two interval-valued times.

    >>> difference((0.0, 0.0), (12.0, 14.0))
    (13.0, 1.0)
    """
    lo = end[0] - start[1]
    hi = end[1] - start[0]
    return (lo + hi) / 2.0, (hi - lo) / 2.0


def offset_bounds(
    deltas: Sequence[float],
    prior: Interval,
    min_samples: int,
    margin_ns: float,
    margin_fraction: float,
) -> Interval:
    """Bounds on ``S(n) - t`` for one anchor type: observed range plus margin, else prior.

    The observed range comes from steps that carry both a summary (exact ``S(n)``) and
    an anchor; min/max rather than quantiles because the bound must *contain* the truth
    for the stated uncertainty to be honest.

    >>> offset_bounds([10.0, 20.0], (0.0, 100.0), 2, 1.0, 0.5)
    (4.0, 26.0)
    >>> offset_bounds([10.0], (0.0, 100.0), 2, 1.0, 0.5)
    (0.0, 100.0)
    """
    if len(deltas) < min_samples:
        return prior
    lo = min(deltas)
    hi = max(deltas)
    pad = margin_ns + margin_fraction * (hi - lo)
    return lo - pad, hi + pad
