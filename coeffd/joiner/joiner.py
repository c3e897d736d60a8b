"""The sliding-window joiner: event records in, training observations out.

Length: the one entry point whose routing, window bounds, lateness and outcome counts
must be read together (each record kind is one short method; the state lives in
:mod:`.engine` and :mod:`.requests`).

Single-threaded by design: the daemon's one pipeline consumer calls :meth:`Joiner.push`
(or :meth:`Joiner.push_many`) for every record, :meth:`Joiner.tick` on a timer, and
:meth:`Joiner.flush` at shutdown. Nothing here blocks or does I/O except one structured
log line per window summary.

Bounded: every partial join lives at most ``window_s`` of its emitting process's wall
clock (a watermark per source: the max ``wall_ns`` seen from it) and at most the
configured number of entries; what expires is dropped and counted by reason.

Each source's watermark moves with that source's own data only, so a backlog (the OTel
SDK's retries, the Collector's sending queue after an outage, a replica's held streams)
is joined as it would have been live, however long after the fact it arrives. The
receiver's clock (:meth:`Joiner.tick`) only finishes sources that fell idle: from the
first tick after a source's data last advanced, its clock runs on with the receiver's,
so what an idle source still holds completes ``window_s`` later, as before; its data
watermark is untouched, so a backlog it sends later is not late. A span more than
``max_lateness_s`` behind its source's newest data is counted as ``late``, not joined.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec
import structlog
from prometheus_client import CollectorRegistry

from coeffd.joiner import kv as kvmod
from coeffd.joiner.config import JoinerConfig
from coeffd.joiner.engine import EngineState, LoopWait
from coeffd.joiner.metrics import JoinerMetrics
from coeffd.joiner.requests import CoreState, EntryKey, RequestEntry, build_observation
from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    KVTransfer,
    Record,
    RequestSnapshot,
    RequestSpan,
    Source,
    SpanInfo,
    StepSpan,
)
from coeffd.records.observations import KVTransferObservation, Observation

log = structlog.get_logger(__name__)

SpanKey = tuple[bytes, bytes]
_SWEEP_NS = 200_000_000  # sweep due work at most every 200 ms of data time
_GAUGE_NS = 5_000_000_000  # refresh window gauges every 5 s of data time
_TERMINAL = (ApiKind.DEPARTED, ApiKind.ABORTED)
_DEPARTED, _ABORTED = _TERMINAL
_EVICT_SHARE = 16  # at max_engines, the stalest 1/16 of the cap is forgotten at once
_QUEUED, _SCHEDULED = JourneyKind.QUEUED, JourneyKind.SCHEDULED
_FIRST_TOKEN, _FINISHED = JourneyKind.FIRST_TOKEN, JourneyKind.FINISHED


def _by_watermark(e: EngineState) -> int:
    return e.watermark


def _by_seq(e: EngineState) -> int:
    return e.seq


_UNSWEPT = object()  # the receiver clock of no sweep yet


class StepShedding(Protocol):
    """What the joiner asks about load: the daemon's load controller
    (:class:`~coeffd.daemon.load.LoadController`) implements it and is handed to the
    joiner, which never imports the daemon."""

    @property
    def step_filter(self) -> Callable[[int], bool] | None:
        """None while every step is built; else False for the steps to shed."""

    def shed(self, kind: str, n: int) -> None:
        """Tally: ``n`` observations of ``kind`` (``step``) were shed."""


class Joiner:
    """Sliding-window join of journeys, step summaries and KV transfers.

    >>> j = Joiner()
    >>> j.push_many([]) == [] and j.flush() == []
    True
    >>> j.entries()["request"]
    0
    """

    def __init__(
        self,
        config: JoinerConfig | None = None,
        metrics: JoinerMetrics | CollectorRegistry | None = None,
        load: StepShedding | None = None,
    ) -> None:
        self.cfg = config if config is not None else JoinerConfig()
        if isinstance(metrics, JoinerMetrics):
            self.metrics = metrics
        else:
            self.metrics = JoinerMetrics(metrics)
        self._window_ns = int(self.cfg.window_s * 1e9)
        self._lateness_ns = int(max(self.cfg.max_lateness_s, self.cfg.window_s) * 1e9)
        # replay (no receiver clock): an engine not heard from while the fleet's data ran
        # this far on is gone. Two windows were too few: bench closedloop's engine core
        # (simulated time ~10x real, its exporter queued behind the API server's) paused
        # while the API server's data ran 65 s on, and was forgotten mid-stream in 10 runs
        # of 17, ~3,100 steps leaving with their totals; max_lateness_s is what the data may
        # lag anyway, and what a live engine is given on its own clock
        self._forget_ns = max(2 * self._window_ns, self._lateness_ns)
        # how long past its deadline a half-joined request may wait for a stalled peer
        # (:meth:`_park`): up to max_lateness_s of its own clock in all
        self._park_ns = self._lateness_ns - self._window_ns
        self._wait_delay_ns = int(min(self.cfg.loop_wait_delay_s, 0.9 * self.cfg.window_s) * 1e9)
        self._tol_ns = self.cfg.same_host_tolerance_us * 1e3
        self._engines: dict[str, EngineState] = {}
        self._wm: dict[str, int] = {}  # watermark (max wall ns) per source id
        # Live ticks: per source, (its watermark, the receiver's clock at the first tick
        # that saw it): while the watermark stays, the source is idle since that tick.
        self._heard: dict[str, tuple[int, int]] = {}
        self._now: int | None = None  # the receiver's clock at the last live tick
        self._max_wall = 0
        self._last_sweep = 0
        self._last_log = 0
        self._last_gauges = 0
        self._logged: Counter[tuple[str, str, str]] = Counter()
        self._requests: dict[EntryKey, RequestEntry] = {}
        self._req_heap: list[tuple[int, EntryKey, str]] = []  # (deadline, key, clock src)
        # The sources each source's requests were joined with (an API server's engines,
        # an engine's API servers): a half-joined request at its deadline waits on while
        # one of them is behind it (its exporter stalled), in a heap per such source of
        # (deadline, key, own source), up to max_lateness_s of its own clock.
        self._peers: dict[str, set[str]] = {}
        self._parked: dict[str, list[tuple[int, EntryKey, str]]] = {}
        self._done: dict[SpanKey, int] = {}  # tombstones: span key -> forget after (wall)
        # Complete requests waiting for queue-state finality, per engine: a heap of
        # (QUEUED step, key). Only new coverage of that engine reaching the QUEUED step can
        # make one final, so a boundary rechecks just those (not every waiter: that was
        # a fifth of the daemon's time under load).
        self._ready: dict[str, list[tuple[int, EntryKey]]] = {}
        self._ready_keys: set[tuple[str, EntryKey]] = set()
        self._skip_span: SpanKey | None = None  # events of a duplicate span being skipped
        # the span whose events are arriving now (they follow their span record)
        self._cur: tuple[SpanKey, RequestEntry, CoreState | None, EngineState | None] | None = None
        # the same span's SpanInfo, and its core (None for an API span) and engine: the
        # decoders share one SpanInfo among a span's records, so its events find their
        # span by identity, without a key built and compared per event (_set_cur)
        self._cur_si: SpanInfo | None = None  # reset with _cur
        self._cur_core: CoreState | None = None
        self._cur_eng: EngineState | None = None
        self._pending_cov: list[tuple[EngineState, int, int]] = []
        # Engines whose data, watermark or held work changed since the sweep visited
        # them (every path that feeds an engine adds it): between two ticks, the sweeps
        # visit only these, since what another engine holds is due by a watermark that
        # has not moved since its last visit, which left nothing due at it. A tick moves
        # the receiver's clock, and every engine's clock with it: it visits them all.
        self._dirty: set[EngineState] = set()
        self._swept_now: object = _UNSWEPT  # the receiver clock of the last sweep
        self._seq = 0  # engines' visiting order: that of self._engines (EngineState.seq)
        # replay (no receiver clock): (heard_at, n, engine) of visited engines, lowest
        # first: an engine not heard from while the fleet's data ran _forget_ns on is
        # gone, and that moves with the fleet's data, not its own (stale entries are
        # pushed again)
        self._heard_heap: list[tuple[int, int, EngineState]] = []
        self._pushes = 0
        #: Load shedding: steps its ``step_filter`` rejects are finalized without an
        #: observation, counted as outcome ``shed`` and reported to it; so are summaries
        #: the decoder already read partially (``BatchSummary.partial``).
        self.load = load
        self._n_shed = 0
        self._kv_open: dict[kvmod.TransferKey, KVTransfer] = {}
        self._kv_done: dict[tuple[bool, kvmod.TransferKey], int] = {}
        self._kv_early: dict[kvmod.TransferKey, KVTransfer] = {}  # completed, not initiated
        self._kv_link: dict[tuple[str, int], str] = {}
        self._restarts: dict[str, list[int]] = {}  # per engine held: recent restarts
        #: Passes that forgot engines at ``max_engines`` (each forgets a 16th of the cap).
        self.evictions = 0
        self._kv_sources: dict[tuple[str, int], Source] = {}
        self._kv_steps: dict[tuple[str, int], dict[int, list[KVTransferObservation]]] = {}
        self._out: list[Observation] = []
        self._dispatch: dict[type, Callable[[Any], None]] = {
            JourneyEvent: self._on_journey,
            ApiEvent: self._on_api_event,
            BatchSummary: self._on_summary,
            RequestSnapshot: self._on_snapshot,
            CoreSpan: self._on_core_span,
            RequestSpan: self._on_request_span,
            StepSpan: self._on_step_span,
            KVTransfer: self._on_kv_transfer,
        }

    # ================================================================= public API

    def push(self, record: Record) -> list[Observation]:
        """Feed one record; returns the observations it completed (often none)."""
        h = self._dispatch.get(type(record))
        if h is not None:
            h(record)
        if self._max_wall - self._last_sweep >= _SWEEP_NS:
            self._sweep(None)
        if self._out:
            return self._take()
        return []

    def push_many(self, records: Iterable[Record]) -> list[Observation]:
        """Feed a batch (e.g. one decoded export request); the batch end is a boundary."""
        d = self._dispatch
        for r in records:
            h = d.get(type(r))
            if h is not None:
                h(r)
        self._boundary()
        if self._max_wall - self._last_sweep >= _SWEEP_NS:
            self._sweep(None)
        return self._take()

    def tick(self, now_wall_ns: int | None = None) -> list[Observation]:
        """Finalize what is due. ``now_wall_ns`` (the receiver's wall clock, e.g.
        ``time.time_ns()`` when live) finishes idle sources: one whose data has not
        advanced since an earlier tick is taken to have run on with this clock, so an
        idle engine's last steps and requests still complete. A source whose data
        advanced since the last tick keeps its own data's clock (a backlog)."""
        self._boundary()
        if now_wall_ns is not None:
            self._advance_clock(now_wall_ns)
        self._sweep(now_wall_ns)
        return self._take()

    def flush(self) -> list[Observation]:
        """End of stream: finalize everything still held and clear the window."""
        self._boundary()
        for eng in self._engines.values():
            for n in eng.drain_all():
                self._finalize_step(eng, n)
            if eng.waits:
                eng.waits.release_all()
                self._emit_waited(eng)
        for key in list(self._requests):
            self._expire_request(key)
        for eng in self._engines.values():
            for item in eng.due_loop_waits(None):
                self._emit_loop_wait(eng, item)
        self._req_heap.clear()
        self._parked.clear()
        self._ready.clear()
        self._ready_keys.clear()
        if self._kv_open:
            self.metrics.outcome("kv_transfer", "expired", "no_completion", len(self._kv_open))
        if self._kv_early:
            self.metrics.outcome("kv_transfer", "unmatched", "no_initiation", len(self._kv_early))
        self._kv_open.clear()
        self._kv_early.clear()
        self._kv_done.clear()
        self._done.clear()
        self._engines.clear()
        self._dirty.clear()
        self._heard_heap.clear()
        self._kv_steps.clear()
        self._count_shed()
        self._update_gauges()
        self._log_summary(force=True)
        return self._take()

    def entries(self) -> dict[str, int]:
        """Current window occupancy by kind (what the gauge shows)."""
        e: Counter[str] = Counter()
        for eng in self._engines.values():
            e.update(eng.entries())
        e["request"] = len(self._requests)
        e["tombstone"] = len(self._done)
        e["kv_open"] = len(self._kv_open) + len(self._kv_early)
        e["kv_done"] = len(self._kv_done)
        e["kv_by_step"] = sum(len(v) for d in self._kv_steps.values() for v in d.values())
        e["engine"] = len(self._engines)
        return dict(e)

    # ================================================================= plumbing

    def _see(self, source: Source, wall_ns: int) -> None:
        sid = source.id
        if wall_ns > self._max_wall:
            self._max_wall = wall_ns
        if wall_ns > self._wm.get(sid, 0):
            self._wm[sid] = wall_ns
            eng = self._engines.get(sid)
            if eng is not None:
                self._dirty.add(eng)  # its watermark moved
                if wall_ns > eng.touched:
                    eng.touched = wall_ns  # (a live tick moves _wm, never this)
                eng.heard_at = self._max_wall

    def _engine(self, source: Source) -> EngineState:
        eng = self._engines.get(source.id)
        if eng is None:
            if len(self._engines) >= self.cfg.max_engines:
                self._evict_engines()
            eng = self._engines[source.id] = EngineState(source, self.cfg)
            eng.touched = self._wm.get(source.id, 0)  # _see ran for the record creating it
            eng.heard_at = self._max_wall
            eng.seq = self._seq
            self._seq += 1
            self._dirty.add(eng)
        return eng

    def _evict_engines(self) -> None:
        """At ``max_engines``: forget the engines heard from longest ago, a sixteenth of
        the cap at once. One pass over the engines finds them, so a fleet with more live
        identities than the cap costs a pass per cap/16 new engines, not one per new
        engine (a pass per engine made every span of a thrashing fleet O(engines))."""
        self.evictions += 1
        k = max(1, self.cfg.max_engines // _EVICT_SHARE)
        for oldest in heapq.nsmallest(k, self._engines.values(), key=_by_watermark):
            for _ in oldest.drain_all():
                self.metrics.outcome("step", "expired", "engine_capacity")
            if oldest.waits:  # built already: they leave with their totals
                oldest.waits.release_all()
                self._emit_waited(oldest)
            sid = oldest.source.id
            del self._engines[sid]
            self._restarts.pop(sid, None)

    def _late(self, source: Source, wall_ns: int) -> bool:
        """Too far behind its source's own data to be joined (``max_lateness_s``)."""
        return wall_ns < self._wm.get(source.id, 0) - self._lateness_ns

    def _advance_clock(self, now: int) -> None:
        """Note, per source, the first tick that saw its current watermark; forget
        sources idle for ``max_lateness_s`` that hold nothing (memory follows the sources
        that still send)."""
        self._now = now
        heard = self._heard
        for sid, wm in self._wm.items():
            h = heard.get(sid)
            if h is None or h[0] != wm:
                heard[sid] = (wm, now)
        if len(heard) > len(self._engines) + 64:
            for sid in [
                sid
                for sid, (_, t) in heard.items()
                if t < now - self._lateness_ns and sid not in self._engines
            ]:
                del heard[sid]
                self._wm.pop(sid, None)

    def _clock(self, sid: str) -> int:
        """A source's clock for finishing its partial joins: its data's watermark, run
        on with the receiver's clock since the tick that last found it advanced."""
        wm = self._wm.get(sid, 0)
        now = self._now
        if now is None:
            return wm
        h = self._heard.get(sid)
        if h is None or h[0] != wm or now <= h[1]:
            return wm
        return wm + (now - h[1])

    def _forget_at(self, wall_ns: int) -> int:
        """When a tombstone made now may go: a window after ``wall_ns`` and at least a
        window of the newest data (a backlog's redeliveries come on the fleet's time)."""
        return max(wall_ns, self._max_wall) + self._window_ns

    def _take(self) -> list[Observation]:
        """Hand out the observations built so far (and count steps shed meanwhile)."""
        self._count_shed()
        out, self._out = self._out, []
        return out

    def _count_shed(self) -> None:
        if self._n_shed:
            self.metrics.outcome("step", "shed", "load", self._n_shed)
            if self.load is not None:
                self.load.shed("step", self._n_shed)
            self._n_shed = 0

    def _boundary(self) -> None:
        """The events of the previous span are all in: apply coverage, recheck waiters."""
        if not self._pending_cov:
            return
        touched: dict[str, EngineState] = {}
        for eng, a, b in self._pending_cov:
            eng.add_coverage(a, b)
            touched[eng.source.id] = eng
        self._pending_cov.clear()
        # only new coverage can make a waiting queue state final, and only for QUEUED
        # steps at or below the engine's covered end
        for sid, eng in touched.items():
            heap = self._ready.get(sid)
            if not heap:
                continue
            top = eng.coverage[-1][1] if eng.coverage else -1
            due = []
            while heap and heap[0][0] <= top:
                due.append(heapq.heappop(heap))
            for _, key in due:
                if (sid, key) not in self._ready_keys:
                    continue  # closed or expired since it was queued here
                self._ready_keys.discard((sid, key))
                entry = self._requests.get(key)
                if entry is not None:
                    self._try_emit(entry)  # queues it again if still not final

    # ================================================================= handlers

    def _on_request_span(self, r: RequestSpan) -> None:
        if self._pending_cov:  # _boundary()'s first test inline (once per span)
            self._boundary()
        self._cur = self._cur_si = self._cur_core = None
        si = r.span
        key = (si.trace_id, si.span_id)
        self._see(si.source, si.end_wall_ns)
        if key in self._done:
            self._skip_span = key
            self.metrics.outcome("request", "duplicate")
            return
        entry = self._requests.get(key)
        if entry is not None and entry.api is not None:
            self._skip_span = key
            self.metrics.outcome("request", "duplicate")
            return
        self._skip_span = None
        if entry is None:
            if self._late(si.source, si.end_wall_ns):
                self._skip_span = key
                self.metrics.outcome("request", "late", "api_span")
                return
            entry = self._new_entry(key, si.end_wall_ns, si.source.id)
        entry.api = r
        self._cur = (key, entry, None, None)
        self._cur_si, self._cur_core, self._cur_eng = si, None, None
        ev = entry.api_events  # _try_emit's first test here: its API events mostly follow
        if _DEPARTED in ev or _ABORTED in ev:
            self._try_emit(entry)

    def _on_api_event(self, ev: ApiEvent) -> None:
        si = ev.span
        cur = self._cur
        if si is self._cur_si and cur is not None:
            # the common case: events right after their span (already seen, not a duplicate)
            entry = cur[1]
        else:
            key = (si.trace_id, si.span_id)
            if cur is not None and cur[0] == key:
                entry = cur[1]  # the span's, with a SpanInfo of its own
            else:
                if key == self._skip_span or key in self._done:
                    return
                self._see(si.source, ev.wall_ns)
                entry = self._requests.get(key) or self._new_entry(
                    key, si.end_wall_ns, si.source.id
                )
        kind = ev.kind
        if kind not in entry.api_events:
            entry.api_events[kind] = ev
            if kind in _TERMINAL and entry.api is not None and entry.cores:
                self._try_emit(entry)

    def _on_core_span(self, r: CoreSpan) -> None:
        if self._pending_cov:  # _boundary()'s first test inline (once per span)
            self._boundary()
        self._cur = self._cur_si = self._cur_core = None
        si = r.span
        skey = (si.trace_id, si.span_id)
        self._see(si.source, si.end_wall_ns)
        eng = self._engines.get(si.source.id) or self._engine(si.source)
        if skey in self._done:
            self._skip_span = skey
            self.metrics.outcome("request", "duplicate")
            return
        key = (si.trace_id, si.parent_span_id)
        entry = self._requests.get(key)
        core = entry.cores.get(si.span_id) if entry is not None else None
        if core is not None and core.span is not None:
            self._skip_span = skey
            self.metrics.outcome("request", "duplicate")
            return
        self._skip_span = None
        if entry is None:
            if self._late(si.source, si.end_wall_ns):
                self._skip_span = skey
                self.metrics.outcome("request", "late", "core_span")
                return
            entry = self._new_entry(key, si.end_wall_ns, si.source.id)
        if core is None:
            core = entry.cores[si.span_id] = CoreState()
        core.span = r
        self._dirty.add(eng)  # its journey events follow
        self._cur = (skey, entry, core, eng)
        self._cur_si, self._cur_core, self._cur_eng = si, core, eng
        # _try_emit's first test here: a core span's FINISHED follows it, so most stop
        ev = entry.api_events
        if entry.api is not None and (_DEPARTED in ev or _ABORTED in ev):
            self._try_emit(entry)

    def _on_journey(self, ev: JourneyEvent) -> None:
        si = ev.span
        core = self._cur_core
        if si is self._cur_si and core is not None:
            # the common case: events right after their span record
            eng, entry = self._cur_eng, None  # (the entry is needed once: FINISHED)
            assert eng is not None
        else:
            skey = (si.trace_id, si.span_id)
            cur = self._cur
            if cur is not None and cur[0] == skey:
                _, entry, core, eng = cur
                assert core is not None and eng is not None
            else:
                if skey == self._skip_span or skey in self._done:
                    return
                self._see(si.source, ev.wall_ns)
                eng = self._engines.get(si.source.id) or self._engine(si.source)
                self._dirty.add(eng)
                key = (si.trace_id, si.parent_span_id)
                entry = self._requests.get(key) or self._new_entry(
                    key, si.end_wall_ns, si.source.id
                )
                core = entry.cores.get(si.span_id)
                if core is None:
                    core = entry.cores[si.span_id] = CoreState()
        # core.add(ev), inlined (once per journey event): False for a duplicate
        kind = ev.kind
        if ev.num_preemptions > core.max_preemptions:
            core.max_preemptions = ev.num_preemptions
        if kind is _QUEUED:
            if core.queued is not None:
                return
            core.queued = ev
        elif kind is _SCHEDULED:
            if ev.schedule_kind != "RESUME":
                if core.scheduled_first is not None:
                    return
                core.scheduled_first = ev
        elif kind is _FIRST_TOKEN:
            if core.first_token is not None:
                return
            core.first_token = ev
        elif kind is _FINISHED:
            if core.finished is not None:
                return
            core.finished = ev
            eng.add_anchor(ev)
            eng.add_life(core.scheduled_first, core.first_token, ev, core.max_preemptions)
            if eng.waits.released:
                self._emit_waited(eng)
            if entry is None:
                assert self._cur is not None
                entry = self._cur[1]
            api_ev = entry.api_events  # _try_emit's first test here (the API half may trail)
            if entry.api is not None and (_DEPARTED in api_ev or _ABORTED in api_ev):
                self._try_emit(entry)
            return
        eng.add_anchor(ev)

    def _on_step_span(self, r: StepSpan) -> None:
        if self._pending_cov:  # _boundary()'s first test inline (once per span)
            self._boundary()
        self._cur = self._cur_si = self._cur_core = None
        si = r.span
        self._see(si.source, si.end_wall_ns)
        eng = self._engine(si.source)
        eng.see(si.end_wall_ns)
        self._dirty.add(eng)
        skey = (si.trace_id, si.span_id)
        if skey in self._done:
            self.metrics.outcome("step", "duplicate", "step_span")
            return
        self._done[skey] = self._forget_at(si.end_wall_ns)
        if r.range_end is not None and si.dropped_events == 0:
            # only a span that lost no events proves that its range's summaries are all here
            self._pending_cov.append((eng, r.range_start, r.range_end))

    def _on_summary(self, s: BatchSummary) -> None:
        si = s.span
        self._see(si.source, s.wall_ns)
        eng = self._engines.get(si.source.id) or self._engine(si.source)
        if eng.is_restart(s):
            eng = self._restart(eng, s.wall_ns)
        self._dirty.add(eng)
        res = eng.add_summary(s)
        if res != "ok":
            self.metrics.outcome("step", res, "summary")

    def _restart(self, eng: EngineState, wall_ns: int) -> EngineState:
        """The engine restarted under the same identity (step ids start again at 1).
        Finish what the old incarnation left and start anew; restarts that keep coming
        mean two live engines behind one identity, whose steps cannot be told apart."""
        self._finish_engine(eng)
        sid = eng.source.id
        recent = [t for t in self._restarts.get(sid, []) if t > wall_ns - self._window_ns]
        recent.append(wall_ns)
        self._restarts[sid] = recent
        log.info("joiner: engine restart detected", source=sid, max_step=eng.max_step)
        new = self._engines[sid] = EngineState(eng.source, self.cfg)
        new.seq = eng.seq  # the same key: its place in self._engines stays
        self._dirty.add(new)
        if len(recent) >= 3 or eng.ambiguous:
            new.ambiguous = True
        self._kv_link = {k: v for k, v in self._kv_link.items() if v != eng.source.id}
        return new

    def _on_snapshot(self, s: RequestSnapshot) -> None:
        si = s.span
        eng = self._engines.get(si.source.id) or self._engine(si.source)
        self._dirty.add(eng)
        eng.add_snapshot(s)

    def _on_kv_transfer(self, t: KVTransfer) -> None:
        b = t.batch
        self._see(b.source, b.wall_ns)
        key = kvmod.transfer_key(t)
        dkey = (t.completed, key)
        if dkey in self._kv_done:
            self.metrics.outcome("kv_transfer", "duplicate")
            return
        if not t.completed:
            if key in self._kv_open:
                self.metrics.outcome("kv_transfer", "duplicate")
                return
            if len(self._kv_open) >= self.cfg.max_kv_transfers:
                old = next(iter(self._kv_open))
                del self._kv_open[old]
                self.metrics.outcome("kv_transfer", "expired", "capacity")
            self._kv_done[dkey] = self._forget_at(b.wall_ns)
            early = self._kv_early.pop(key, None)
            if early is not None:
                self._pair_kv(t, early)
                return
            self._kv_open[key] = t
            return
        self._kv_done[dkey] = self._forget_at(b.wall_ns)
        init = self._kv_open.pop(key, None)
        if init is None:
            # completion first (out-of-order delivery): wait for the initiation
            self._kv_early[key] = t
            return
        self._pair_kv(init, t)

    def _pair_kv(self, init: KVTransfer, done: KVTransfer) -> None:
        obs = kvmod.pair(init, done)
        if obs.duration_us < 0:
            self.metrics.outcome("kv_transfer", "rejected", "negative_duration")
            return
        self._emit_kv(obs, init.batch.source, init.batch.dp_rank)

    # ================================================================= requests

    def _new_entry(self, key: EntryKey, wall_ns: int, clock: str) -> RequestEntry:
        if len(self._requests) >= self.cfg.max_requests:
            old = next(iter(self._requests))
            self._expire_request(old, reason="capacity")
        # a span behind its source's newest data by more than the window (yet within
        # max_lateness_s) gets a window of the source's time to meet its other parts
        entry = RequestEntry(
            key=key,
            deadline_wall=max(wall_ns, self._wm.get(clock, 0) - self._window_ns) + self._window_ns,
        )
        self._requests[key] = entry
        heapq.heappush(self._req_heap, (entry.deadline_wall, key, clock))
        return entry

    def _try_emit(self, entry: RequestEntry) -> None:
        """Emit the observation of every finished core whose queue state is final."""
        ev = entry.api_events  # entry.api_done(), inlined: most calls stop here
        if entry.api is None or (_DEPARTED not in ev and _ABORTED not in ev):
            return
        engines = self._engines
        for core in entry.cores.values():
            if core.emitted or core.finished is None or core.span is None:
                continue
            eng = engines.get(core.span.span.source.id)
            if eng is None:
                continue
            qs, final = (None, True)
            if core.queued is not None:
                qs, final = eng.queue_state(core.queued.step, True)
            if not final:
                self._wait_for_coverage(eng.source.id, core.queued.step, entry.key)  # type: ignore[union-attr]
                continue
            self._emit_request(entry, core, eng.source, qs)
        cores = entry.cores
        n = entry.api.n  # the cores expected: n when n > 1, else one (entry.api is set)
        if len(cores) >= (n if n is not None and n > 1 else 1):
            for c in cores.values():
                if not c.emitted:
                    return
            self._close_entry(entry)

    def _wait_for_coverage(self, sid: str, step: int, key: EntryKey) -> None:
        if (sid, key) not in self._ready_keys:
            self._ready_keys.add((sid, key))
            heapq.heappush(self._ready.setdefault(sid, []), (step, key))

    def _emit_request(self, entry: RequestEntry, core: CoreState, src: Source, qs: Any) -> None:
        core.emitted = True
        obs, reason = build_observation(entry, core, src, qs, self._tol_ns)
        if obs is None:
            self.metrics.outcome("request", "rejected", reason)
            return
        api = entry.api
        if api is not None:  # (always: both sides are in) the pair is known in one lookup
            peers = self._peers.get(src.id)
            if peers is None or api.span.source.id not in peers:
                self._note_peers(api.span.source.id, src.id)
        eng = self._engines.get(src.id)
        q = core.queued
        if eng is not None and q is not None:
            # the loop wait is decided loop_wait_delay_s after the QUEUED (see
            # EngineState.loop_wait): late enough for the journeys around it to be in,
            # early enough for the steps they pin to be still held
            deadline = q.wall_ns + self._wait_delay_ns
            over = eng.defer_loop_wait(LoopWait(deadline, obs, q.mono_ns, q.step))
            self._dirty.add(eng)
            if over is not None:
                self._emit_loop_wait(eng, over, "capacity")
            return
        self._out.append(obs)
        self.metrics.emitted("request")

    def _emit_loop_wait(self, eng: EngineState, item: LoopWait, forced: str = "") -> None:
        obs = item.obs
        wait, how = (
            (None, forced) if forced else eng.loop_wait(item.queued_mono_ns, item.queued_step)
        )
        self.metrics.loop_waits[how] += 1
        if wait is not None:
            obs = msgspec.structs.replace(obs, queued_loop_wait_us=wait / 1e3)
        self._out.append(obs)
        self.metrics.emitted("request")

    def _close_entry(self, entry: RequestEntry) -> None:
        """Forget a request; remember its span keys to recognise redeliveries."""
        self._requests.pop(entry.key, None)
        for core in entry.cores.values():
            if core.span is not None:
                self._ready_keys.discard((core.span.span.source.id, entry.key))
        self._cur = self._cur_si = self._cur_core = (
            None  # later events of its spans are redeliveries
        )
        forget = self._forget_at(entry.deadline_wall)
        self._done[entry.key] = forget
        tid = entry.key[0]
        for sid in entry.cores:
            self._done[(tid, sid)] = forget

    def _expire_request(self, key: EntryKey, reason: str = "") -> None:
        entry = self._requests.get(key)
        if entry is None:
            return
        for core in entry.cores.values():
            if core.emitted:
                continue
            if core.span is not None and entry.api is not None and core.queued is not None:
                eng = self._engines.get(core.span.span.source.id)
                if eng is not None:
                    qs, _ = eng.queue_state(core.queued.step)
                    self._emit_request(entry, core, eng.source, qs)
                    continue
            why = reason or (
                "no_api_span"
                if entry.api is None
                else "no_core_span"
                if core.span is None
                else "no_queued"
            )
            core.emitted = True
            self.metrics.outcome("request", "expired", why)
        if not entry.cores:
            self.metrics.outcome("request", "expired", reason or "no_core_span")
        self._close_entry(entry)

    # ================================================================= steps / kv

    def _finalize_step(self, eng: EngineState, n: int) -> None:
        s = eng.summaries.get(n)
        if s is None or n in eng.finalized:
            return
        keep = self.load.step_filter if self.load is not None else None
        if s.partial or (keep is not None and not keep(n)):
            # Shed before the join work: pinning and composing a step costs several times
            # what learning it does, so shedding only at the learner saved too little.
            # The segment ending at a shed summary is shed with it (its spans are not
            # built), but both leave the same bookkeeping as when kept (EngineState.shed).
            eng.shed(n)
            eng.journey_spans(n, shed=True)
            self._n_shed += 1  # tallied in bulk (_count_shed): per-step tallies cost 6 %
            return
        res = eng.finalize(n, self._kv_for_step(eng, n) if self._kv_steps else ())
        if res.observation is not None:
            self._out.append(res.observation)
            self.metrics.emitted("step")
        elif res.outcome != "held":  # a held step is counted when it leaves
            self.metrics.outcome("step", res.outcome, res.reason)
        if eng.waits.released:  # the cap let the oldest held step go
            self._emit_waited(eng)
        spans, why = eng.journey_spans(n)
        if spans:
            self._out.extend(spans)
            self.metrics.emitted("step", len(spans))
            self.metrics.journey_steps["joined"] += sum(1 + len(o.more_batches) for o in spans)
        for reason, k in why.items():
            self.metrics.journey_steps[reason] += k

    def _emit_waited(self, eng: EngineState) -> None:
        """Emit the step observations that stopped waiting for journeys (:mod:`.waits`)."""
        released = eng.waits.released
        tally = self.metrics.composition_waits
        for obs, how in released:
            self._out.append(obs)
            tally[how] += 1
        self.metrics.emitted("step", len(released))
        released.clear()

    def _emit_kv(self, obs: KVTransferObservation, src: Source, dp_rank: int) -> None:
        self._out.append(obs)
        self.metrics.emitted("kv_transfer")
        if obs.step is None:
            return
        ks = (src.id, dp_rank)
        self._kv_sources[ks] = src
        self._kv_steps.setdefault(ks, {}).setdefault(obs.step, []).append(obs)

    def _kv_for_step(self, eng: EngineState, n: int) -> tuple[KVTransferObservation, ...]:
        """Transfers issued in step ``n`` by the KV streams linked to this engine.

        Resolved at finalization, not on arrival: KV batches arrive in near real time,
        often before the engine's first span, so the link is only knowable later.
        """
        found: list[KVTransferObservation] = []
        for ks, by_step in self._kv_steps.items():
            lst = by_step.get(n)
            if lst and self._kv_engine(self._kv_sources[ks], ks[1]) is eng:
                found.extend(lst)
        return tuple(sorted(found, key=lambda o: (o.dp_rank, o.transfer_id)))

    def _kv_engine(self, src: Source, dp_rank: int) -> EngineState | None:
        """The EngineCore a KV publisher belongs to: same source id, else a shared
        resource key (``kv_link_keys``) and DP rank, else the only engine there is."""
        lk = (src.id, dp_rank)
        sid = self._kv_link.get(lk)
        if sid is not None and sid in self._engines:
            return self._engines[sid]
        found: EngineState | None = self._engines.get(src.id)
        if found is None:
            for key in self.cfg.kv_link_keys:
                v = src.get(key)
                if v is None:
                    continue
                cands = [
                    e
                    for e in self._engines.values()
                    if e.source.get(key) == v
                    and e.source.get("coeffd.dp_rank", dp_rank) in (dp_rank, str(dp_rank))
                ]
                if len(cands) == 1:
                    found = cands[0]
                    break
        if found is not None:
            self._kv_link[lk] = found.source.id
            return found
        if len(self._engines) == 1:  # not cached: another engine may still show up
            return next(iter(self._engines.values()))
        return None

    def _purge_kv_steps(self) -> None:
        """Forget per-step transfers of steps the linked engine has already passed."""
        for ks, by_step in list(self._kv_steps.items()):
            eng = self._kv_engine(self._kv_sources[ks], ks[1])
            if eng is not None:
                h = eng.horizon
                for n in [n for n in by_step if n < h]:
                    del by_step[n]
            cap = self.cfg.max_kv_transfers
            if len(by_step) > cap:
                for n in sorted(by_step)[: len(by_step) - cap]:
                    del by_step[n]
            if not by_step:
                del self._kv_steps[ks]

    # ================================================================= window

    def _sweep(self, now: int | None) -> None:
        """Finalize due steps and requests, expire state, enforce caps."""
        if now is not None and now > self._max_wall:
            self._max_wall = now
        self._last_sweep = self._max_wall
        now = self._now
        live = now is not None
        gone: list[str] = []
        wmap, heard = self._wm, self._heard
        silent_lag = self._window_ns - self._lateness_ns
        stale = self._max_wall - self._forget_ns
        window = self._window_ns  # every engine's window_ns (the same config)
        max_steps, max_anchor_steps = self.cfg.max_steps, self.cfg.max_anchor_steps
        engines, theap = self._engines, self._heard_heap
        if now != self._swept_now:
            # the receiver's clock moved (a tick): every engine's clock may have
            self._swept_now = now
            visit = list(engines.values())
        else:
            # only the engines fed since their last visit (self._dirty), and in replay
            # the ones the fleet's data left _forget_ns behind; in self._engines' order,
            # as a visit of every engine would take them
            todo = {e for e in self._dirty if engines.get(e.source.id) is e}
            while theap and theap[0][0] < stale:
                _, _, e = heapq.heappop(theap)
                if engines.get(e.source.id) is e:
                    if e.heard_at < stale:
                        todo.add(e)
                    else:  # heard since: its place in the heap moved
                        self._pushes += 1
                        heapq.heappush(theap, (e.heard_at, self._pushes, e))
            visit = sorted(todo, key=_by_seq)
        self._dirty.clear()
        # Each step below is asked first by a comparison inline (what is due is at the
        # head of its queue), so an idle visit costs no calls. At 1,000 engines the calls
        # were a sixth of the joiner's time.
        for eng in visit:
            sid = eng.source.id
            w = wmap.get(sid, 0)  # its data's watermark, never the clock's
            if w > eng.watermark:
                eng.watermark = w
            wm = eng.watermark
            if now is not None:  # max(wm, self._clock(sid)), inlined
                h = heard.get(sid)
                if h is not None and h[0] == w and now > h[1]:
                    wm = max(wm, w + (now - h[1]))
            pend, late = eng.pending, eng.pending_late
            if (pend and pend[0][0] <= wm) or (late and late[0][0] <= wm):
                for n in eng.due(wm):
                    self._finalize_step(eng, n)
            cw = eng.waits.heap
            if cw and cw[0][0] <= wm:
                eng.waits.due(wm)
                self._emit_waited(eng)
            lw = eng.loop_waits  # lw.due_by(wm), inlined
            fifo, lwl = lw._fifo, lw._late
            if (fifo and fifo[0].deadline_wall <= wm) or (lwl and lwl[0][0] <= wm):
                for item in eng.due_loop_waits(wm):
                    self._emit_loop_wait(eng, item)
            # eng.expire(wm) only when something left the window (its first test)
            tl, limit = eng.timeline, wm - window
            te = eng._tail_end
            if (tl[0][0] < limit) if tl else (te and te < limit):
                eng.expire(wm)
            if not live:
                self._pushes += 1
                heapq.heappush(theap, (eng.heard_at, self._pushes, eng))
            # replay (no receiver clock): an engine not heard from while the fleet's data
            # ran max_lateness_s on is gone (one whose data lags the fleet's but still
            # comes is heard); live, its own clock finishes it (the fleet's would make a
            # backlog of one engine behind the others stale), and what it learned of
            # itself (anchor calibration, loop mode) is kept for max_lateness_s, for the
            # backlog an idle engine may still send (silent()'s first test inline: most
            # are not)
            t = eng.touched
            if (
                (t < limit + silent_lag and eng.silent(wm + silent_lag))
                if live
                else (t < limit and eng.silent(wm)) or eng.heard_at < stale
            ):
                gone.append(sid)
            an = eng.anchors  # eng.over_caps(), inlined
            if (
                len(eng.summaries) > max_steps
                or len(an[0]) + len(an[1]) + len(an[2]) > max_anchor_steps
                or len(eng.snapshots) > max_steps
            ):
                for _ in eng.enforce_caps():
                    self.metrics.outcome("step", "expired", "capacity")
        heap = self._req_heap
        expired = False
        while heap:
            deadline, key, clock = heap[0]
            if deadline > self._clock(clock):
                break
            heapq.heappop(heap)
            entry = self._requests.get(key)
            if entry is not None and entry.deadline_wall == deadline:
                if self._park(entry, deadline):
                    continue
                self._expire_request(key)
                expired = True
        if self._parked:
            expired |= self._unpark()
        if expired and self._dirty:
            # requests the expiry above just completed: their loop waits were deferred
            # to their engines (which it marked; nothing else is due at their clocks)
            for e in sorted(self._dirty, key=_by_seq):
                wm = self._engine_wm(e)
                if engines.get(e.source.id) is e and e.loop_waits.due_by(wm):
                    for item in e.due_loop_waits(wm):
                        self._emit_loop_wait(e, item)
        for sid in gone:
            self._forget_engine(sid)
        if len(heap) > 4 * len(self._requests) + 1024:
            self._req_heap = [x for x in heap if x[1] in self._requests]
            heapq.heapify(self._req_heap)
        if len(theap) > 4 * len(engines) + 1024:  # one entry per engine suffices
            base = self._pushes
            self._heard_heap = [(e.heard_at, base + i, e) for i, e in enumerate(engines.values())]
            self._pushes = base + len(engines)
            heapq.heapify(self._heard_heap)
        for sid in list(self._ready):  # waiters closed or expired are dropped lazily
            waiters = self._ready[sid]
            if len(waiters) > 4 * len(self._ready_keys) + 1024 or sid not in self._engines:
                waiters = [x for x in waiters if (sid, x[1]) in self._ready_keys]
                heapq.heapify(waiters)
                if waiters:
                    self._ready[sid] = waiters
                else:
                    del self._ready[sid]
        self._expire_dict(self._done)
        self._expire_dict(self._kv_done)
        self._expire_kv(self._kv_open, "expired", "no_completion")
        self._purge_kv_steps()
        self._expire_kv(self._kv_early, "unmatched", "no_initiation")
        # data time, not ticks: counting a window of hundreds of engines on every tick
        # cost 2 % of a loaded daemon
        if self._max_wall - self._last_gauges >= _GAUGE_NS or not self._last_gauges:
            self._last_gauges = self._max_wall
            self._update_gauges()
        self.metrics.sync()
        self._log_summary()

    def _park(self, entry: RequestEntry, deadline: int) -> bool:
        """Hold a half-joined request past its deadline while a source its other part
        comes from is behind it (the sources its own source's requests were joined with;
        :attr:`_peers`), up to max_lateness_s of its own clock. Without it a stalled
        exporter lost every request of the stall: an engine core's spans 65 s behind its
        API server's (bench closedloop, ~10x real time) expired 100-450 of ~650."""
        core = next((c.span for c in entry.cores.values() if c.span is not None), None)
        if entry.api is not None:
            if core is not None:
                return False  # both sides came (n > 1 waits for the rest as before)
            own = entry.api.span.source.id
        elif core is not None:
            own = core.span.source.id
        else:
            return False
        peers = self._peers.get(own)
        if not peers or self._clock(own) >= deadline + self._park_ns:
            return False
        slow, t = "", deadline
        for p in peers:
            clock = self._clock(p)
            if clock < t:
                slow, t = p, clock
        if not slow:
            return False
        heapq.heappush(self._parked.setdefault(slow, []), (deadline, entry.key, own))
        return True

    def _unpark(self) -> bool:
        """Expire the parked requests whose slow source caught up past their deadline
        (their other part did not come) or whose own clock ran max_lateness_s on."""
        expired = False
        extra = self._park_ns
        for slow in list(self._parked):
            parked = self._parked[slow]
            clock = self._clock(slow)
            while parked:
                deadline, key, own = parked[0]
                if deadline > clock and deadline + extra > self._clock(own):
                    break
                heapq.heappop(parked)
                entry = self._requests.get(key)
                if entry is not None and entry.deadline_wall == deadline:
                    self._expire_request(key)
                    expired = True
            if not parked:
                del self._parked[slow]
        return expired

    def _note_peers(self, api: str, engine: str) -> None:
        """Remember that API server ``api`` and engine ``engine`` serve each other's
        requests (:meth:`_park`): only from an observation built, so on one host
        (``same_host``), whose wall clocks :meth:`_park` may compare."""
        peers = self._peers
        if len(peers) > 4 * len(self._engines) + 1024:  # sources long gone
            live = self._wm
            self._peers = peers = {
                k: {x for x in v if x in live} for k, v in peers.items() if k in live
            }
        peers.setdefault(api, set()).add(engine)
        peers.setdefault(engine, set()).add(api)

    def _engine_wm(self, eng: EngineState) -> int:
        """The clock an engine's due work is decided by in a sweep: its data's
        watermark, run on with the receiver's clock (what the sweep's visit computes)."""
        sid = eng.source.id
        w = self._wm.get(sid, 0)
        wm = max(eng.watermark, w)
        now = self._now
        if now is not None:
            h = self._heard.get(sid)
            if h is not None and h[0] == w and now > h[1]:
                wm = max(wm, w + (now - h[1]))
        return wm

    def _forget_engine(self, sid: str) -> None:
        """An engine silent for max_lateness_s of its own clock, or not heard from for as
        long of the fleet's (a replay has no wall clock to move a silent engine's on):
        finish what it left and drop its state, so memory follows the engines that still
        send."""
        e = self._engines.get(sid)
        if e is None:
            return
        if self._now is not None:
            pass  # live: the sweep found it silent for max_lateness_s of its own clock
        elif not e.silent(e.watermark):
            if e.heard_at >= self._max_wall - self._forget_ns:
                return
            self._finish_engine(e)
        del self._engines[sid]
        self._restarts.pop(sid, None)  # restarts older than a window: nothing to tell

    def _finish_engine(self, eng: EngineState) -> None:
        """Finalize every step and decide every loop wait an engine still holds (it
        restarted or fell silent: nothing more will come for them)."""
        for n in eng.drain_all():
            self._finalize_step(eng, n)
        if eng.waits:
            eng.waits.release_all()
            self._emit_waited(eng)
        for item in eng.due_loop_waits(None):
            self._emit_loop_wait(eng, item)

    def _expire_dict(self, d: dict[Any, int]) -> None:
        """Drop tombstones past their time (insertion order ≈ time order)."""
        limit = self._max_wall
        drop = []
        for k, t in d.items():
            if t > limit:
                break
            drop.append(k)
        for k in drop:
            del d[k]
        cap = 2 * self.cfg.max_requests
        while len(d) > cap:
            del d[next(iter(d))]

    def _expire_kv(self, d: dict[kvmod.TransferKey, KVTransfer], outcome: str, why: str) -> None:
        """Drop unpaired transfer halves older than the window (insertion ≈ time order)."""
        drop = []
        for k, t in d.items():
            b = t.batch
            if b.wall_ns >= self._clock(b.source.id) - self._window_ns:
                break
            drop.append(k)
        while len(d) - len(drop) > self.cfg.max_kv_transfers:
            drop.append(list(d)[len(drop)])
        for k in drop:
            del d[k]
        if drop:
            self.metrics.outcome("kv_transfer", outcome, why, len(drop))

    def _update_gauges(self) -> None:
        self.metrics.sync()
        for kind, n in self.entries().items():
            self.metrics.entries(kind, n)

    def _log_summary(self, force: bool = False) -> None:
        interval = int(self.cfg.summary_log_interval_s * 1e9)
        if not force and self._max_wall - self._last_log < interval:
            return
        if not self.metrics.outcomes:
            return  # nothing happened yet: no line
        self._last_log = self._max_wall
        delta = self.metrics.reasons - self._logged
        outcomes = {f"{o}.{k}": n for (o, k), n in sorted(self.metrics.outcomes.items()) if n}
        log.info(
            "joiner window summary",
            outcomes=outcomes,
            reasons_since_last={f"{o}.{k}.{r}": n for (o, k, r), n in sorted(delta.items())},
            entries=self.entries(),
            async_modes={
                sid: (e.mode(), e.async_source or "inferred") for sid, e in self._engines.items()
            },
        )
        self._logged = Counter(self.metrics.reasons)
