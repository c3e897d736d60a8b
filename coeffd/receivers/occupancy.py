"""How much of the time a receiver's worker pool is fully occupied.

A receiver thread pool with every worker busy queues the next request before our code
sees it: the exporters then wait (their requests leave late, time out, and are dropped by
vLLM's ``BatchSpanProcessor``). The pipeline queue does not show this when the receivers
are the ones falling behind — they share one interpreter with the pipeline worker — so
the daemon's load controller (``daemon.load``) watches this share too.

>>> t = [0.0]
>>> occ = Occupancy(workers=2, clock=lambda: t[0])
>>> occ.enter(); t[0] = 1.0; occ.enter(); t[0] = 3.0; occ.exit(); t[0] = 4.0
>>> occ.full_share()   # both workers busy from 1 s to 3 s, out of 4 s
0.5
>>> occ.exit(); t[0] = 5.0; occ.full_share()
0.0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Occupancy"]


class Occupancy:
    """Share of time all ``workers`` of a pool are busy, since the last reading."""

    def __init__(self, workers: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0
        self._full_since: float | None = None
        self._full = 0.0
        self._since = clock()

    def enter(self) -> None:
        """A worker starts on a request."""
        with self._lock:
            self._busy += 1
            if self._busy == self.workers:
                self._full_since = self._clock()

    def exit(self) -> None:
        """A worker is done with its request."""
        with self._lock:
            if self._full_since is not None and self._busy == self.workers:
                self._full += self._clock() - self._full_since
                self._full_since = None
            self._busy -= 1

    def full_share(self) -> float:
        """The share of the time since the last call during which the pool was full."""
        with self._lock:
            now = self._clock()
            full = self._full
            if self._full_since is not None:
                full += now - self._full_since
                self._full_since = now
            span, self._since, self._full = now - self._since, now, 0.0
        return full / span if span > 0 else 0.0
