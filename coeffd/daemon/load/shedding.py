"""Learning load shedding: the share ``r`` of the step and request observations learned
(the rules: :mod:`coeffd.daemon.load.controller`, whose :class:`LoadController` drives it).

Under load the joiner still takes in every record, but builds (and the learners learn)
only a deterministic, evenly spread share of the step observations — building one
(pinning its period, composing its batch) costs more than learning it; the decoders read
the summaries of the others only partially. Request observations are still built (their
journeys pin the kept steps' periods) but learned at the same share: at the floor,
learning one per request cost more than learning the kept steps (four learners and four
scores each), and the α learners need tens of rows, not thousands a second.

What is shed is decided by identity alone — a step by its number, together with the
segment of journey spans it closes; a request by its id — never by what the observation
looks like, and a shed step still leaves the joiner's bookkeeping (anchor calibration,
loop mode, α0's loop waits) as a kept one does. So the observations learned are the
unshed ones less whole segments and requests picked by hash: shedding costs data, it does
not move the estimate (``bench learning --scenario contention``,
``tests/joiner/test_joiner_shedding.py``).

The share is the smaller of a proportional control on the pipeline's backlog and a
multiplicative one on the worker's CPU time per tick, where a live daemon builds and
learns the steps its window releases: a long tick delays every snapshot (freshness),
even while the queue keeps up.

>>> s = LoadShedder(start=0.2, full=0.6, min_keep=0.125)
>>> s.update(0.1), s.update(0.4), s.update(0.9)
(1.0, 0.5625, 0.125)
>>> s.update(0.4)
0.5625
>>> sum(s.keep(n) for n in range(10_000))   # ~56 % of the steps, spread evenly
5625
>>> s.observe_tick(0.4)   # 4x the default 0.1 s budget: share x0.5
>>> s.update(0.0)
0.5
>>> s.observe_tick(0.01); s.update(0.0)   # well within budget: recovers
1.0
"""

from __future__ import annotations

import math

__all__ = ["LoadShedder", "share_limit", "spread"]

_GOLDEN = 0x9E3779B1  # 2^32 / φ: consecutive step ids land far apart in [0, 2^32)
_MASK = 0xFFFFFFFF


def spread(key: int) -> int:
    """``key`` spread over [0, 2^32) by the golden ratio: consecutive keys land far apart,
    so keeping those below :func:`share_limit` keeps an even share of them."""
    return (key * _GOLDEN) & _MASK


def share_limit(share: float) -> int:
    """The bound below which a :func:`spread` key is kept at ``share`` (every key at 1)."""
    return int(share * (_MASK + 1))


class LoadShedder:
    """Keep ratio of step observations as a function of the pipeline backlog.

    Parameters
    ----------
    start
        Backlog (fraction of the queue capacity) below which everything is learned.
    full
        Backlog at and above which only ``min_keep`` of the steps is learned.
    min_keep
        The smallest share learned (never zero: learning never stops).
    tick_budget_s
        Tick duration (the worker's CPU seconds: :mod:`.controller`) the share is
        steered to stay under (0: no tick control).
    """

    def __init__(
        self,
        start: float = 0.1,
        full: float = 0.5,
        min_keep: float = 1 / 32,
        tick_budget_s: float = 0.1,
    ) -> None:
        if not 0.0 <= start < full <= 1.0:
            raise ValueError(f"need 0 <= start < full <= 1, got start={start}, full={full}")
        if not 0.0 < min_keep <= 1.0:
            raise ValueError(f"need 0 < min_keep <= 1, got {min_keep}")
        self.start = start
        self.full = full
        self.min_keep = min_keep
        self.tick_budget_s = tick_budget_s
        self.ratio = 1.0
        self._tick_share = 1.0
        self._limit = share_limit(1.0)

    def update(self, backlog: float) -> float:
        """Set the keep ratio from the current backlog; returns it."""
        if backlog <= self.start:
            r = 1.0
        elif backlog >= self.full:
            r = self.min_keep
        else:
            r = 1.0 - (1.0 - self.min_keep) * (backlog - self.start) / (self.full - self.start)
        r = min(r, self._tick_share)
        self.ratio = r
        self._limit = share_limit(r)
        return r

    def observe_tick(self, seconds: float) -> None:
        """Feed the duration of the last tick (applies from the next :meth:`update`)."""
        if self.tick_budget_s <= 0:
            return
        factor = min(2.0, math.sqrt(self.tick_budget_s / max(seconds, 1e-6)))
        self._tick_share = min(1.0, max(self.min_keep, self._tick_share * factor))

    def keep(self, step: int) -> bool:
        """Whether step ``step``'s observation is learned at the current ratio."""
        # spread(step), inlined: this runs for every batch summary decoded and joined
        return ((step * _GOLDEN) & _MASK) < self._limit
