"""The load controller: the one object that decides how much of the telemetry is decoded,
joined and learned when the daemon cannot keep up with all of it.

Why shed at all: push-back reaches vLLM, whose ``BatchSpanProcessor`` drops spans once its
own queue is full, and a dropped journey or step span costs observations far beyond
itself (the joins around it fail). Learning less of what arrives costs far less: step
observations are plentiful and redundant for an RLS learner whose memory is ~90 rows,
and the engines of one configuration are exchangeable for its learners.

The whole policy, with ``r`` the share of step and request observations learned and
``e`` the share of each configuration's engines decoded and joined:

==================  ==============================================  ==============================
signal              rule                                            settings (``pipeline.*``)
==================  ==============================================  ==============================
backlog b           r = 1 while b ≤ start, min_keep once b ≥ full,  shed_start, shed_full,
(queue fill 0..1)   linear in between                               shed_min_keep
tick CPU time t     r ≤ a tick share, × min(2, √(budget / t)) per   shed_tick_budget ×
(worker thread's)   tick, kept within [min_keep, 1]; budget 0: off  tick_interval_seconds
step, request id    learned iff its golden-ratio hash (a request:   —
                    of the CRC of its id) is below r: even, and
                    the same on every replay at the same share
KV transfer         always learned (rare)                           —
r < ½, then r = 1   one warning "learning behind …", then one       —
                    info "learning caught up …"
b ≥ high, rising    e halves, at most once a second                 sample_engines_at
receivers behind    e halves, once per measured second that starts  sample_engines_cpu,
(below)             5 s after the last change                       shed_min_keep
calm (below)        e doubles after ``recover`` s of calm (slow:    sample_engines_recover_seconds
                    an engine taken on mid-stream yields nothing
                    for a window)
engine identity     decoded iff its hash is below e (nested: a      sample_engines_min_share
                    lower share only drops engines) …
configuration       … or among its lowest-hash engines heard from   sample_engines_min_per_config
                    within 120 s, whatever e
e changes           a warning "… joining a share of the engines"    —
                    when it halves, an info when it doubles
replay              no shedding, no sampling: it waits for room     shed_learning,
                                                                    sample_engines (false)
==================  ==============================================  ==============================

*Receivers behind*: r has been at its floor (``shed_min_keep``; 1 without shedding) for
the whole last measured second and is now, and either the receivers' worker pool
(:mod:`receivers.occupancy`) was full half of that second, or the daemon used
``sample_engines_cpu`` of a core with the pipeline worker using at least 0.2 of one: the
receivers, not the queue, fall behind then (they share one interpreter with the worker).
*Calm*: b ≤ ``shed_start``, r ≥ ½ and the CPU at most half of ``sample_engines_cpu``
(doubling e at most doubles it).

*Tick CPU time*, not wall time: the tick budget bounds the work shedding controls, the
worker's building and learning. A tick's wall time also counts the time the worker
thread waited — for a core shared with vLLM and other processes, for the GIL held by the
receivers (whose load the backlog and engine rules answer) — and on a shared 2-core
machine wall-clock ticks shed at about half a core (``bench serve --sampling default``:
keep ratio 0.5–0.8 at 512 engines with an empty queue). The tick's CPU time is the
worker thread's from the :meth:`~LoadController.steer` that opens the tick (the
learning consumer steers first thing in its tick) to :meth:`~LoadController.observe_tick`.

Who asks what: the joiner asks :attr:`LoadController.step_filter` before it builds a
step (and reports what it shed, :meth:`~LoadController.shed`); the decoders get it too
(they read shed steps' summaries partially) and ask the sampler's
:meth:`~.sampling.EngineSampler.keep` per source, the KV subscribers its
:meth:`~.sampling.EngineSampler.keep_engine` per engine; the learning consumer asks
:meth:`~LoadController.keep_request` and drives :meth:`~LoadController.steer` from the
pipeline worker. The mechanisms live next door:
:mod:`.shedding` (the share ``r``) and :mod:`.sampling` (the share ``e``); with
``pipeline.*`` settings they are :func:`learning_shedder` and :func:`engine_sampler`.
Everything is handed over at construction (``daemon.assemble``): the sampler is built
first, since the decoders it filters are built before the controller they are given to.

>>> from coeffd.daemon.load.shedding import LoadShedder
>>> load = LoadController(
...     shedder=LoadShedder(start=0.2, full=0.6, min_keep=0.125),
...     backlog=lambda: 0.4,            # a queue 40 % full
... )
>>> load.step_filter is None        # not steered yet: everything is learned
True
>>> load.steer(); load.shedder.ratio
0.5625
>>> sum(map(load.step_filter, range(8000)))  # an even share of the steps
4500
>>> load.keep_request("abc"), load.shed_total  # a request shed, and counted
(False, {'step': 0, 'request': 1})
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from coeffd.daemon.load.sampling import EngineSampler
from coeffd.daemon.load.shedding import LoadShedder
from coeffd.daemon.settings import PipelineSettings
from coeffd.receivers.otlp.decode import Decoder

__all__ = ["LoadController", "LoadMetrics", "engine_sampler", "learning_shedder"]

log = structlog.get_logger(__name__)

#: Shedding below this keep ratio is worth a warning; above it, it is routine trimming.
_SHED_WARN_BELOW = 0.5


def learning_shedder(p: PipelineSettings) -> LoadShedder | None:
    """The step/request share ``r`` by the table's ``pipeline.*`` settings (None unless
    ``shed_learning``)."""
    if not p.shed_learning:
        return None
    return LoadShedder(
        p.shed_start,
        p.shed_full,
        p.shed_min_keep,
        p.shed_tick_budget * p.tick_interval_seconds,
    )


def engine_sampler(
    p: PipelineSettings, receivers_full: Callable[[], float] | None = None
) -> EngineSampler | None:
    """The engine share ``e`` by the table's ``pipeline.*`` settings (None unless
    ``sample_engines``); ``receivers_full``: the share of the time the receivers' worker
    pool was full (:meth:`receivers.occupancy.Occupancy.full_share`)."""
    if not p.sample_engines:
        return None
    return EngineSampler(
        high=p.sample_engines_at,
        low=p.shed_start,
        min_share=p.sample_engines_min_share,
        min_engines=p.sample_engines_min_per_config,
        up_hold_s=p.sample_engines_recover_seconds,
        cpu_high=p.sample_engines_cpu,
        # without learning's shedding, engine sampling is the first resort
        step_floor=p.shed_min_keep if p.shed_learning else 1.0,
        receivers_full=receivers_full,
    )


class LoadMetrics:
    """The load controller's metric families (names: CONTRIBUTING.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.shed = Counter(
            "coeffd_observations_shed_total",
            "Observations not learned because learning fell behind, by kind: steps are "
            "shed before joining, requests before learning (pipeline.shed_learning).",
            ["kind"],
            registry=registry,
        )
        self.keep_ratio = Gauge(
            "coeffd_learning_keep_ratio",
            "Share of step and request observations being learned (1 = all; below 1 = "
            "shedding load).",
            registry=registry,
        )
        self.keep_ratio.set(1.0)
        self.engine_share = Gauge(
            "coeffd_engine_sample_ratio",
            "Share of each configuration's engines whose telemetry is decoded and joined "
            "(1 = all; below 1 = engine sampling, pipeline.sample_engines).",
            registry=registry,
        )
        self.engine_share.set(1.0)
        self.engines = Gauge(
            "coeffd_engines",
            "Engines heard from within the sampler's idle time, by state: joined or "
            "sampled_out (engine sampling).",
            ["state"],
            registry=registry,
        )


class LoadController:
    """The load policy (module docstring): signals in, shares out, shed tallies kept.

    ``steer``, ``keep_request``, ``shed`` and ``count`` run on the pipeline worker; the
    receivers' threads only call the filters they were handed.

    Parameters
    ----------
    metrics
        Where the shares and tallies are exported (a private registry if None).
    shedder
        The step/request share ``r`` (None: everything is learned).
    sampler
        The engine share ``e`` (None: every engine is decoded).
    backlog
        Signal: the pipeline's backlog (queue fill 0..1); nothing is steered without it.
    decoders
        The receivers' decoders: they decode the steps being shed partially (half the
        decode cost of the commonest record).
    cpu_clock
        The calling thread's CPU seconds (ticks are measured on it: module docstring).
    """

    def __init__(
        self,
        metrics: LoadMetrics | None = None,
        *,
        shedder: LoadShedder | None = None,
        sampler: EngineSampler | None = None,
        backlog: Callable[[], float] | None = None,
        decoders: Iterable[Decoder] = (),
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.metrics = metrics if metrics is not None else LoadMetrics(CollectorRegistry())
        self.shedder = shedder
        # one bound method, so the decoders see the same filter and skip rebuilding
        self._keep = shedder.keep if shedder is not None else None
        self.sampler = sampler
        #: Signal: the pipeline's backlog (queue fill 0..1); nothing is steered without it.
        self.backlog = backlog
        #: Decoders of the receivers: each is handed the step filter.
        self.decoders: list[Decoder] = list(decoders)
        #: None while every step is built and learned; else whether step ``n`` is.
        self.step_filter: Callable[[int], bool] | None = None
        #: Observations shed so far, by kind (``step``: the joiner's tally).
        self.shed_total = {"step": 0, "request": 0}
        self._exported = {"step": 0, "request": 0}  # what the counter shows
        self._shed_warned = False  # a "learning behind" warning awaits its "caught up"
        self._engine_share = 1.0
        self._cpu_clock = cpu_clock
        self._steered_cpu: float | None = None  # the worker's CPU time at the last steer

    # ------------------------------------------------------------ what others ask
    def keep_request(self, request_id: str) -> bool:
        """Whether a request observation is learned at the current share (False: it is
        counted as shed). Ask only while :attr:`step_filter` is set."""
        assert self.step_filter is not None
        # crc32: a hash stable across processes (str hashes are salted), so a replay
        # at the same share learns the same requests
        if self.step_filter(zlib.crc32(request_id.encode())):
            return True
        self.shed_total["request"] += 1
        return False

    def shed(self, kind: str, n: int) -> None:
        """``n`` observations of ``kind`` were shed (the joiner reports its steps)."""
        self.shed_total[kind] += n

    # ------------------------------------------------------------ pipeline worker
    def steer(self) -> None:
        """Set the shares from the signals (the backlog, then the tick durations, the
        receivers' pool and the CPU through the sampler), and hand the step filter to
        the decoders. Without a shedder, step learning is whole. Also marks the
        worker's CPU time: a tick is measured from its opening steer."""
        if self.shedder is not None:
            self._steered_cpu = self._cpu_clock()
        if self.backlog is None:
            return
        backlog = self.backlog()
        ratio = self._shed_steps(self.shedder, backlog) if self.shedder is not None else 1.0
        if self.sampler is not None:
            self._sample(self.sampler, backlog, ratio)

    def observe_tick(self, seconds: float) -> None:
        """Signal: the last tick took ``seconds`` of wall time (applies from the next
        :meth:`steer`). What counts is the worker thread's CPU time since the steer that
        opened the tick (never more than the wall time): waiting for a core or the GIL
        is not work that shedding would save."""
        if self.shedder is None:
            return
        mark = self._steered_cpu
        if mark is not None:
            seconds = min(seconds, self._cpu_clock() - mark)
            self._steered_cpu = None
        self.shedder.observe_tick(seconds)

    def count(self) -> None:
        """Bring ``coeffd_observations_shed_total`` up to the tallies."""
        for kind, total in self.shed_total.items():
            done = self._exported[kind]
            if total > done:
                self.metrics.shed.labels(kind).inc(total - done)
                self._exported[kind] = total

    def gauge_engines(self) -> None:
        """Refresh ``coeffd_engines`` (joined / sampled out)."""
        if self.sampler is None:
            return
        kept, known = self.sampler.engines()
        self.metrics.engines.labels("joined").set(kept)
        self.metrics.engines.labels("sampled_out").set(known - kept)

    def _shed_steps(self, shedder: LoadShedder, backlog: float) -> float:
        ratio = shedder.update(backlog)
        self.metrics.keep_ratio.set(ratio)
        shedding = ratio < 1.0
        keep = self._keep if shedding else None
        self.step_filter = keep
        for d in self.decoders:
            d.step_filter = keep
        # Warn only when learning is really behind: a long tick alone (a checkpoint, a
        # burst of publishes) trims the share to ~0.98 with an empty queue, which is
        # routine and visible in coeffd_learning_keep_ratio; catching up is good news.
        if ratio < _SHED_WARN_BELOW and not self._shed_warned:
            self._shed_warned = True
            log.warning(
                "learning behind: shedding step and request observations",
                keep_ratio=round(ratio, 3),
                backlog=round(backlog, 3),
                shed_total=self.shed_total["step"],
            )
        elif not shedding and self._shed_warned:
            self._shed_warned = False
            log.info(
                "learning caught up: learning every observation",
                backlog=round(backlog, 3),
                shed_total=self.shed_total["step"],
            )
        return ratio

    def _sample(self, sampler: EngineSampler, backlog: float, ratio: float) -> None:
        share = sampler.update(backlog, ratio)
        if share == self._engine_share:
            return
        self.metrics.engine_share.set(share)
        (log.warning if share < self._engine_share else log.info)(
            "learning at its floor and still behind: joining a share of the engines"
            if share < self._engine_share
            else "caught up: joining more engines",
            engine_share=share,
            previous=self._engine_share,
            backlog=round(backlog, 3),
            keep_ratio=round(ratio, 3),
        )
        self._engine_share = share
        self.gauge_engines()
