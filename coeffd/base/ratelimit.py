"""A small rate limiter for recurring log lines.

One line per notable outcome, never per event: receivers log a rejected request once,
with reason counts, and :class:`RateLimiter` keeps a flood of bad requests from turning
into a flood of log lines (the suppressed count is reported on the next line).
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["RateLimiter"]


class RateLimiter:
    """Allows one log line per key per ``interval`` seconds; counts what it suppressed.

    >>> rl = RateLimiter(interval=60.0)
    >>> rl.allow("bad-request")
    (True, 0)
    >>> rl.allow("bad-request")
    (False, 0)
    >>> rl.allow("other")
    (True, 0)
    """

    def __init__(self, interval: float = 10.0, clock: Any = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> tuple[bool, int]:
        """Return (may log now, number of lines suppressed since the last allowed one)."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False, 0
            self._last[key] = now
            return True, self._suppressed.pop(key, 0)
