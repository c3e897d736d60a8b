"""Schedule starts ``S(n)`` of one engine's steps, from summaries and journey anchors.

Period target (spec §2.5 step 5): the busy-loop time attributable to batch ``N`` is
``S(N+1) - S(N)`` with sync scheduling and ``S(N+2) - S(N+1)`` with async scheduling
(the GPU runs batch N while the CPU schedules N+1), i.e. ``S(m+1) - S(m)`` with
``m = N + a``. Each ``S(n)`` comes from a summary (exact) or from anchors:

* ``SCHEDULED(n)``: inside ``schedule(n)``, so ``S(n) ∈ [t - sched, t]``;
* ``QUEUED(n-1)`` and aborted ``FINISHED(n-1)``: input drain right before ``S(n)``;
* ``FIRST_TOKEN``/``FINISHED(n-1-a)``: output processing right before ``S(n)``.

The offset of each anchor type is bounded by priors until the engine has shown enough
steps that carry both a summary and an anchor; then by the observed range plus a margin.

:class:`StepStarts` owns that estimate and the loop mode (``a``); it reads the indexes
that :class:`~.engine.EngineState` fills (summaries, anchors, request lives) and never
writes them, so the window's bookkeeping stays in one place.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from coeffd.joiner import intervals as iv
from coeffd.joiner import pinned
from coeffd.joiner.composition import Life
from coeffd.joiner.config import JoinerConfig
from coeffd.records.events import BatchSummary, JourneyEvent, JourneyKind

SCHED, QUEUED, COMPL = 0, 1, 2
_CAL_KEEP = 512  # calibration deltas kept per anchor type (a rolling sample)
BUCKET_BITS = 6  # request lives are indexed by 64-step buckets
# how far a start may be interpolated from its pins: decode steps of a quiet engine
# change by a few context tokens each, so even 256 of them space evenly
_INTERPOLATE_STEPS = 256

# anchor times per step, one dict per anchor type (tuples of ints: see EngineState)
Anchors = tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]


def anchor_type(ev: JourneyEvent) -> int | None:
    """Which anchor type a journey event is (None: it pins no step start)."""
    kind = ev.kind
    if kind is JourneyKind.SCHEDULED:
        return SCHED
    if kind is JourneyKind.PREEMPTED:
        # inside schedule(n) like SCHEDULED (a prefix-cache reset outside schedule()
        # is rare; a wrong anchor there makes the intersection empty, so it is rejected)
        return SCHED
    if kind is JourneyKind.QUEUED:
        return QUEUED
    if kind is JourneyKind.FINISHED:
        # aborts are processed from the input queue (current counter), like QUEUED
        return QUEUED if ev.finish_status == "aborted" else COMPL
    if kind is JourneyKind.FIRST_TOKEN:
        return COMPL
    return None


@dataclass(slots=True)
class Calibration:
    """Observed offsets ``S(n) - t`` of each anchor type (ns)."""

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

    def usable(self, typ: int, min_samples: int) -> bool:
        """Whether :meth:`mean_var` answers for this type (without computing it)."""
        return len(self.deltas[typ]) >= min_samples or len(self.cross[typ]) >= 4 * min_samples

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


class StepStarts:
    """Estimates of ``S(n)`` for one engine, and its loop mode (sync or async)."""

    def __init__(
        self,
        summaries: dict[int, BatchSummary],
        anchors: Anchors,
        lives: dict[int, list[Life]],
        config: JoinerConfig,
        async_mode: bool | None,
        summary_steps: list[int] | None = None,
        pinnable: list[int] | None = None,
    ) -> None:
        # shared with EngineState, which fills and purges them (never rebinds them)
        self.summaries = summaries
        self.summary_steps = summary_steps  # the sorted keys of summaries, when kept
        # when kept (EngineState): sorted, every step n that a summary or an anchor may
        # pin (a summary of n, SCHEDULED(n), QUEUED(n-1), a completion at n-1 or n-2),
        # so a walk over a range visits those only, not every step (at 1 % step sampling
        # a nearest pin was ~70 steps away, and a segment ~100 steps long)
        self.pinnable = pinnable
        self.anchors = anchors
        self.lives = lives
        self.cfg = config
        self.async_mode = async_mode  # forced by config or resource; None: inferred
        self.votes = [0, 0]  # sync, async
        self.cal = Calibration()
        self.max_duration_ns = 0  # longest schedule() seen in a summary
        # which anchor types Calibration.usable: it only grows (deltas are never dropped
        # below min_calibration), so _nearest re-asks only while one is not
        self._usable = [False, False, False]

    # ------------------------------------------------------------------ loop mode

    def vote_async(self, n: int) -> None:
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
        """True for async scheduling, False for sync, None while unknown."""
        if self.async_mode is not None:
            return self.async_mode
        sync, asy = self.votes
        if sync == asy:
            return None
        return asy > sync

    # ---------------------------------------------------------------- calibration

    def calibrate(self, n: int, a: int) -> None:
        """Add offsets ``S(n) - t`` of anchors pinning a summarised step ``n``."""
        s = self.summaries.get(n)
        if s is None:
            return
        S = s.start_mono_ns
        cal, an = self.cal, self.anchors
        seen = cal.seen
        # _pinning's lookups inlined (this runs for three steps per finalized one), and
        # each (type, step) is taken once: later calls find it seen
        for typ, step in ((SCHED, n), (QUEUED, n - 1), (COMPL, n - 1 - a)):
            ts = an[typ].get(step)
            if not ts or (typ, n) in seen:
                continue
            seen.add((typ, n))
            cal.deltas[typ].extend([float(S - t) for t in ts])
            cal.added[typ] += len(ts)

    def forget_below(self, h: int) -> None:
        """Drop the calibration marks of steps below ``h`` (they left the window)."""
        self.cal.seen = {k for k in self.cal.seen if k[1] >= h}

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

    # ------------------------------------------------------------------- estimates

    def _pinning(self, n: int, a: int) -> list[tuple[int, tuple[int, ...]]]:
        """The anchors that pin ``S(n)``, by type: SCHEDULED/PREEMPTED(n), QUEUED(n-1),
        FIRST_TOKEN/FINISHED(n-1-a)."""
        sched, queued, compl = self.anchors
        out: list[tuple[int, tuple[int, ...]]] = []  # unrolled (twice per finalized step)
        if ts := sched.get(n):
            out.append((SCHED, ts))
        if ts := queued.get(n - 1):
            out.append((QUEUED, ts))
        if ts := compl.get(n - 1 - a):
            out.append((COMPL, ts))
        return out

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

    def point(self, n: int, a: int, min_samples: int | None = None) -> pinned.Pin | None:
        """Point estimate of ``S(n)`` (exact from a summary, else the calibrated mean
        offsets of its anchors, weighted by their spread) and the half-width of its
        bounds; None when no calibrated anchor pins it or the anchors disagree.

        Means rather than the middle of the bounds: an anchor's offset sits near one end
        of its range (SCHEDULED just after ``S``), and a period is the difference of two
        starts pinned by different anchor types, so midpoints would bias it.

        ``min_samples``: coincidences an anchor type needs before its mean offset places
        the point (default ``min_calibration``, which also decides when observed offsets
        replace the priors' bounds); a loop wait asks with fewer
        (``JoinerConfig.loop_wait_min_calibration``) when the default finds none. Such a
        point is an answer only: it cross-calibrates nothing, so the steps' pins and
        calibration stay what they were.
        """
        s = self.summaries.get(n)
        if s is not None:
            return pinned.Pin(n, float(s.start_mono_ns), 0.0)
        an = self.anchors
        if not (an[SCHED].get(n) or an[QUEUED].get(n - 1) or an[COMPL].get(n - 1 - a)):
            return None  # most steps: nothing pins them (checked first: loop waits and
            # journey spans ask this of every step of their ranges)
        if min_samples is None:
            if not any(self._refresh_usable()):
                return None  # no type calibrated yet (the test below, before its list)
            m = self.cfg.min_calibration
        else:
            m = min_samples
        present = self._pinning(n, a)
        cal = self.cal
        if not any(cal.usable(typ, m) for typ, _ in present):
            return None  # no estimate from uncalibrated types (nor bounds needed for it)
        bounds = self._intersect(present)
        if bounds is None or bounds[0] > bounds[1]:
            return None
        est = self._weighted(present, bounds, False, m)
        if est is None:
            return None
        if min_samples is None:
            self._cross_calibrate(n, present, bounds)
        return pinned.Pin(n, est, (bounds[1] - bounds[0]) / 2.0)

    def _weighted(
        self,
        present: list[tuple[int, tuple[int, ...]]],
        bounds: iv.Interval,
        exact_only: bool,
        m: int,
    ) -> float | None:
        num: list[float] = []
        den: list[float] = []
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
        ref = self._weighted(present, bounds, True, m)
        if ref is None:
            return
        for typ, ts in todo:
            key = (typ + 3, n)
            if key in self.cal.seen:
                continue
            self.cal.seen.add(key)
            self.cal.cross[typ].extend(ref - t for t in ts)
            self.cal.cross_added[typ] += len(ts)

    def interpolate(self, n: int, a: int, min_samples: int | None = None) -> pinned.Pin | None:
        """``S(n)`` between the nearest pinned starts around it, when every step between
        is a decode step of the known requests (consecutive decode steps of one batch
        differ by a request or a few context tokens, so equal spacing is close, and its
        errors have no sign). The half-width grows with the distance to the pins.
        ``min_samples``: as :meth:`point`'s (the pins found cross-calibrate nothing)."""
        limit = _INTERPOLATE_STEPS
        keys = self.summary_steps
        ok = self._refresh_usable() if min_samples is None else self._usable_at(min_samples)
        if keys is not None and not any(ok):
            # only summaries pin (no anchor type calibrated: at vLLM's default sampling,
            # the first minutes of every engine): the nearest ones are found in their
            # sorted steps, without a Pin each, and most loop waits end here, a prefill
            # between (_nearest_summary's walks, inlined; a summary's point() has no
            # side effect)
            summaries = self.summaries
            i = bisect.bisect_right(keys, n - 1) - 1
            while i >= 0 and keys[i] > n - limit and keys[i] not in summaries:
                i -= 1
            if i < 0 or keys[i] <= n - limit:
                return None
            lo_step = keys[i]
            j, stop, k = bisect.bisect_left(keys, n + 1), lo_step + limit, len(keys)
            while j < k and keys[j] < stop and keys[j] not in summaries:
                j += 1
            if j >= k or keys[j] >= stop:
                return None
            hi_step = keys[j]
            if float(summaries[hi_step].start_mono_ns) <= float(summaries[lo_step].start_mono_ns):
                return None
            if self._prefill_between(lo_step - a, hi_step - a - 1):
                return None
            lo_pin = self.point(lo_step, a)
            hi_pin = self.point(hi_step, a)
            assert lo_pin is not None and hi_pin is not None
            return self._between(n, lo_pin, hi_pin)
        lo = self._nearest(range(n - 1, n - limit, -1), a, min_samples)
        if lo is None:
            return None
        hi = self._nearest(range(n + 1, lo.step + limit), a, min_samples)
        if hi is None or hi.t_ns <= lo.t_ns:
            return None
        if self._prefill_between(lo.step - a, hi.step - a - 1):
            return None  # a prefill between: steps of unequal length
        return self._between(n, lo, hi)

    @staticmethod
    def _between(n: int, lo: pinned.Pin, hi: pinned.Pin) -> pinned.Pin:
        """:meth:`interpolate`'s estimate of ``S(n)`` from the pins around it."""
        frac = (n - lo.step) / (hi.step - lo.step)
        gap = hi.t_ns - lo.t_ns
        half = lo.half_ns + frac * (hi.half_ns - lo.half_ns) + 0.02 * gap / (hi.step - lo.step)
        return pinned.Pin(n, lo.t_ns + frac * gap, half)

    def points(self, steps: range, a: int) -> list[pinned.Pin]:
        """:meth:`point` of each of ``steps`` that has one, in order: asked only of the
        steps a summary or an anchor pins (the rest have no point and no side effect)."""
        summaries = self.summaries
        sched, queued, compl = self.anchors
        out: list[pinned.Pin] = []
        cands: Iterable[int] = steps
        if self.pinnable is not None and steps.step == 1:
            keys = self.pinnable
            cands = keys[
                bisect.bisect_left(keys, steps.start) : bisect.bisect_left(keys, steps.stop)
            ]
        if not any(self._refresh_usable()):
            # no anchor type calibrated: only summaries pin (point() of any other step is
            # None, without side effects)
            for m in cands:
                if m in summaries:
                    p = self.point(m, a)
                    if p is not None:
                        out.append(p)
            return out
        for m in cands:
            if m in summaries or sched.get(m) or queued.get(m - 1) or compl.get(m - 1 - a):
                p = self.point(m, a)
                if p is not None:
                    out.append(p)
        return out

    def _refresh_usable(self) -> list[bool]:
        """Which anchor types :meth:`Calibration.usable` (re-asked only until all are:
        once usable, a type stays usable)."""
        ok = self._usable
        if not ok[0] or not ok[1] or not ok[2]:
            cal, m = self.cal, self.cfg.min_calibration
            d, c, m4 = cal.deltas, cal.cross, 4 * m  # Calibration.usable, inlined
            ok[0] = len(d[0]) >= m or len(c[0]) >= m4
            ok[1] = len(d[1]) >= m or len(c[1]) >= m4
            ok[2] = len(d[2]) >= m or len(c[2]) >= m4
        return ok

    def _usable_at(self, m: int) -> list[bool]:
        """Which anchor types :meth:`Calibration.usable` at ``m`` coincidences (a loop
        wait's lower threshold: not cached, asked only when the default found nothing)."""
        cal = self.cal
        return [cal.usable(0, m), cal.usable(1, m), cal.usable(2, m)]

    def answers_differ(self, m: int) -> bool:
        """Whether an estimate at ``m`` coincidences (``point(n, a, m)``) can differ from
        the default's: some anchor type's offset would come from another source
        (summaries, cross-calibration or none) at ``m`` than at ``min_calibration``. Once
        summaries calibrate every type, the lower threshold changes nothing, and a loop
        wait need not ask again."""
        cal, k = self.cal, self.cfg.min_calibration
        d, c = cal.deltas, cal.cross
        for typ in (0, 1, 2):  # (m < k: the caller's case)
            nd = len(d[typ])
            if nd >= k:
                continue  # summaries calibrated it at both
            if nd >= m:
                return True  # at m only
            nc = len(c[typ])  # neither: the cross-calibration decides at both
            if (nc >= 4 * k) != (nc >= 4 * m):
                return True
        return False

    def _nearest(self, steps: range, a: int, min_samples: int | None = None) -> pinned.Pin | None:
        """The first of ``steps`` whose start is pinned (:meth:`point`), asking it only of
        the steps a summary or a calibrated anchor type could pin: most have neither."""
        summaries = self.summaries
        # an anchor type not calibrated yet pins no point (point() needs one that is);
        # that stays so until a point is found (only a found one cross-calibrates)
        ok = self._refresh_usable() if min_samples is None else self._usable_at(min_samples)
        if not any(ok) and self.summary_steps is not None:
            return self._nearest_summary(steps, a)  # only summaries pin: few, and sorted
        sched = self.anchors[SCHED] if ok[SCHED] else {}
        queued = self.anchors[QUEUED] if ok[QUEUED] else {}
        compl = self.anchors[COMPL] if ok[COMPL] else {}
        cands: Iterable[int] = steps
        if self.pinnable is not None and steps.step in (1, -1):
            keys = self.pinnable
            if steps.step == 1:
                cands = keys[
                    bisect.bisect_left(keys, steps.start) : bisect.bisect_left(keys, steps.stop)
                ]
            else:  # descending: start down to stop (exclusive)
                i = bisect.bisect_right(keys, steps.start)
                j = bisect.bisect_right(keys, steps.stop)
                cands = reversed(keys[j:i])
        for m in cands:
            if m in summaries or sched.get(m) or queued.get(m - 1) or compl.get(m - 1 - a):
                p = self.point(m, a, min_samples)
                if p is not None:
                    return p
        return None

    def _prefill_between(self, lo: int, hi: int) -> bool:
        """Whether a known request was in prefill (``first ≤ m ≤ first_token``; still
        waiting for its first token: from ``first`` on) at a step ``m`` in ``lo..hi`` it
        is indexed under: per 64-step bucket, not per step."""
        for b in range(lo >> BUCKET_BITS, (hi >> BUCKET_BITS) + 1):
            b_lo, b_hi = max(lo, b << BUCKET_BITS), min(hi, ((b + 1) << BUCKET_BITS) - 1)
            for life in self.lives.get(b, ()):
                # max(b_lo, first) <= min(b_hi, first_token), without the calls (per life)
                first, ft = life.first, life.first_token
                if (first if first > b_lo else b_lo) <= (b_hi if ft is None or ft > b_hi else ft):
                    return True
        return False

    def _nearest_summary(self, steps: range, a: int) -> pinned.Pin | None:
        """:meth:`_nearest` when only summaries can pin: walk their sorted steps."""
        keys = self.summary_steps
        assert keys is not None
        up = steps.step > 0
        i = (
            bisect.bisect_left(keys, steps.start)
            if up
            else bisect.bisect_right(keys, steps.start) - 1
        )
        while 0 <= i < len(keys) and (keys[i] < steps.stop if up else keys[i] > steps.stop):
            m = keys[i]
            if m in self.summaries and (p := self.point(m, a)) is not None:
                return p
            i += 1 if up else -1
        return None
