"""Per-EngineCore join state: sampled steps, journey anchors, period reconstruction.

Everything here is keyed by step id *of one engine* (one ``Source.id``): step ids
collide across engines and restart with the engine, so nothing is ever keyed globally.
All times compared here are that engine's ``CLOCK_MONOTONIC`` (``step.ts_*_ns`` and
journey ``ts.monotonic_ns``), except the window bookkeeping, which uses the engine's own
wall clock (event ``timeUnixNano``) as its watermark.

Period target (spec §2.5 step 5): the busy-loop time attributable to batch ``N`` is
``S(N+1) - S(N)`` with sync scheduling and ``S(N+2) - S(N+1)`` with async scheduling
(the GPU runs batch N while the CPU schedules N+1), i.e. ``S(m+1) - S(m)`` with
``m = N + a``. Each ``S(n)`` comes from a summary (exact) or from anchors:

* ``SCHEDULED(n)``: inside ``schedule(n)``, so ``S(n) ∈ [t - sched, t]``;
* ``QUEUED(n-1)`` and aborted ``FINISHED(n-1)``: input drain right before ``S(n)``;
* ``FIRST_TOKEN``/``FINISHED(n-1-a)``: output processing right before ``S(n)``.

The offset of each anchor type is bounded by priors until the engine has shown enough
steps that carry both a summary and an anchor; then by the observed range plus a margin.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import structlog

from coeffd.receivers.joiner import intervals as iv
from coeffd.receivers.joiner import pinned
from coeffd.receivers.joiner.composition import Life, aggregates_of, from_lives, from_snapshots
from coeffd.receivers.joiner.config import JoinerConfig
from coeffd.records.events import BatchSummary, JourneyEvent, JourneyKind, RequestSnapshot, Source
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    KVTransferObservation,
    PeriodMethod,
    QueueState,
    RequestObservation,
    StepAggregates,
    StepObservation,
)

log = structlog.get_logger(__name__)

SCHED, QUEUED, COMPL = 0, 1, 2
_CAL_KEEP = 512  # calibration deltas kept per anchor type (a rolling sample)
_PURGE_STRIDE = 512  # steps between purges of expired step-indexed state
_SIGHTING_BUCKET_NS = 50_000_000  # timeline granularity (see EngineState._first_sighting)
_BUCKET_BITS = 6  # request lives are indexed by 64-step buckets
# how far a loop wait's schedule start may be interpolated from its pins: decode steps of a
# quiet engine change by a few context tokens each, so even 256 of them space evenly
_INTERPOLATE_STEPS = 256


@dataclass(slots=True)
class StepResult:
    """Outcome of finalizing one sampled step."""

    observation: StepObservation | None
    outcome: str  # joined | unmatched | rejected
    reason: str = ""


@dataclass(slots=True)
class _Calibration:
    deltas: list[deque[float]] = field(
        default_factory=lambda: [deque(maxlen=_CAL_KEEP) for _ in range(3)]
    )
    seen: set[tuple[int, int]] = field(default_factory=set)  # (type, step) already added
    added: list[int] = field(default_factory=lambda: [0, 0, 0])  # deltas ever added
    # (added count, mean, variance) per type, recomputed when ``added`` moved on
    stats: list[tuple[int, float, float]] = field(default_factory=lambda: [(0, 0.0, 0.0)] * 3)

    # offsets of one anchor type measured against another type's calibrated mean on steps
    # no summary pins (only a mean's fallback: their spread is the other type's too, so
    # they never widen the bounds, which must contain the truth)
    cross: list[deque[float]] = field(
        default_factory=lambda: [deque(maxlen=_CAL_KEEP) for _ in range(3)]
    )
    cross_added: list[int] = field(default_factory=lambda: [0, 0, 0])
    cross_stats: list[tuple[int, float, float]] = field(default_factory=lambda: [(0, 0.0, 0.0)] * 3)

    def mean_var(self, typ: int, min_samples: int) -> tuple[float, float] | None:
        """Mean and variance of the observed ``S(n) - t`` of one anchor type (ns): from
        summaries, else (with 4× the samples) from the cross-calibration."""
        d = self.deltas[typ]
        if len(d) < min_samples:
            if len(self.cross[typ]) < 4 * min_samples:
                return None
            return _mean_var(self.cross[typ], self.cross_added[typ], self.cross_stats, typ)
        return _mean_var(d, self.added[typ], self.stats, typ)

    def is_exact(self, typ: int, min_samples: int) -> bool:
        """True when summaries calibrated this anchor type."""
        return len(self.deltas[typ]) >= min_samples


def _mean_var(
    d: deque[float], added: int, cache: list[tuple[int, float, float]], typ: int
) -> tuple[float, float]:
    k, mean, var = cache[typ]
    if k != added:
        # fsum: exactly rounded whatever the order the deltas arrived in (live = replay)
        mean = math.fsum(d) / len(d)
        var = math.fsum((x - mean) ** 2 for x in d) / len(d)
        cache[typ] = (added, mean, var)
    return mean, var


def _life_order(life: Life) -> tuple[int, int, int, int, int, bool]:
    ft = life.first_token if life.first_token is not None else -1
    return (life.first, life.last, life.input_len, life.output_len, ft, life.preempted)


@dataclass(slots=True)
class LoopWait:
    """A request observation waiting for the data that explains its QUEUED wait."""

    deadline_wall: int
    obs: RequestObservation
    queued_mono_ns: int
    queued_step: int


def parse_async_attr(value: object) -> bool | None:
    """Resource attribute ``coeffd.async_scheduling`` as a bool (None if absent/unclear).

    >>> parse_async_attr("true"), parse_async_attr(False), parse_async_attr(None)
    (True, False, None)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
    return None


class EngineState:
    """Join state of one EngineCore."""

    def __init__(self, source: Source, config: JoinerConfig) -> None:
        self.source = source
        self.cfg = config
        self.window_ns = int(config.window_s * 1e9)
        self.watermark = 0  # max wall ns of this engine's records
        forced = config.async_scheduling
        self.async_mode: bool | None = (
            forced
            if forced is not None
            else parse_async_attr(source.get("coeffd.async_scheduling"))
        )
        self.async_source = (
            "config" if forced is not None else ("resource" if self.async_mode is not None else "")
        )
        self.votes = [0, 0]  # sync, async
        self.summaries: dict[int, BatchSummary] = {}
        self.summary_steps: list[int] = []  # sorted
        # (deadline wall ns, step) of steps to finalize: summaries mostly arrive in wall
        # order, so a FIFO takes them (a heap push and pop per step cost 3 % of a loaded
        # daemon); the rare one out of order goes to a heap beside it.
        self.pending: deque[tuple[int, int]] = deque()
        self.pending_late: list[tuple[int, int]] = []
        self.finalized: set[int] = set()
        self.snapshots: dict[int, dict[str, RequestSnapshot]] = {}
        # Anchor times per step as tuples, not lists: a tuple of ints leaves the cyclic
        # GC's tracking, and a loaded daemon holds hundreds of thousands of them (as lists
        # they made every full collection a ~0.3 s pause).
        self.anchors: tuple[
            dict[int, tuple[int, ...]], dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]
        ] = (
            {},
            {},
            {},
        )
        # (bucket end wall ns, highest step) of first sightings, in 50 ms buckets
        self.timeline: deque[tuple[int, int]] = deque()
        # the newest bucket, kept out of the deque until a sighting falls outside it
        self._tail_end = 0  # its end (0: none)
        self._tail_step = 0  # its highest step
        self.horizon = 0  # steps below are gone
        self.coverage: list[list[int]] = []  # merged [start, end] of complete step spans
        self.cal = _Calibration()
        self.max_step = 0
        self.recent_periods: deque[float] = deque(maxlen=64)
        self.max_duration_ns = 0
        self.n_anchors = 0
        self._purged_to = 0
        self.lives: dict[int, list[Life]] = {}
        self.ambiguous = False
        self.max_start_ns = 0
        self.step_at_max_start = 0
        # journey-pinned steps (module :mod:`.pinned`): the last summary whose running
        # queue the known lives explain (a segment starts there), and its wall time
        self.bracket: int | None = None
        self.bracket_wall = 0
        self.used: set[int] = set()  # batches already observed through their summary
        self.shed_steps: set[int] = set()  # summaries shed: their batches stay unobserved
        self.prefix_cache_off = parse_async_attr(source.get("coeffd.prefix_caching")) is False
        self.touched = 0  # wall ns of the latest record of this engine, kept or not
        self.loop_waits: deque[LoopWait] = deque()
        self.loop_waits_late: list[tuple[int, int, LoopWait]] = []
        self._lw_seq = 0

    # ------------------------------------------------------------------ ingest

    def see(self, wall_ns: int) -> None:
        """Advance this engine's watermark."""
        if wall_ns > self.watermark:
            self.watermark = wall_ns

    def _first_sighting(self, wall_ns: int, step: int) -> None:
        # One timeline entry per 50 ms bucket (its end time, its highest step), not one per
        # step: the timeline only decides when step-indexed state leaves the window, and
        # letting it stay up to 50 ms longer in a 30 s window costs nothing, while an entry
        # per step was a tenth of the joiner's memory.
        # Every summary comes through here, so the newest bucket lives in two attributes
        # and reaches the deque only when a sighting falls outside it (rarely).
        if step > self.max_step:
            self.max_step = step
        end = self._tail_end
        if end - _SIGHTING_BUCKET_NS <= wall_ns < end:
            if step > self._tail_step:
                self._tail_step = step
            return
        if end:
            self.timeline.append((end, self._tail_step))
        self._tail_end = (wall_ns // _SIGHTING_BUCKET_NS + 1) * _SIGHTING_BUCKET_NS
        self._tail_step = step

    def is_restart(self, s: BatchSummary) -> bool:
        """A summary later in time than the latest one but not later in step ids: the
        engine restarted (its counter starts again at 1 under the same identity). Within
        one engine incarnation schedule starts grow with step ids, so out-of-order
        deliveries never look like this."""
        return s.step <= self.step_at_max_start and s.start_mono_ns > self.max_start_ns

    def add_summary(self, s: BatchSummary) -> str:
        """Store a summary; returns ``ok``, ``duplicate`` or ``late``."""
        if s.wall_ns > self.touched:
            self.touched = s.wall_ns
        n = s.step
        old = self.summaries.get(n)
        if old is not None and old.start_mono_ns != s.start_mono_ns and not self.ambiguous:
            # two engines behind one identity (DP > 1 without a per-process resource
            # attribute, spec §7.5): their step ids collide, so nothing keyed by step is
            # trustworthy for this source any more
            self.ambiguous = True
            log.warning(
                "joiner: two engines share one source identity; step observations disabled",
                source=self.source.id,
                step=n,
            )
        if old is not None or n in self.finalized:
            return "duplicate"
        if n < self.horizon:
            return "late"
        self.summaries[n] = s
        if s.start_mono_ns > self.max_start_ns:
            self.max_start_ns = s.start_mono_ns
            self.step_at_max_start = n
        d = s.end_mono_ns - s.start_mono_ns
        if d > self.max_duration_ns:
            self.max_duration_ns = d
        steps = self.summary_steps
        if not steps or steps[-1] < n:
            steps.append(n)
        else:
            bisect.insort(steps, n)
        deadline = s.wall_ns + self.window_ns
        pend = self.pending
        if not pend or pend[-1][0] <= deadline:
            pend.append((deadline, n))
        else:
            heapq.heappush(self.pending_late, (deadline, n))
        self._first_sighting(s.wall_ns, n)
        return "ok"

    def add_snapshot(self, s: RequestSnapshot) -> str:
        if s.step < self.horizon or s.step in self.finalized:
            return "late"
        d = self.snapshots.get(s.step)
        if d is None:
            d = self.snapshots[s.step] = {}
            self._first_sighting(s.wall_ns, s.step)
        if s.request_id in d:
            return "duplicate"
        d[s.request_id] = s
        return "ok"

    def add_anchor(self, ev: JourneyEvent) -> None:
        """Index a journey event as an anchor of the step start it pins."""
        if ev.wall_ns > self.touched:
            self.touched = ev.wall_ns
        kind = ev.kind
        if kind is JourneyKind.SCHEDULED:
            typ = SCHED
        elif kind is JourneyKind.PREEMPTED:
            # inside schedule(n) like SCHEDULED (a prefix-cache reset outside schedule()
            # is rare; a wrong anchor there makes the intersection empty, so it is rejected)
            typ = SCHED
        elif kind is JourneyKind.QUEUED:
            typ = QUEUED
        elif kind is JourneyKind.FINISHED:
            # aborts are processed from the input queue (current counter), like QUEUED
            typ = QUEUED if ev.finish_status == "aborted" else COMPL
        elif kind is JourneyKind.FIRST_TOKEN:
            typ = COMPL
        else:
            return
        if ev.step < self.horizon:
            return
        d = self.anchors[typ]
        times = d.get(ev.step)
        self.n_anchors += 1
        if times is None:
            d[ev.step] = (ev.mono_ns,)
            self._first_sighting(ev.wall_ns, ev.step)
        else:
            d[ev.step] = (*times, ev.mono_ns)

    def add_coverage(self, start: int, end: int) -> None:
        """Record that every summary of steps ``start..end`` has been delivered."""
        cov = self.coverage
        i = bisect.bisect_left(cov, [start, end])
        cov.insert(i, [start, end])
        merged: list[list[int]] = []
        for a, b in cov:
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.coverage = merged

    def covers(self, lo: int, hi: int) -> bool:
        """True when steps ``lo..hi`` are inside one complete-coverage range."""
        cov = self.coverage
        i = bisect.bisect_right(cov, [lo, float("inf")]) - 1
        return i >= 0 and cov[i][0] <= lo and cov[i][1] >= hi

    # ------------------------------------------------------------ loop wait

    def loop_wait(self, queued_mono_ns: int, queued_step: int) -> tuple[float | None, str]:
        """Expected time a request waited for the loop boundary at which it got QUEUED (ns),
        and how that was decided (``busy``, ``idle`` or why it is unknown).

        vLLM drains its input queue only between busy-loop iterations (spec pitfall 9),
        so arrival→QUEUED = API overhead (BLIS's α0) + this wait, which BLIS simulates
        itself. A request QUEUED at step ``q`` was delivered during the iteration between
        the drains before ``S(q)`` and ``S(q+1)``; deliveries do not depend on the loop,
        so given that iteration its delivery is uniform within it and the expected wait
        is half the time from the previous drain to its QUEUED. That needs no step
        summary: the previous drain is ``S(q)`` (pinned by any journey anchor of step
        ``q``) less the calibrated QUEUED offset. The iteration is a busy one when another
        request scheduled by step ``q`` was still running at ``q + 1`` (the loop had work
        and never blocked); with no request at step ``q`` the loop was blocked on its
        input and woke for this one (wait 0); a loop running its last requests out may
        have blocked part-way, which is left unknown (``draining``).

        Called once the engine's data clock is a window past the QUEUED, so the answer
        depends on the data, not on when it arrived (live = replay).
        """
        q = queued_step
        if q <= 0:
            return 0.0, "idle"
        lives = self.lives.get(q >> _BUCKET_BITS, ())
        if not any(life.first <= q < life.last for life in lives):
            if any(life.first <= q <= life.last for life in lives):
                return None, "draining"
            return 0.0, "idle"
        mode = self.mode()
        if mode is None:
            return None, "mode_unknown"
        p = self.point(q, 1 if mode else 0) or self._interpolate(q, 1 if mode else 0)
        if p is None:
            return None, "unpinned"
        if p.half_ns > self.cfg.loop_wait_max_uncertainty_us * 1e3:
            return None, "uncertain"
        dq = self.cal.mean_var(QUEUED, self.cfg.min_calibration)
        if dq is None:
            return None, "uncalibrated"
        span = queued_mono_ns - (p.t_ns - dq[0])
        if span <= 0:
            return None, "inconsistent_anchors"
        return span / 2.0, "busy"

    def _interpolate(self, n: int, a: int) -> pinned.Pin | None:
        """``S(n)`` between the nearest pinned starts around it, when every step between
        is a decode step of the known requests (consecutive decode steps of one batch
        differ by a request or a few context tokens, so equal spacing is close, and its
        errors have no sign). The half-width grows with the distance to the pins."""
        limit = _INTERPOLATE_STEPS
        lo = next((p for m in range(n - 1, n - limit, -1) if (p := self.point(m, a))), None)
        if lo is None:
            return None
        hi = next((p for m in range(n + 1, lo.step + limit) if (p := self.point(m, a))), None)
        if hi is None or hi.t_ns <= lo.t_ns:
            return None
        for m in range(lo.step - a, hi.step - a):
            for life in self.lives.get(m >> _BUCKET_BITS, ()):
                if life.first <= m <= (life.first_token if life.first_token is not None else m):
                    return None  # a prefill between: steps of unequal length
        frac = (n - lo.step) / (hi.step - lo.step)
        gap = hi.t_ns - lo.t_ns
        half = lo.half_ns + frac * (hi.half_ns - lo.half_ns) + 0.02 * gap / (hi.step - lo.step)
        return pinned.Pin(n, lo.t_ns + frac * gap, half)

    def defer_loop_wait(self, item: LoopWait) -> LoopWait | None:
        """Hold a request observation until its loop wait can be decided; returns the
        oldest held one when over ``cap`` (to be emitted without it)."""
        lw = self.loop_waits
        if not lw or lw[-1].deadline_wall <= item.deadline_wall:
            lw.append(item)
        else:
            self._lw_seq += 1
            heapq.heappush(self.loop_waits_late, (item.deadline_wall, self._lw_seq, item))
        if len(lw) + len(self.loop_waits_late) > self.cfg.max_requests:
            return self._pop_loop_wait()
        return None

    def _pop_loop_wait(self) -> LoopWait:
        late = self.loop_waits_late
        if late and (not self.loop_waits or late[0][0] < self.loop_waits[0].deadline_wall):
            return heapq.heappop(late)[2]
        return self.loop_waits.popleft()

    def due_loop_waits(self, now_wall: int | None) -> list[LoopWait]:
        """Held request observations whose window has passed (all of them if None)."""
        out: list[LoopWait] = []
        while self.loop_waits or self.loop_waits_late:
            nxt = self.loop_waits[0].deadline_wall if self.loop_waits else None
            if self.loop_waits_late and (nxt is None or self.loop_waits_late[0][0] < nxt):
                nxt = self.loop_waits_late[0][0]
            if now_wall is not None and nxt is not None and nxt > now_wall:
                break
            out.append(self._pop_loop_wait())
        return out

    # ------------------------------------------------------------ queue state

    def queue_state(self, queued_step: int) -> tuple[QueueState | None, bool]:
        """Nearest summary to a QUEUED step, and whether that answer is final.

        Final means no nearer summary can still arrive: distance 0, or the step spans
        covering ``[q - d, q + d]`` have all been delivered.
        """
        if self.ambiguous:
            return None, True
        steps = self.summary_steps
        dmax = self.cfg.queue_state_max_distance
        best: int | None = None
        if steps:
            i = bisect.bisect_left(steps, queued_step)
            after = steps[i] if i < len(steps) else None
            before = steps[i - 1] if i > 0 else None
            # nearest; ties go to the later summary (it already counts the request)
            if after is not None and (
                before is None or after - queued_step <= queued_step - before
            ):
                best = after
            else:
                best = before
            if best is not None and abs(best - queued_step) > dmax:
                best = None
        if best is None:
            final = self.covers(queued_step - dmax, queued_step + dmax)
            return None, final
        d = abs(best - queued_step)
        final = d == 0 or self.covers(queued_step - d, queued_step + d)
        s = self.summaries[best]
        qs = QueueState(
            step=best,
            waiting_depth=s.waiting_depth,
            running_depth=s.running_depth,
            kv_usage_gpu_ratio=s.kv_usage_gpu_ratio,
            distance_steps=d,
        )
        return qs, final

    # -------------------------------------------------------- period machinery

    def _vote_async(self, n: int) -> None:
        """Infer async scheduling from completions of step n-1 vs the summary of step n.

        Sync: outputs of n-1 are processed before ``S(n)``; async: after ``E(n)``.
        """
        s = self.summaries.get(n)
        if s is None:
            return
        for t in self.anchors[COMPL].get(n - 1, ()):
            if t < s.start_mono_ns:
                self.votes[0] += 1
            elif t > s.end_mono_ns:
                self.votes[1] += 1

    def mode(self) -> bool | None:
        if self.async_mode is not None:
            return self.async_mode
        sync, asy = self.votes
        if sync == asy:
            return None
        return asy > sync

    def _calibrate(self, n: int, a: int) -> None:
        """Add offsets ``S(n) - t`` of anchors pinning a summarised step ``n``."""
        s = self.summaries.get(n)
        if s is None:
            return
        S = s.start_mono_ns
        for typ, ts in self._pinning(n, a):
            key = (typ, n)
            if key in self.cal.seen:
                continue
            self.cal.seen.add(key)
            dq = self.cal.deltas[typ]
            for t in ts:
                dq.append(float(S - t))
            self.cal.added[typ] += len(ts)

    def _bounds(self, typ: int) -> iv.Interval:
        p = self.cfg.anchor_priors
        prior = (
            (p.scheduled_lo_us * 1e3, p.scheduled_hi_us * 1e3),
            (p.queued_lo_us * 1e3, p.queued_hi_us * 1e3),
            (p.completion_lo_us * 1e3, p.completion_hi_us * 1e3),
        )[typ]
        if typ == SCHED and self.max_duration_ns:
            # SCHEDULED/PREEMPTED lie in [S(n), E(n)]: E - S is the scheduler CPU time, whose
            # range every summary shows; bound by the largest seen (+25 % + 20 µs)
            prior = (max(prior[0], -(1.25 * self.max_duration_ns + 20e3)), prior[1])
        return iv.offset_bounds(
            list(self.cal.deltas[typ]),
            prior,
            self.cfg.min_calibration,
            self.cfg.calibration_margin_us * 1e3,
            self.cfg.calibration_margin_fraction,
        )

    def _pinning(self, n: int, a: int) -> list[tuple[int, tuple[int, ...]]]:
        """The anchors that pin ``S(n)``, by type: SCHEDULED/PREEMPTED(n), QUEUED(n-1),
        FIRST_TOKEN/FINISHED(n-1-a)."""
        an = self.anchors
        return [
            (typ, ts)
            for typ, step in ((SCHED, n), (QUEUED, n - 1), (COMPL, n - 1 - a))
            if (ts := an[typ].get(step))
        ]

    def _intersect(self, present: list[tuple[int, tuple[int, ...]]]) -> iv.Interval | None:
        parts: list[iv.Interval] = []
        for typ, ts in present:
            parts.extend(iv.shifted(ts, self._bounds(typ)))
        return iv.intersect(parts)

    def pin(self, n: int, a: int) -> tuple[iv.Interval | None, frozenset[int] | None]:
        """Interval of ``S(n)``; the anchor types used (None = exact from a summary)."""
        s = self.summaries.get(n)
        if s is not None:
            t = float(s.start_mono_ns)
            return (t, t), None
        present = self._pinning(n, a)
        return self._intersect(present), frozenset(typ for typ, _ in present)

    def _typical_period(self) -> float:
        """Median of the recent loop periods (ns)."""
        recent = self.recent_periods
        return sorted(recent)[len(recent) // 2]

    def point(self, n: int, a: int) -> pinned.Pin | None:
        """Point estimate of ``S(n)`` (exact from a summary, else the calibrated mean
        offsets of its anchors, weighted by their spread) and the half-width of its
        bounds; None when no calibrated anchor pins it or the anchors disagree.

        Means rather than the middle of the bounds: an anchor's offset sits near one end
        of its range (SCHEDULED just after ``S``), and a period is the difference of two
        starts pinned by different anchor types, so midpoints would bias it.
        """
        s = self.summaries.get(n)
        if s is not None:
            return pinned.Pin(n, float(s.start_mono_ns), 0.0)
        present = self._pinning(n, a)
        if not present:
            return None  # most steps: nothing pins them
        bounds = self._intersect(present)
        if bounds is None or bounds[0] > bounds[1]:
            return None
        est = self._weighted(present, bounds, exact_only=False)
        if est is None:
            return None
        self._cross_calibrate(n, present, bounds)
        return pinned.Pin(n, est, (bounds[1] - bounds[0]) / 2.0)

    def _weighted(
        self, present: list[tuple[int, tuple[int, ...]]], bounds: iv.Interval, exact_only: bool
    ) -> float | None:
        num: list[float] = []
        den: list[float] = []
        m = self.cfg.min_calibration
        for typ, ts in present:
            if exact_only and not self.cal.is_exact(typ, m):
                continue
            mv = self.cal.mean_var(typ, m)
            if mv is None:
                continue
            w = 1.0 / (mv[1] + 1e6)  # + (1 µs)²: equal weights when spreads are nil
            for t in ts:
                num.append(w * (t + mv[0]))
                den.append(w)
        if not den:
            return None
        # fsum: anchors arrive in any order, the estimate must not depend on it
        return min(max(math.fsum(num) / math.fsum(den), bounds[0]), bounds[1])

    def _cross_calibrate(
        self, n: int, present: list[tuple[int, tuple[int, ...]]], bounds: iv.Interval
    ) -> None:
        """Offsets of anchor types that summaries have not calibrated yet, measured on
        this step against the types they have: at 1 % step sampling a quiet engine sees
        a SCHEDULED or QUEUED anchor on a summarised step only every few minutes, while
        completions of the same steps are common."""
        m = self.cfg.min_calibration
        todo = [(typ, ts) for typ, ts in present if not self.cal.is_exact(typ, m)]
        if not todo or len(todo) == len(present):
            return
        ref = self._weighted(present, bounds, exact_only=True)
        if ref is None:
            return
        for typ, ts in todo:
            key = (typ + 3, n)
            if key in self.cal.seen:
                continue
            self.cal.seen.add(key)
            self.cal.cross[typ].extend(ref - t for t in ts)
            self.cal.cross_added[typ] += len(ts)

    def lives_at(self, n: int) -> list[Life]:
        """Known lives of requests in the running queue at step ``n``."""
        return [
            life for life in self.lives.get(n >> _BUCKET_BITS, ()) if life.first <= n <= life.last
        ]

    def mark_bracket(self, n: int) -> None:
        """Make summary ``n`` the start of the next segment (cheap: also done for shed
        summaries, so that span work under load shedding is the kept share of segments,
        not its square). Whether the known lives explain its running queue is checked
        only when a segment needs it, with the lives known by then."""
        s = self.summaries.get(n)
        ok = s is not None and not self.ambiguous and self.cfg.journey_steps
        self.bracket = n if ok else None
        if s is not None:
            self.bracket_wall = s.wall_ns

    def _explained(self, n: int) -> bool:
        """True when the known lives are exactly summary ``n``'s running queue."""
        return len(self.lives_at(n)) == self.summaries[n].running_depth

    def journey_spans(self, n: int) -> tuple[list[StepObservation], dict[str, int]]:
        """Period observations of the steps between the previous bracketing summary and
        summary ``n`` (see :mod:`.pinned`); the steps dropped, by reason."""
        prev = self.bracket
        self.mark_bracket(n)
        s = self.summaries.get(n)
        mode = self.mode()
        if s is None or prev is None or prev >= n or prev not in self.summaries or mode is None:
            return [], {}
        used, shed = self.used, self.shed_steps
        if all(b in used or b in shed for b in range(prev, n + 1)):
            return [], {}  # every step sampled (dense tracing): nothing between to pin
        if not (self._explained(prev) and self._explained(n)):
            return [], {"incomplete": n - prev - 1}
        a = 1 if mode else 0
        batches: dict[int, tuple[BatchRequest, ...] | str] = {}
        # the segment's lives once, in a fixed order: a batch's requests (and so the float
        # sums of its features) must not depend on the order the journeys arrived in
        lives = sorted(
            {
                id(life): life
                for bk in range(prev >> _BUCKET_BITS, (n >> _BUCKET_BITS) + 1)
                for life in self.lives.get(bk, ())
                if life.first <= n and life.last >= prev
            }.values(),
            key=_life_order,
        )
        for b in range(prev, n + 1):
            if b in self.used:
                batches[b] = "summary"
            elif b in self.shed_steps:
                batches[b] = "shed"  # load shedding: not brought back as part of a span
            elif b in self.summaries:
                sb = self.summaries[b]
                comp, reqs = self._composition(b, sb)
                if sb.scheduled_tokens == 0:
                    batches[b] = "idle"  # 1 ms sleep or the hand-off before idling
                else:
                    batches[b] = reqs if comp is not Composition.AGGREGATES else "aggregates"
            else:
                batches[b] = pinned.batch_at(lives, b, self.prefix_cache_off)
        pins = [p for m in range(prev + a, n + a + 2) if (p := self.point(m, a)) is not None]
        spans, why = pinned.spans(pins, batches, a, self.cfg.max_span_steps)
        why.pop("summary", None)
        why.pop("shed", None)
        out: list[StepObservation] = []
        for sp in spans:
            reason = self._check_span(sp)
            if reason:
                why[reason] = why.get(reason, 0) + len(sp.batches)
                continue
            out.append(self._span_observation(sp, s, mode))
        return out, why

    def _check_span(self, sp: pinned.Span) -> str:
        k = len(sp.batches)
        if sp.period_ns <= 0:
            return "non_positive"
        if sp.period_ns > self.cfg.max_period_ms * 1e6 * k:
            return "idle_gap"
        recent = self.recent_periods
        if (
            len(recent) >= 16
            and sp.period_ns > self.cfg.outlier_factor * k * self._typical_period()
        ):
            return "outlier_gap"
        if sp.half_ns > self.cfg.max_uncertainty_fraction * sp.period_ns:
            return "uncertain"
        return ""

    def _span_observation(
        self, sp: pinned.Span, bracket: BatchSummary, mode: bool
    ) -> StepObservation:
        reqs = [r for b in sp.batches for r in b]
        pf = [r for r in reqs if r.progress < r.input_len]
        pf_tok = sum(r.new_tokens for r in pf)
        k = len(sp.batches)
        agg = StepAggregates(
            num_prefill_reqs=len(pf),
            prefill_tokens=pf_tok,
            num_decode_reqs=len(reqs) - len(pf),
            decode_tokens=len(reqs) - len(pf),
            scheduled_tokens=sum(r.new_tokens for r in reqs),
            running_depth=max(len(b) for b in sp.batches),
            waiting_depth=bracket.waiting_depth,
            num_preempted=0,
            num_finished=0,
            kv_usage_gpu_ratio=bracket.kv_usage_gpu_ratio,
            kv_blocks_total_gpu=bracket.kv_blocks_total_gpu,
            kv_blocks_free_gpu=bracket.kv_blocks_free_gpu,
        )
        if k == 1:
            self.recent_periods.append(sp.period_ns)
        return StepObservation(
            source=self.source,
            step=sp.first,
            start_mono_ns=int(sp.start.t_ns),
            period_us=sp.period_ns / 1e3,
            period_method=PeriodMethod.JOURNEY_SPAN,
            # the CPU between a batch and the next schedule() varies per step and need
            # not average out (it is the loop's, not the batch's): k jitters, not √k
            period_uncertainty_us=(sp.half_ns + self.cfg.loop_jitter_us * 1e3 * k) / 1e3,
            scheduler_duration_us=0,
            composition=Composition.JOURNEYS,
            requests=sp.batches[0],
            aggregates=agg,
            async_scheduling=mode,
            more_batches=sp.batches[1:],
        )

    def _close_step(self, n: int) -> None:
        """What finalizing step ``n`` always does, built or shed: mark it, vote on the
        loop mode."""
        self.finalized.add(n)
        self._vote_async(n)
        self._vote_async(n + 1)

    def shed(self, n: int) -> None:
        """Finalize step ``n`` without building its observation (load shedding): only the
        cheap bookkeeping that later steps rely on still happens — async-mode votes, and
        the loop period from consecutive summaries for the recent periods that the
        queue-wait estimate of request observations (α0) needs."""
        self._close_step(n)
        self.shed_steps.add(n)
        s, nxt = self.summaries[n], self.summaries.get(n + 1)
        if nxt is not None and s.scheduled_tokens and nxt.scheduled_tokens:
            gap = nxt.start_mono_ns - s.start_mono_ns
            if 0 < gap <= self.cfg.max_period_ms * 1e6:
                self.recent_periods.append(gap)

    def finalize(self, n: int, kv: tuple[KVTransferObservation, ...] = ()) -> StepResult:
        """Turn the summary of step ``n`` into a StepObservation (or say why not)."""
        s = self.summaries[n]
        self._close_step(n)
        if self.ambiguous:
            return StepResult(None, "rejected", "ambiguous_source")
        if n <= self.cfg.warmup_steps:
            return StepResult(None, "rejected", "warmup")
        if s.scheduled_tokens == 0:
            # 1 ms sleep or the hand-off schedule before idling: the period is no batch's
            return StepResult(None, "rejected", "empty_step")
        mode = self.mode()
        if mode is None:
            return StepResult(None, "unmatched", "mode_unknown")
        a = 1 if mode else 0
        nxt_s = self.summaries.get(n + 1)
        if a and nxt_s is not None and nxt_s.scheduled_tokens == 0:
            # async: after an empty schedule(N+1) the loop may idle before S(N+2)
            return StepResult(None, "rejected", "empty_next_step")
        for k in (n, n + 1, n + 2):
            self._calibrate(k, a)
        m = n + a
        lo_i, types_lo = self.pin(m, a)
        hi_i, types_hi = self.pin(m + 1, a)
        if lo_i is None or hi_i is None:
            return StepResult(None, "unmatched", "no_anchor")
        if lo_i[0] > lo_i[1] or hi_i[0] > hi_i[1]:
            return StepResult(None, "rejected", "inconsistent_anchors")
        mid_ns, half_ns = iv.difference(lo_i, hi_i)
        if mid_ns <= 0:
            return StepResult(None, "rejected", "non_positive")
        if mid_ns > self.cfg.max_period_ms * 1e6:
            return StepResult(None, "rejected", "idle_gap")
        recent = self.recent_periods
        if len(recent) >= 16 and mid_ns > self.cfg.outlier_factor * self._typical_period():
            # far above its neighbours: an idle gap or a stall the anchors cannot tell apart
            return StepResult(None, "rejected", "outlier_gap")
        if half_ns > self.cfg.max_uncertainty_fraction * mid_ns:
            return StepResult(None, "rejected", "uncertain")
        half_ns += self.cfg.loop_jitter_us * 1e3
        if types_lo is None and types_hi is None:
            method = PeriodMethod.CONSECUTIVE_SUMMARIES
        elif types_lo == frozenset({COMPL}) and types_hi == frozenset({COMPL}):
            method = PeriodMethod.COMPLETION_ANCHORS
        else:
            method = PeriodMethod.JOURNEY_ANCHORS
        recent.append(mid_ns)
        self.used.add(n)
        loop_us = (nxt_s.start_mono_ns - s.start_mono_ns) / 1e3 if nxt_s is not None else None
        comp, reqs = self._composition(n, s)
        obs = StepObservation(
            source=self.source,
            step=n,
            start_mono_ns=s.start_mono_ns,
            period_us=mid_ns / 1e3,
            period_method=method,
            period_uncertainty_us=half_ns / 1e3,
            scheduler_duration_us=s.duration_us,
            composition=comp,
            requests=reqs,
            aggregates=aggregates_of(s),
            async_scheduling=mode,
            kv_transfers=kv,
            loop_period_us=loop_us,
        )
        return StepResult(obs, "joined")

    def _composition(self, n: int, s: BatchSummary) -> tuple[Composition, tuple[BatchRequest, ...]]:
        snaps = self.snapshots.get(n)
        if snaps:
            reqs = from_snapshots(s, snaps)
            if reqs is not None:
                return Composition.SNAPSHOTS, reqs
        lives = self.lives.get(n >> _BUCKET_BITS)
        if lives:
            reqs = from_lives(s, lives)
            if reqs is not None:
                return Composition.JOURNEYS, reqs
        return Composition.AGGREGATES, ()

    def add_life(
        self,
        scheduled: JourneyEvent | None,
        first_token: JourneyEvent | None,
        finished: JourneyEvent,
        preemptions: int,
    ) -> None:
        """Index a finished request's steps for journey-based batch composition."""
        if scheduled is None:
            return
        last = finished.step
        if finished.finish_status == "aborted":
            # aborted from the input queue with the current counter: its last scheduled
            # step is unknown
            preemptions = max(preemptions, 1)
        mode = self.mode()
        if mode is None and finished.finish_status == "stopped":
            preemptions = max(preemptions, 1)  # the extra async step is unknown: unusable
        elif mode and finished.finish_status == "stopped":
            last += 1
        life = Life(
            first=scheduled.step,
            first_token=first_token.step if first_token is not None else None,
            last=last,
            input_len=finished.prefill_total_tokens,
            output_len=finished.decode_done_tokens,
            preempted=preemptions > 0,
        )
        for b in range(life.first >> _BUCKET_BITS, (last >> _BUCKET_BITS) + 1):
            self.lives.setdefault(b, []).append(life)

    # --------------------------------------------------------------- window

    def due(self, now_wall: int) -> list[int]:
        """Pending steps whose window has passed on this engine's clock, oldest first."""
        pend, late = self.pending, self.pending_late
        wm = max(self.watermark, now_wall)
        due = []
        while pend and pend[0][0] <= wm:
            due.append(pend.popleft())
        if late and late[0][0] <= wm:
            while late and late[0][0] <= wm:
                due.append(heapq.heappop(late))
            due.sort()  # merge the two queues' steps into deadline order
        return [n for _, n in due]

    def drain_all(self) -> list[int]:
        """Every pending step, in step order (end of stream)."""
        out = sorted(n for _, n in itertools.chain(self.pending, self.pending_late))
        self.pending.clear()
        self.pending_late.clear()
        return out

    def expire(self, now_wall: int) -> None:
        """Forget step-indexed state older than the window (call after ``due``)."""
        limit = now_wall - self.window_ns
        tl = self.timeline
        h = self.horizon
        while tl and tl[0][0] < limit:
            _, step = tl.popleft()
            if step - 2 > h:
                h = step - 2
        if not tl and self._tail_end and self._tail_end < limit:  # the newest bucket too
            if self._tail_step - 2 > h:
                h = self._tail_step - 2
            self._tail_end = 0
        if self.bracket is not None and self.bracket_wall >= limit - self.window_ns:
            # the segment after the last bracketing summary is built when the next one
            # is due: keep its steps (at most one more window)
            h = min(h, self.bracket - 2)
        if h > self.horizon:
            self.horizon = h
            # purging walks every step-indexed dict: do it in strides, not on every step,
            # but at once when the engine fell silent (no later step will come to make
            # up the stride: its last steps were held for good)
            if h - self._purged_to >= _PURGE_STRIDE or not (tl or self._tail_end):
                self._purge(h)

    def silent(self, now_wall: int) -> bool:
        """Nothing seen for a window and nothing left to do: the engine can be forgotten."""
        return self.touched < now_wall - self.window_ns and not (
            self.timeline
            or self._tail_end
            or self.pending
            or self.pending_late
            or self.loop_waits
            or self.loop_waits_late
        )

    def _purge(self, h: int) -> None:
        self._purged_to = h
        self._purge_below(h)

    def _purge_below(self, h: int) -> None:
        # summary_steps is the sorted key list of summaries: no scan of the whole window
        i = bisect.bisect_left(self.summary_steps, h)
        for n in self.summary_steps[:i]:
            del self.summaries[n]
            self.finalized.discard(n)
        if i:
            del self.summary_steps[:i]
        if len(self.finalized) > len(self.summaries):  # orphans (a cap dropped summaries)
            self.finalized = {n for n in self.finalized if n >= h}
        # ``pending`` is left alone: an entry whose summary is gone pops at its deadline
        # and finds nothing to finalize.
        for k in [k for k in self.snapshots if k < h]:
            del self.snapshots[k]
        self.used = {k for k in self.used if k >= h}
        self.shed_steps = {k for k in self.shed_steps if k >= h}
        for a in self.anchors:
            for k in [k for k in a if k < h]:
                self.n_anchors -= len(a.pop(k))
        self.cal.seen = {k for k in self.cal.seen if k[1] >= h}
        hb = h >> _BUCKET_BITS
        for b in [b for b in self.lives if b < hb]:
            del self.lives[b]
        self.coverage = [c for c in self.coverage if c[1] >= h]

    def entries(self) -> dict[str, int]:
        """Window occupancy by kind (for the gauge)."""
        return {
            "step_summary": len(self.summaries),
            "step_snapshot": sum(len(d) for d in self.snapshots.values()),
            "anchor": self.n_anchors,
            "request_life": sum(len(v) for v in self.lives.values()),
        }

    def enforce_caps(self) -> list[int]:
        """Drop the oldest steps beyond the configured caps; returns pending steps dropped."""
        n_anchor_steps = len(self.anchors[0]) + len(self.anchors[1]) + len(self.anchors[2])
        over = max(
            len(self.summaries) - self.cfg.max_steps,
            n_anchor_steps - self.cfg.max_anchor_steps,
            len(self.snapshots) - self.cfg.max_steps,
        )
        if over <= 0:
            return []
        keys = sorted(
            set(self.summaries) | {k for d in self.anchors for k in d} | set(self.snapshots)
        )
        # purge 10 % beyond the cap so the (linear) purge runs rarely
        cut = min(over + len(keys) // 10, len(keys) - 1)
        h = keys[cut]
        dropped = sorted(n for _, n in itertools.chain(self.pending, self.pending_late) if n < h)
        self.horizon = max(self.horizon, h)
        self._purge(self.horizon)
        # (rare) drop them from the queues too, so no later call reports them again
        self.pending = deque(p for p in self.pending if p[1] >= h)
        self.pending_late = [p for p in self.pending_late if p[1] >= h]
        heapq.heapify(self.pending_late)
        return dropped
