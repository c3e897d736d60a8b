"""Sequence numbers of one KV-event stream: gaps, duplicates, restarts, replays.

The publisher numbers batches 0, 1, 2, ... per process. A jump forward is a gap (PUB
dropped above its HWM, or we were slow); a number at or below the last seen is either
a replayed batch (same or older ``ts``: dropped as a duplicate, so the joiner never sees
a batch twice) or an engine restart (newer ``ts``: the tracker restarts from it). A jump
forward beyond any gap we could remember is checked against the stream's own history
before it is believed (issue 32): anyone who reaches the socket can send a number, and
one forged ``2**62`` taken as the baseline made every later real batch a "duplicate".
Pure bookkeeping, no sockets: :mod:`.subscriber` feeds it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SequenceTracker"]


class SequenceTracker:
    """Gap / duplicate / restart / recovery detection per stream key (``(endpoint, dp_rank)``).

    Sequence numbers skipped by a gap are remembered (the newest ``max_missing`` per key)
    so that a batch re-sent by the publisher's replay socket is recognised as
    ``recovered`` (accepted) rather than as a duplicate.

    Everything here is bounded, because keys and numbers come from the network: missing
    numbers are kept as at most ``max_ranges`` ``[start, end)`` ranges per key (not one
    int each), at most ``max_keys`` streams are tracked (the least recently seen is
    forgotten).

    A forward jump of more than ``max_gap`` batches (by default as many as are remembered
    as missing: minutes of a busy engine's steps) is a ``jump``: a forged or corrupted number, or, rarely, a
    publisher that really skipped that far. It is *not* taken as the baseline: the batch
    is an outlier (the caller drops and counts it) and the number is held as a candidate.
    The stream's next batches decide: one that continues the current baseline proves the
    candidate an outlier (it stays one however often it continues: a second sender on
    the key, such as a forger, is outvoted by the live stream); one that continues the
    candidate while the old line has been silent since confirms it, and is a ``gap``
    from the old baseline (the held batch included: the replay socket may still have it).

    >>> t = SequenceTracker(max_keys=2, max_gap=100)
    >>> t.observe("a", 1, 1.0), t.observe("a", 5, 2.0), t.observe("a", 3, 1.5)
    (('first', 0), ('gap', 3), ('recovered', 0))
    >>> t.observe("a", 2**64 - 1, 9.0), t.observe("a", 6, 3.0), t.observe("a", 2**64 - 1, 9.0)
    (('jump', 0), ('ok', 0), ('jump', 0))
    >>> t.observe("a", 7, 4.0), t.last_seq("a")
    (('ok', 0), 7)
    >>> t.observe("a", 1000, 5.0), t.observe("a", 1001, 5.1), t.last_seq("a")
    (('jump', 0), ('gap', 993), 1001)
    >>> t.observe("b", 0, 1.0), t.observe("c", 0, 1.0), len(t), t.evicted
    (('first', 0), ('first', 0), 2, 1)
    """

    OK = "ok"
    FIRST = "first"
    GAP = "gap"
    DUPLICATE = "duplicate"
    RESTART = "restart"
    RECOVERED = "recovered"
    JUMP = "jump"

    def __init__(
        self,
        max_missing: int = 10_000,
        *,
        max_keys: int = 1024,
        max_gap: int = 10_000,
        max_ranges: int = 64,
    ) -> None:
        self._last: dict[Any, tuple[int, float]] = {}
        self._missing: dict[Any, list[list[int]]] = {}
        # Jump candidates: key -> [held sequence, contested]; contested once the old
        # line moved on after the jump (then the candidate is never believed).
        self._candidate: dict[Any, list[Any]] = {}
        self.max_missing = max_missing
        self.max_keys = max_keys
        self.max_gap = max_gap
        self.max_ranges = max_ranges
        #: Streams forgotten to stay within ``max_keys``.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._last)

    def last_seq(self, key: Any) -> int | None:
        """The highest sequence seen on ``key`` (None before the first batch)."""
        last = self._last.get(key)
        return None if last is None else last[0]

    def _set(self, key: Any, seq: int, ts: float) -> None:
        # Re-inserted so that dict order is least recently seen first (eviction order).
        self._last.pop(key, None)
        self._last[key] = (seq, ts)

    def observe(self, key: Any, seq: int, ts: float) -> tuple[str, int]:
        """Classify a batch; returns ``(outcome, missing)`` (missing > 0 only for ``gap``)."""
        last = self._last.get(key)
        if last is None:
            if len(self._last) >= self.max_keys:
                oldest = next(iter(self._last))
                del self._last[oldest]
                self._missing.pop(oldest, None)
                self._candidate.pop(oldest, None)
                self.evicted += 1
            self._last[key] = (seq, ts)
            return self.FIRST, 0
        last_seq, last_ts = last
        candidate = self._candidate.get(key)
        if candidate is not None and seq > last_seq + 1 + self.max_gap:
            held, contested = candidate
            if not held < seq <= held + 1 + self.max_gap:
                self._candidate[key] = [seq, False]  # another line: the new candidate
            elif contested:
                candidate[0] = seq  # a second sender on the key; the live stream won
            else:
                # The candidate's line goes on and the old one fell silent: a real skip.
                del self._candidate[key]
                self._set(key, seq, ts)
                self._remember(key, max(last_seq + 1, seq - self.max_missing), seq)
                return self.GAP, seq - last_seq - 1
            return self.JUMP, 0
        if seq == last_seq + 1:
            self._set(key, seq, ts)
            self._contest(candidate)
            return self.OK, 0
        if seq > last_seq:
            gap = seq - last_seq - 1
            if gap > self.max_gap:
                # Not believed yet: the baseline stays; the stream's next batches decide.
                self._last[key] = (last_seq, last_ts)
                self._candidate[key] = [seq, False]
                return self.JUMP, 0
            self._set(key, seq, ts)
            self._contest(candidate)
            self._remember(key, max(last_seq + 1, seq - self.max_missing), seq)
            return self.GAP, gap
        if self._recover(key, seq):
            return self.RECOVERED, 0
        if ts > last_ts:
            # Lower sequence but newer data: the engine restarted (its counter restarts at 0).
            self._set(key, seq, ts)
            self._missing.pop(key, None)
            self._candidate.pop(key, None)
            return self.RESTART, 0
        return self.DUPLICATE, 0

    @staticmethod
    def _contest(candidate: list[Any] | None) -> None:
        if candidate is not None:
            candidate[1] = True

    def _remember(self, key: Any, start: int, end: int) -> None:
        ranges = self._missing.setdefault(key, [])
        ranges.append([start, end])  # gaps arrive in increasing order: the list stays sorted
        total = sum(e - s for s, e in ranges)
        # Keep the newest: replay buffers keep those.
        while ranges and (total > self.max_missing or len(ranges) > self.max_ranges):
            s, e = ranges[0]
            cut = min(e - s, total - self.max_missing) if total > self.max_missing else e - s
            total -= cut
            if cut == e - s:
                ranges.pop(0)
            else:
                ranges[0][0] = s + cut

    def _recover(self, key: Any, seq: int) -> bool:
        ranges = self._missing.get(key)
        if not ranges:
            return False
        for i, (s, e) in enumerate(ranges):
            if s <= seq < e:
                pieces = [r for r in ([s, seq], [seq + 1, e]) if r[1] > r[0]]
                ranges[i : i + 1] = pieces
                return True
        return False
