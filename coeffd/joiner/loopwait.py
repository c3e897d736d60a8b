"""Loop wait: how long a request waited for the busy-loop boundary at which it got QUEUED.

vLLM drains its input queue only between busy-loop iterations (spec pitfall 9), so
arrival→QUEUED = API overhead (BLIS's α0) + this wait, which BLIS simulates itself.
Deciding it needs the journeys around the QUEUED step, so request observations are held
here (:class:`LoopWaitQueue`) until the engine's data clock is a window past it, then
:func:`loop_wait` answers from the step starts (:mod:`.starts`) and request lives.
"""

from __future__ import annotations

import heapq
from collections import deque

import msgspec

from coeffd.joiner.starts import BUCKET_BITS, QUEUED, StepStarts
from coeffd.records.observations import RequestObservation


class LoopWait(msgspec.Struct, gc=False):
    """A request observation waiting for the data that explains its QUEUED wait.

    Untracked by the cyclic GC (it holds no container): one per request is held for
    ``loop_wait_delay_s``, and each tracked object is work for every full collection."""

    deadline_wall: int
    obs: RequestObservation
    queued_mono_ns: int
    queued_step: int


class LoopWaitQueue:
    """Held request observations of one engine, in deadline order."""

    def __init__(self) -> None:
        # mostly in deadline order (a FIFO); the rare one out of order goes to a heap
        self._fifo: deque[LoopWait] = deque()
        self._late: list[tuple[int, int, LoopWait]] = []
        self._seq = 0  # tie-breaker of the heap: LoopWaits do not compare

    def __len__(self) -> int:
        return len(self._fifo) + len(self._late)

    def defer(self, item: LoopWait, cap: int) -> LoopWait | None:
        """Hold ``item``; returns the oldest held one when over ``cap`` (to be emitted
        without its loop wait)."""
        fifo = self._fifo
        if not fifo or fifo[-1].deadline_wall <= item.deadline_wall:
            fifo.append(item)
        else:
            self._seq += 1
            heapq.heappush(self._late, (item.deadline_wall, self._seq, item))
        if len(fifo) + len(self._late) > cap:
            return self._pop()
        return None

    def _pop(self) -> LoopWait:
        late = self._late
        if late and (not self._fifo or late[0][0] < self._fifo[0].deadline_wall):
            return heapq.heappop(late)[2]
        return self._fifo.popleft()

    def due_by(self, now_wall: int) -> bool:
        """Whether any held observation's window has passed by ``now_wall`` (what
        :meth:`due` would return something for; asked of every engine on every sweep)."""
        fifo, late = self._fifo, self._late
        return bool(
            (fifo and fifo[0].deadline_wall <= now_wall) or (late and late[0][0] <= now_wall)
        )

    def due(self, now_wall: int | None) -> list[LoopWait]:
        """Held request observations whose window has passed (all of them if None)."""
        out: list[LoopWait] = []
        while self._fifo or self._late:
            nxt = self._fifo[0].deadline_wall if self._fifo else None
            if self._late and (nxt is None or self._late[0][0] < nxt):
                nxt = self._late[0][0]
            if now_wall is not None and nxt is not None and nxt > now_wall:
                break
            out.append(self._pop())
        return out


def loop_wait(
    starts: StepStarts, queued_mono_ns: int, queued_step: int
) -> tuple[float | None, str]:
    """Expected time a request waited for the loop boundary at which it got QUEUED (ns),
    and how that was decided (``busy``, ``idle`` or why it is unknown).

    A request QUEUED at step ``q`` was delivered during the iteration between the drains
    before ``S(q)`` and ``S(q+1)``; deliveries do not depend on the loop, so given that
    iteration its delivery is uniform within it and the expected wait is half the time
    from the previous drain to its QUEUED. That needs no step summary: the previous
    drain is ``S(q)`` (pinned by any journey anchor of step ``q``) less the calibrated
    QUEUED offset. The iteration is a busy one when another request scheduled by step
    ``q`` was still running at ``q + 1`` (the loop had work and never blocked); with no
    request at step ``q`` and one that left at the step before (:func:`drained_before`)
    the loop was blocked on its input and woke for this one (wait 0); with no known
    request near ``q`` at all the journeys around it may be lost (``unseen``); a loop
    running its last requests out may have blocked part-way, which is left unknown
    (``draining``).

    Called once the engine's data clock is a window past the QUEUED, so the answer
    depends on the data, not on when it arrived (live = replay).
    """
    q = queued_step
    if q <= 0:
        return 0.0, "idle"
    lives = starts.lives.get(q >> BUCKET_BITS, ())
    # any(first <= q < last), and any(first <= q <= last), in one loop without generators
    # (once per request observation, over its bucket's lives)
    busy = covered = False
    for life in lives:
        if life.first <= q <= life.last:
            covered = True
            if q < life.last:
                busy = True
                break
    if not busy:
        if covered:
            return None, "draining"
        if drained_before(starts, q):
            return 0.0, "idle"
        return None, "unseen"
    mode = starts.mode()
    if mode is None:
        return None, "mode_unknown"
    a = 1 if mode else 0
    p = starts.point(q, a) or starts.interpolate(q, a)
    cfg = starts.cfg
    m = cfg.loop_wait_min_calibration
    if p is None and m < cfg.min_calibration and starts.answers_differ(m):
        # the anchor types are not calibrated yet (at 1 % step sampling that takes
        # minutes, and every α0 row until then is lost): a wait needs the start to
        # loop_wait_max_uncertainty_us, within the priors' bounds, not calibrated bounds.
        # Asked only when the default found nothing and fewer coincidences could answer
        # otherwise; it cross-calibrates nothing, so step observations stay the same.
        p = starts.point(q, a, m) or starts.interpolate(q, a, m)
    if p is None:
        return None, "unpinned"
    if p.half_ns > cfg.loop_wait_max_uncertainty_us * 1e3:
        return None, "uncertain"
    dq = starts.cal.mean_var(QUEUED, cfg.min_calibration)
    if dq is None and m < cfg.min_calibration:
        dq = starts.cal.mean_var(QUEUED, m)
    if dq is None:
        return None, "uncalibrated"
    span = queued_mono_ns - (p.t_ns - dq[0])
    if span <= 0:
        return None, "inconsistent_anchors"
    return span / 2.0, "busy"


def drained_before(starts: StepStarts, q: int) -> bool:
    """Whether a known request left the engine at the step just before ``q`` (``q - 1``;
    ``q - 2`` with async scheduling, whose stopped requests count one step more).

    A loop with no request blocks on its input without stepping, so an idle engine's
    next step follows its last request's. That is what tells idle from unseen: no known
    request at ``q`` also means the journeys around it were lost (an exporter drops a
    whole batch when the receiver pushes back), and taking those for idle learned the
    loop wait into α0 (bench closedloop's daemon at 1 % step sampling: a third of the
    rows "idle", +30 % each).
    """
    lo = q - 2
    for b in {lo >> BUCKET_BITS, (q - 1) >> BUCKET_BITS}:
        if any(lo <= life.last < q for life in starts.lives.get(b, ())):
            return True
    return False
