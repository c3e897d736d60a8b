"""structlog setup and a small rate limiter for recurring log lines.

One line per notable outcome, never per event: receivers log a rejected request once,
with reason counts, and :class:`RateLimiter` keeps a flood of bad requests from turning
into a flood of log lines (the suppressed count is reported on the next line).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO

import structlog

__all__ = ["RateLimiter", "configure_logging"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and stdlib logging, for grpc and friends) process-wide.

    ``fmt``: ``json`` (one JSON object per line), ``console`` (human), or ``auto``: JSON
    when the stream is not a TTY (containers, pipes), console when it is.
    """
    out = stream if stream is not None else sys.stdout
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    lvl = _LEVELS.get(level, logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=out, force=True)


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
