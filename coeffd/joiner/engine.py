"""Per-EngineCore join state: the window's indexes and what becomes of each step.

Length: one engine's indexes and the step decisions that read them all; split, each half
would reach into the other's indexes.

Everything here is keyed by step id *of one engine* (one ``Source.id``): step ids
collide across engines and restart with the engine, so nothing is ever keyed globally.
All times compared here are that engine's ``CLOCK_MONOTONIC`` (``step.ts_*_ns`` and
journey ``ts.monotonic_ns``), except the window bookkeeping, which uses the engine's own
wall clock (event ``timeUnixNano``) as its watermark.

:class:`EngineState` owns the indexes (summaries, snapshots, journey anchors, request
lives, coverage), the window (deadlines, expiry, caps) and turning a due step into an
observation. How a step start ``S(n)`` is estimated from those indexes lives in
:mod:`.starts`; the loop wait of request observations in :mod:`.loopwait`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from dataclasses import dataclass

import structlog

from coeffd.joiner import intervals as iv
from coeffd.joiner import pinned
from coeffd.joiner.composition import Life, aggregates_of, from_lives, from_snapshots
from coeffd.joiner.config import JoinerConfig
from coeffd.joiner.loopwait import LoopWait, LoopWaitQueue, loop_wait
from coeffd.joiner.starts import BUCKET_BITS, COMPL, QUEUED, SCHED, Anchors, StepStarts
from coeffd.joiner.waits import CompositionWaits
from coeffd.records.events import (
    BatchSummary,
    JourneyEvent,
    JourneyKind,
    RequestSnapshot,
    Source,
)
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    KVTransferObservation,
    PeriodMethod,
    QueueState,
    StepAggregates,
    StepObservation,
)

log = structlog.get_logger(__name__)

_PURGE_STRIDE = 512  # steps between purges of expired step-indexed state
_SIGHTING_BUCKET_NS = 50_000_000  # timeline granularity (see EngineState._first_sighting)


@dataclass(slots=True)
class StepResult:
    """Outcome of finalizing one sampled step."""

    observation: StepObservation | None
    outcome: str  # joined | unmatched | rejected | shed | held (waits for journeys)
    reason: str = ""


# anchor_type by kind (an aborted FINISHED is QUEUED: add_anchor)
_ANCHOR_TYPE = {
    JourneyKind.SCHEDULED: SCHED,
    JourneyKind.PREEMPTED: SCHED,
    JourneyKind.QUEUED: QUEUED,
    JourneyKind.FIRST_TOKEN: COMPL,
    JourneyKind.FINISHED: COMPL,
}


def _mark(steps: list[int], n: int) -> None:
    """Insert ``n`` into the sorted list ``steps`` unless it is there (mostly appends:
    anchors and summaries arrive roughly in step order)."""
    if not steps or steps[-1] < n:
        steps.append(n)
        return
    i = bisect.bisect_left(steps, n)
    if steps[i] != n:
        steps.insert(i, n)


def _life_order(life: Life) -> tuple[int, int, int, int, int, bool]:
    ft = life.first_token if life.first_token is not None else -1
    return (life.first, life.last, life.input_len, life.output_len, ft, life.preempted)


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
        self.seq = 0  # its place among the joiner's engines (the order sweeps visit them)
        self.window_ns = int(config.window_s * 1e9)
        self.watermark = 0  # max wall ns of this engine's records
        forced = config.async_scheduling
        async_mode = (
            forced
            if forced is not None
            else parse_async_attr(source.get("coeffd.async_scheduling"))
        )
        self.async_source = (
            "config" if forced is not None else ("resource" if async_mode is not None else "")
        )
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
        self.anchors: Anchors = ({}, {}, {})
        # (bucket end wall ns, highest step) of first sightings, in 50 ms buckets
        self.timeline: deque[tuple[int, int]] = deque()
        # the newest bucket, kept out of the deque until a sighting falls outside it
        self._tail_end = 0  # its end (0: none)
        self._tail_step = 0  # its highest step
        self.horizon = 0  # steps below are gone
        self.coverage: list[list[int]] = []  # merged [start, end] of complete step spans
        self.max_step = 0
        self.recent_periods: deque[float] = deque(maxlen=64)
        self._periods_sorted: list[float] = []  # the same, sorted: a median per step
        self.n_anchors = 0
        self._purged_to = 0
        self.lives: dict[int, list[Life]] = {}  # by 64-step bucket (BUCKET_BITS)
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
        # the fleet's newest data (wall ns) when this engine's data last advanced: in a
        # replay an engine is gone once the fleet's data runs max_lateness_s past it, and
        # an engine whose export lags the others' (its data behind theirs) but still
        # comes is heard, not gone
        self.heard_at = 0
        self.loop_waits = LoopWaitQueue()
        # sampled steps waiting past the window for journeys of their running requests
        # (module :mod:`.waits`)
        lateness = max(config.max_lateness_s, config.window_s)
        wait_s = config.composition_wait_s if config.composition_wait_s is not None else lateness
        self.waits = CompositionWaits(int(wait_s * 1e9), config.max_composition_waits)
        self.wait_compositions = wait_s > config.window_s
        # S(n) estimates and the loop mode, read off the indexes above
        # sorted steps whose start a summary or an anchor may pin (StepStarts.pinnable)
        self.pinnable: list[int] = []
        self.starts = StepStarts(
            self.summaries,
            self.anchors,
            self.lives,
            config,
            async_mode,
            self.summary_steps,
            self.pinnable,
        )

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
        st = self.starts
        if d > st.max_duration_ns:
            st.max_duration_ns = d
        steps = self.summary_steps
        if not steps or steps[-1] < n:
            steps.append(n)
        else:
            bisect.insort(steps, n)
        _mark(self.pinnable, n)
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
        typ = _ANCHOR_TYPE.get(ev.kind)  # anchor_type(ev), inlined: once per journey event
        if typ is None:
            return
        if typ == COMPL and ev.finish_status == "aborted" and ev.kind is JourneyKind.FINISHED:
            typ = QUEUED
        step = ev.step
        if step < self.horizon:
            return
        d = self.anchors[typ]
        times = d.get(step)
        self.n_anchors += 1
        if times is not None:
            d[step] = (*times, ev.mono_ns)
            return
        d[step] = (ev.mono_ns,)
        # _first_sighting's common case inline: the step is sighted in the newest bucket
        wall, end = ev.wall_ns, self._tail_end
        if end - _SIGHTING_BUCKET_NS <= wall < end:
            if step > self.max_step:
                self.max_step = step
            if step > self._tail_step:
                self._tail_step = step
        else:  # self._first_sighting(wall, step) past its bucket test, inlined
            if step > self.max_step:
                self.max_step = step
            if end:
                self.timeline.append((end, self._tail_step))
            self._tail_end = (wall // _SIGHTING_BUCKET_NS + 1) * _SIGHTING_BUCKET_NS
            self._tail_step = step
        # the starts it may pin: S(n) for SCHEDULED(n), S(n+1) for QUEUED(n), S(n+1+a) for
        # a completion (a unknown here: both); _mark's append inline when they are newest
        pins = self.pinnable
        first = step + 1 if typ != SCHED else step
        last = step + 2 if typ == COMPL else first
        if not pins or pins[-1] < first:
            pins.append(first)
            if last != first:
                pins.append(last)
        else:  # mostly the newest mark already (the step's other anchors set it)
            top = pins[-1]
            if top != first:
                _mark(pins, first)  # (an insert below the newest: top stays the last)
            if last != first:
                if top < last:
                    pins.append(last)
                elif top != last:
                    _mark(pins, last)

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
        if len(cov) <= 1:  # the common case: one range since the engine was first seen
            return bool(cov) and cov[0][0] <= lo and cov[0][1] >= hi
        i = bisect.bisect_right(cov, [lo, float("inf")]) - 1
        return i >= 0 and cov[i][0] <= lo and cov[i][1] >= hi

    # ------------------------------------------------------------ loop wait

    def loop_wait(self, queued_mono_ns: int, queued_step: int) -> tuple[float | None, str]:
        """See :func:`.loopwait.loop_wait`."""
        return loop_wait(self.starts, queued_mono_ns, queued_step)

    def defer_loop_wait(self, item: LoopWait) -> LoopWait | None:
        """Hold a request observation until its loop wait can be decided; returns the
        oldest held one when over ``max_requests`` (to be emitted without it)."""
        return self.loop_waits.defer(item, self.cfg.max_requests)

    def due_loop_waits(self, now_wall: int | None) -> list[LoopWait]:
        """Held request observations whose window has passed (all of them if None)."""
        return self.loop_waits.due(now_wall)

    # ------------------------------------------------------------ queue state

    def queue_state(
        self, queued_step: int, final_only: bool = False
    ) -> tuple[QueueState | None, bool]:
        """Nearest summary to a QUEUED step, and whether that answer is final.

        Final means no nearer summary can still arrive: distance 0, or the step spans
        covering ``[q - d, q + d]`` have all been delivered. ``final_only``: an answer
        that is not final is (None, False), without building it (the caller waits).
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
        if final_only and not final:
            return None, False
        s = self.summaries[best]
        qs = QueueState(
            step=best,
            waiting_depth=s.waiting_depth,
            running_depth=s.running_depth,
            kv_usage_gpu_ratio=s.kv_usage_gpu_ratio,
            distance_steps=d,
        )
        return qs, final

    # ----------------------------------------------------------------- steps

    def mode(self) -> bool | None:
        """True for async scheduling, False for sync, None while unknown."""
        return self.starts.mode()

    def _typical_period(self) -> float:
        """Median of the recent loop periods (ns)."""
        return self._periods_sorted[len(self._periods_sorted) // 2]

    def _note_period(self, period_ns: float) -> None:
        """Add a loop period to the recent ones (and their sorted copy)."""
        recent, ordered = self.recent_periods, self._periods_sorted
        if len(recent) == recent.maxlen:
            del ordered[bisect.bisect_left(ordered, recent[0])]
        recent.append(period_ns)
        bisect.insort(ordered, period_ns)

    def lives_at(self, n: int) -> list[Life]:
        """Known lives of requests in the running queue at step ``n``."""
        return [
            life for life in self.lives.get(n >> BUCKET_BITS, ()) if life.first <= n <= life.last
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
        k = 0  # len(self.lives_at(n)), without the list (twice per segment)
        for life in self.lives.get(n >> BUCKET_BITS, ()):
            if life.first <= n <= life.last:
                k += 1
        return k == self.summaries[n].running_depth

    def journey_spans(
        self, n: int, shed: bool = False
    ) -> tuple[list[StepObservation], dict[str, int]]:
        """Period observations of the steps between the previous bracketing summary and
        summary ``n`` (see :mod:`.pinned`); the steps dropped, by reason.

        ``shed`` (load shedding: the segment goes with its closing summary): only the
        segment's starts are pinned, which cross-calibrates the anchor types, so the
        calibration — and every later pin, span and α0 loop wait — is the same whatever
        share is shed; the batches are not rebuilt (the costly part)."""
        prev = self.bracket
        self.mark_bracket(n)
        s = self.summaries.get(n)
        mode = self.mode()
        if s is None or prev is None or prev >= n or prev not in self.summaries or mode is None:
            return [], {}
        used, shed_steps = self.used, self.shed_steps
        if all(b in used or b in shed_steps for b in range(prev, n + 1)):
            return [], {}  # every step sampled (dense tracing): nothing between to pin
        if not (self._explained(prev) and self._explained(n)):
            return [], {"incomplete": n - prev - 1}
        a = 1 if mode else 0
        pins = self.starts.points(range(prev + a, n + a + 2), a)
        if shed:
            return [], {}
        batches = self._segment_batches(prev, n, self._span_steps(pins, a, prev, n))
        spans, why = pinned.spans(pins, batches, a, self.cfg.max_span_steps)
        why.pop("summary", None)
        why.pop("shed", None)
        out: list[StepObservation] = []
        for sp in spans:
            reason = self._period_reason(sp.period_ns, sp.half_ns, len(sp.batches))
            if reason:
                why[reason] = why.get(reason, 0) + len(sp.batches)
                continue
            out.append(self._span_observation(sp, s, mode))
        return out, why

    def _span_steps(self, pins: list[pinned.Pin], a: int, lo: int, hi: int) -> list[int]:
        """The batch steps in ``lo..hi`` that :func:`pinned.spans` reads for ``pins``:
        those between consecutive pins at most ``max_span_steps`` apart. At sparse step
        sampling most of a segment lies between no two pins; its batches are not built."""
        need: set[int] = set()
        for p, q in itertools.pairwise(pins):
            first, end = p.step - a, q.step - a
            if end - first <= self.cfg.max_span_steps:
                need.update(range(max(first, lo), min(end, hi + 1)))
        return sorted(need)

    def _segment_batches(
        self, prev: int, n: int, steps: list[int]
    ) -> dict[int, tuple[BatchRequest, ...] | str]:
        """The batches of ``steps`` (in ``prev..n``), or why each is unknown."""
        batches: dict[int, tuple[BatchRequest, ...] | str] = {}
        if not steps:
            return batches
        # the segment's lives once, in a fixed order: a batch's requests (and so the float
        # sums of its features) must not depend on the order the journeys arrived in
        lives = sorted(
            {
                id(life): life
                for bk in range(prev >> BUCKET_BITS, (n >> BUCKET_BITS) + 1)
                for life in self.lives.get(bk, ())
                if life.first <= n and life.last >= prev
            }.values(),
            key=_life_order,
        )
        for b in steps:
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
        return batches

    def _period_reason(self, period_ns: float, half_ns: float, k: int = 1) -> str:
        """Why the period of ``k`` consecutive batches is not used ("" when it is): one
        set of rules for a step's period and for a journey span's."""
        if period_ns <= 0:
            return "non_positive"
        if period_ns > self.cfg.max_period_ms * 1e6 * k:
            return "idle_gap"
        recent = self.recent_periods
        if len(recent) >= 16 and period_ns > self.cfg.outlier_factor * k * self._typical_period():
            # far above its neighbours: an idle gap or a stall the anchors cannot tell apart
            return "outlier_gap"
        if half_ns > self.cfg.max_uncertainty_fraction * period_ns:
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
            self._note_period(sp.period_ns)
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
        self.starts.vote_async(n)
        self.starts.vote_async(n + 1)

    def shed(self, n: int) -> None:
        """Finalize step ``n`` without building its observation (load shedding).

        Everything a built step leaves behind still happens — async-mode votes, the
        anchors' calibration against its exact start, its period among the recent ones,
        and whether its batch is observed (a later segment's spans break at it either
        way) — so what the joiner knows does not depend on the share being shed: only
        the composition and the observation itself are skipped. Calibrating only on the
        kept summaries starved it at 1 % step sampling: at a keep ratio of 0.3 no start
        was pinned, so no journey span and no α0 loop wait was decided either, and the
        published β and α0 stayed near the prior (bench learning, contention).
        """
        self.finalize(n, shed=True)

    def finalize(
        self, n: int, kv: tuple[KVTransferObservation, ...] = (), *, shed: bool = False
    ) -> StepResult:
        """Turn the summary of step ``n`` into a StepObservation (or say why not); with
        ``shed`` do the same bookkeeping but build nothing (:meth:`shed`)."""
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
            self.starts.calibrate(k, a)
        m = n + a
        lo_i, types_lo = self.starts.pin(m, a)
        hi_i, types_hi = self.starts.pin(m + 1, a)
        if lo_i is None or hi_i is None:
            return StepResult(None, "unmatched", "no_anchor")
        if lo_i[0] > lo_i[1] or hi_i[0] > hi_i[1]:
            return StepResult(None, "rejected", "inconsistent_anchors")
        mid_ns, half_ns = iv.difference(lo_i, hi_i)
        reason = self._period_reason(mid_ns, half_ns)
        if reason:
            return StepResult(None, "rejected", reason)
        half_ns += self.cfg.loop_jitter_us * 1e3
        if types_lo is None and types_hi is None:
            method = PeriodMethod.CONSECUTIVE_SUMMARIES
        elif types_lo == frozenset({COMPL}) and types_hi == frozenset({COMPL}):
            method = PeriodMethod.COMPLETION_ANCHORS
        else:
            method = PeriodMethod.JOURNEY_ANCHORS
        self._note_period(mid_ns)
        if shed:
            self.shed_steps.add(n)
            return StepResult(None, "shed", "load")
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
        if (
            comp is Composition.AGGREGATES
            and self.wait_compositions
            and self.waits.hold(obs, s, self.lives_at(n))
        ):
            return StepResult(None, "held")
        return StepResult(obs, "joined")

    def _composition(self, n: int, s: BatchSummary) -> tuple[Composition, tuple[BatchRequest, ...]]:
        snaps = self.snapshots.get(n)
        if snaps:
            reqs = from_snapshots(s, snaps)
            if reqs is not None:
                return Composition.SNAPSHOTS, reqs
        lives = self.lives.get(n >> BUCKET_BITS)
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
        for b in range(life.first >> BUCKET_BITS, (last >> BUCKET_BITS) + 1):
            self.lives.setdefault(b, []).append(life)
        if self.waits.steps:
            self.waits.add_life(life)

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
        self.wait_compositions = False  # nothing more will come for them: they leave as is
        out = sorted(n for _, n in itertools.chain(self.pending, self.pending_late))
        self.pending.clear()
        self.pending_late.clear()
        return out

    def expire(self, now_wall: int) -> None:
        """Forget step-indexed state older than the window (call after ``due``)."""
        limit = now_wall - self.window_ns
        tl = self.timeline
        if tl:
            if tl[0][0] >= limit:
                return  # nothing left the window: the horizon stays (most sweeps)
        elif not (self._tail_end and self._tail_end < limit):
            return
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
            or self.waits
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
        # the anchors below h: found through the starts they pin (an anchor of step k
        # marked k, k + 1 or k + 2 there, and marks below a purge's h go with it) when
        # those are fewer than the anchor steps held (a long window: the walk of a dict
        # visits the whole window's), else by that walk
        pins = self.pinnable
        below = pins[: bisect.bisect_left(pins, h + 2)]
        for a in self.anchors:
            if 3 * len(below) < len(a):
                for m in below:
                    for k in (m, m - 1, m - 2):
                        if k < h:
                            ts = a.pop(k, None)
                            if ts is not None:
                                self.n_anchors -= len(ts)
            else:
                for k in [k for k in a if k < h]:
                    self.n_anchors -= len(a.pop(k))
        # a start below h is pinned by nothing left (its summary and anchors are gone)
        del pins[: bisect.bisect_left(pins, h)]
        if len(self.finalized) > len(self.summaries):  # orphans (a cap dropped summaries)
            self.finalized = {n for n in self.finalized if n >= h}
        # ``pending`` is left alone: an entry whose summary is gone pops at its deadline
        # and finds nothing to finalize.
        for k in [k for k in self.snapshots if k < h]:
            del self.snapshots[k]
        self.used = {k for k in self.used if k >= h}
        self.shed_steps = {k for k in self.shed_steps if k >= h}
        self.starts.forget_below(h)
        hb = h >> BUCKET_BITS
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
            "step_waiting": len(self.waits),
        }

    def over_caps(self) -> bool:
        """Whether :meth:`enforce_caps` has anything to drop (asked on every sweep)."""
        cfg, an = self.cfg, self.anchors
        return (
            len(self.summaries) > cfg.max_steps
            or len(an[0]) + len(an[1]) + len(an[2]) > cfg.max_anchor_steps
            or len(self.snapshots) > cfg.max_steps
        )

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
