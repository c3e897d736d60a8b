"""Engine sampling: the share ``e`` of each configuration's engines whose telemetry is
decoded and joined (the rules: :mod:`coeffd.daemon.load.controller`, whose
:class:`LoadController` drives it).

Why: load shedding (:mod:`coeffd.daemon.load.shedding`) sheds learning, but every record
is still received, decoded and joined — ~5 µs of the ~12 µs a loaded daemon spends per
event. Behind a collector, a fleet sends far more than one core can join. Engines of one
configuration are exchangeable for the learners (they fit one coefficient vector per
configuration), so under that load the daemon follows a consistent subset of each
configuration's engines in full, and counts the others' spans and events as ``sampled
out`` without decoding their attributes. A sampled-out export request then costs its
protobuf parse and a count.

An engine is kept when a golden-ratio hash of its identity (``coeffd.engine``, else the
source id: :func:`~learners.features.config.engine_identity`) is below the share, so the
kept set is nested and the same in every process, for spans and for the engine's KV
stream; each configuration (its ``coeffd.model``, ``coeffd.gpu``, … attributes) keeps its
``min_engines`` lowest-hash engines seen within ``idle_s``.

>>> from coeffd.receivers.source import source_from_attributes as src
>>> clock = iter(range(0, 10_000, 2)).__next__
>>> s = EngineSampler(min_engines=1, clock=clock, cpu_clock=lambda: 0.0, worker_clock=lambda: 0.0)
>>> engines = [src({"coeffd.model": "m", "coeffd.engine": f"e{i}"}) for i in range(400)]
>>> sum(map(s.keep, engines))                    # everything while not behind
400
>>> s.update(backlog=0.7, step_ratio=1 / 32), s.update(backlog=0.8, step_ratio=1 / 32)
(0.5, 0.25)
>>> sum(map(s.keep, engines))                    # ~1/4 (nested: a subset of the 1/2)
92
>>> lone = src({"coeffd.model": "small", "coeffd.engine": "only"})
>>> s.keep(lone)                                 # its configuration's only engine
True
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
import time
import zlib
from collections.abc import Callable

from coeffd.daemon.load.shedding import share_limit, spread
from coeffd.learners.features.config import ATTRIBUTE_PREFIX, ServingConfig, engine_identity
from coeffd.records.events import AttrValue, Source

__all__ = ["EngineSampler"]

_MAX_SOURCES = 100_000  # sources come from the network: bound the per-source cache
#: Receivers' pool full this share of a second: requests wait before they are read.
#: Half: a pool that is full now and then is busy, one full most of the time is behind.
_FULL_SHARE = 0.5
_MIN_WORKER_CPU = 0.2  # CPU-seconds/s of the worker below which halving frees too little

_Group = tuple[tuple[str, AttrValue], ...]
#: The resource attributes that name a configuration (not its engine or process).
_CONFIG_KEYS = frozenset(ATTRIBUTE_PREFIX + f.name for f in dataclasses.fields(ServingConfig))


def engine_hash(engine: str) -> int:
    """A 32-bit hash of an engine identity, stable across processes (str hashes are salted)."""
    return spread(zlib.crc32(engine.encode()))


def config_group(source: Source) -> _Group:
    """The configuration part of a source's identity: its configuration attributes
    (``coeffd.model``, ``coeffd.gpu``, …; not the engine or the process). Sources without
    any (a static configuration) form one group."""
    return tuple((k, v) for k, v in source.attributes if k in _CONFIG_KEYS)


class EngineSampler:
    """Which engines' telemetry to decode and join (see the module docstring).

    ``keep`` and ``keep_engine`` run on the receivers' threads, ``update`` on the
    pipeline worker's. The decision itself reads two attributes replaced whole, so it
    takes no lock; registering a new engine and expiring idle ones do.

    Parameters
    ----------
    high
        Backlog (queue fill, 0..1) at and above which the share halves while it rises.
    low
        Backlog at or below which (with step learning at half or more) it may recover.
    min_share
        The smallest share of engines kept (besides each configuration's floor).
    min_engines
        Engines every configuration keeps, whatever the share.
    down_hold_s, up_hold_s
        Least time between halvings; calm time before a doubling.
    idle_s
        An engine not heard from for this long leaves its configuration's floor.
    cpu_high
        The daemon's CPU (seconds per second, all threads; one Python process is
        GIL-bound at about one core) that counts as saturated; the share recovers only
        at or below half of it, since doubling the share at most doubles the CPU.
    step_floor
        The step-learning share that means "nothing more to shed" (``shed_min_keep``).
    cpu_settle_s
        The receivers' pool and the CPU are judged only on seconds that start this long
        after a change of share.
    receivers_full
        The share of the time since its last call that the receivers' worker pool was
        full (``Occupancy.full_share``); ``None``: the queue alone steers.
    """

    def __init__(
        self,
        *,
        high: float = 0.6,
        low: float = 0.1,
        min_share: float = 1 / 64,
        min_engines: int = 2,
        down_hold_s: float = 1.0,
        up_hold_s: float = 60.0,
        idle_s: float = 120.0,
        cpu_high: float = 0.9,
        step_floor: float = 1 / 32,
        cpu_settle_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        worker_clock: Callable[[], float] = time.thread_time,
        receivers_full: Callable[[], float] | None = None,
    ) -> None:
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"need 0 < min_share <= 1, got {min_share}")
        self.high, self.low, self.min_share = high, low, min_share
        self.min_engines = min_engines
        self.down_hold_s, self.up_hold_s, self.idle_s = down_hold_s, up_hold_s, idle_s
        self.cpu_high, self.step_floor, self.cpu_settle_s = cpu_high, step_floor, cpu_settle_s
        self._clock, self._cpu_clock, self._worker_clock = clock, cpu_clock, worker_clock
        #: share of the time the receivers' worker pool was full since the last call
        #: (:class:`receivers.occupancy.Occupancy`)
        self.receivers_full = receivers_full
        self.share = 1.0
        self._limit = share_limit(1.0)
        self._floor: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._info: dict[Source, tuple[str, int]] = {}  # source → (engine, hash)
        self._seen: dict[str, float] = {}  # engine → last heard from
        self._group_of: dict[str, _Group] = {}
        self._groups: dict[_Group, dict[str, int]] = {}  # group → engine → hash
        self._group_floor: dict[_Group, list[str]] = {}
        now = clock()
        self._changed = now
        self._backlog_at_change = 0.0
        self._calm_since: float | None = None
        self._next_expiry = now + idle_s / 4
        #: CPU seconds per second over the last whole second (all threads)
        self.cpu = 0.0
        #: the same for the thread calling :meth:`update` (the pipeline worker)
        self.worker_cpu = 0.0
        #: share of the last whole second the receivers' pool was full
        self.full = 0.0
        self._cpu_since = (now, cpu_clock(), worker_clock())
        self._ratio_peak = 0.0  # highest step-learning share seen this second
        self._floor_held = False  # it stayed at the floor for the whole last second
        self._cpu_current = False  # measured wholly after the last change had settled

    # ------------------------------------------------------------ receivers' threads
    def keep(self, source: Source) -> bool:
        """Whether to decode ``source``'s spans (notes the engine as heard from)."""
        info = self._info.get(source)
        if info is None:
            info = self._register(source)
        engine, h = info
        self._seen[engine] = self._clock()
        return h < self._limit or engine in self._floor

    def keep_engine(self, engine: str) -> bool:
        """Whether to take in the KV events of ``engine``: the decision for its spans
        (an engine whose spans have not been seen yet is judged by its hash alone)."""
        return engine_hash(engine) < self._limit or engine in self._floor

    # ------------------------------------------------------------ pipeline worker
    def update(self, backlog: float, step_ratio: float) -> float:
        """Steer the share from the backlog, the step-learning share and the CPU."""
        now = self._clock()
        self._ratio_peak = max(self._ratio_peak, step_ratio)
        self._measure_cpu(now)
        receivers_behind = (
            self._cpu_current
            # at the floor for the whole measured second, not in a dip: a saturated core
            # while learning still takes more than its floor now and then is just busy
            and self._floor_held
            and step_ratio <= self.step_floor
            and (
                self.full >= _FULL_SHARE
                # a saturated core: someone is late, and the queue says it is not the
                # worker. Halving frees about half of the worker's CPU: worth it only
                # while that is sizeable (the rest is receiving, which all engines cost)
                or (self.cpu >= self.cpu_high and self.worker_cpu >= _MIN_WORKER_CPU)
            )
        )
        if backlog >= self.high or receivers_behind:
            self._calm_since = None
            if (
                self.share > self.min_share
                and now - self._changed >= self.down_hold_s
                and (receivers_behind or backlog >= self._backlog_at_change)
            ):
                self._set(max(self.min_share, self.share / 2), now, backlog)
        elif backlog <= self.low and step_ratio >= 0.5 and self.cpu <= self.cpu_high / 2:
            # doubling the share at most doubles the CPU: this much headroom is enough
            if self._calm_since is None:
                self._calm_since = now
            elif self.share < 1.0 and now - max(self._calm_since, self._changed) >= self.up_hold_s:
                self._set(min(1.0, self.share * 2), now, backlog)
        else:
            self._calm_since = None
        if now >= self._next_expiry:
            self._expire(now)
        return self.share

    def _measure_cpu(self, now: float) -> None:
        t0, c0, w0 = self._cpu_since
        if now - t0 >= 1.0:
            c, w = self._cpu_clock(), self._worker_clock()
            self.cpu, self.worker_cpu = (c - c0) / (now - t0), (w - w0) / (now - t0)
            self.full = self.receivers_full() if self.receivers_full is not None else 0.0
            self._floor_held, self._ratio_peak = self._ratio_peak <= self.step_floor, 0.0
            self._cpu_since = (now, c, w)
            # settled: after a change the worker still works off the queue and the join
            # window it left for a while, at full CPU
            self._cpu_current = t0 >= self._changed + self.cpu_settle_s

    def engines(self) -> tuple[int, int]:
        """(engines kept, engines heard from within ``idle_s``)."""
        limit, floor = self._limit, self._floor
        with self._lock:
            hashes = [(e, h) for members in self._groups.values() for e, h in members.items()]
        kept = sum(1 for e, h in hashes if h < limit or e in floor)
        return kept, len(hashes)

    # ------------------------------------------------------------ internals
    def _set(self, share: float, now: float, backlog: float) -> None:
        self.share = share
        self._limit = share_limit(share)
        self._changed, self._backlog_at_change = now, backlog
        self._cpu_current = False

    def _register(self, source: Source) -> tuple[str, int]:
        engine = engine_identity(source)
        info = (engine, engine_hash(engine))
        group = config_group(source)
        with self._lock:
            if len(self._info) >= _MAX_SOURCES:
                self._info.clear()
            self._info[source] = info
            if self._group_of.get(engine) != group:
                self._leave(engine)
                self._group_of[engine] = group
                self._groups.setdefault(group, {})[engine] = info[1]
                self._refloor(group)
        return info

    def _leave(self, engine: str) -> None:
        group = self._group_of.pop(engine, None)
        if group is None:
            return
        members = self._groups[group]
        members.pop(engine, None)
        if not members:
            del self._groups[group]
        self._refloor(group)

    def _refloor(self, group: _Group) -> None:
        members = self._groups.get(group)
        if members:
            self._group_floor[group] = heapq.nsmallest(
                self.min_engines, members, key=members.__getitem__
            )
        else:
            self._group_floor.pop(group, None)
        self._floor = frozenset(e for f in self._group_floor.values() for e in f)

    def _expire(self, now: float) -> None:
        self._next_expiry = now + self.idle_s / 4
        idle = [e for e, t in list(self._seen.items()) if now - t > self.idle_s]
        if not idle:
            return
        gone = set(idle)
        with self._lock:
            for engine in idle:
                self._seen.pop(engine, None)
                self._leave(engine)
            # their sources register again (and rejoin a floor) if they come back
            for src in [s for s, (e, _) in self._info.items() if e in gone]:
                del self._info[src]
