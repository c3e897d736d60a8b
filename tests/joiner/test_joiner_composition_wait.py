"""A sampled step whose requests outlive the join window waits for their journeys.

vLLM exports a request's journey (its ``llm_core`` span) only when the request ends, so a
step's batch can be rebuilt from journeys only once all of its requests have ended. The
stream: one Mixtral-8x7B engine (28 ms steps, generations of tens of seconds) at
every-step sampling without snapshots, joined with a 6 s window (above simfleet's 5 s
export interval, below most of its requests' lives), so that most steps reach the window
with some of their requests still running: without the wait none of them gets its batch.
"""

from __future__ import annotations

import collections

import msgspec
import pytest
from joiner_fleet import FleetRun, batch_shape, run_fleet

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.joiner.composition import Life, aggregates_of
from coeffd.joiner.waits import CompositionWaits
from coeffd.records.events import (
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    Record,
    Source,
    SpanInfo,
)
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    Observation,
    PeriodMethod,
    RequestObservation,
    StepObservation,
)
from coeffd.simfleet import SampleRates, ServingSetup, Workload
from coeffd.simfleet.scenarios import _engine

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

WINDOW_S = 6.0
FULL_NO_RICH = SampleRates(journey=1.0, step=1.0, rich=0.0, closure_interval=100)
S = 1_000_000_000


@pytest.fixture(scope="module")
def fleet() -> FleetRun:
    spec = _engine(
        "long-generations",
        ServingSetup(model="mixtral-8x7b-v0.1", gpu="H100", tp=2),
        Workload(rate_per_s=6.0, profile="mixed"),
    )
    return run_fleet([spec], 40.0, seed=2, rates=FULL_NO_RICH)


def _join(
    batches: list[list[Record]], cfg: JoinerConfig, cap: int | None = None
) -> tuple[Joiner, list[Observation], dict[int, int]]:
    """Join, flush; also the engine's data watermark when each step observation left
    (before the flush; the flush's are absent). ``cap``: assert no engine holds more."""
    j = Joiner(cfg)
    out: list[Observation] = []
    left: dict[int, int] = {}
    for b in batches:
        got = j.push_many(b)
        for o in got:
            if isinstance(o, StepObservation):
                left[o.step] = j._wm[o.source.id]
        out += got
        if cap is not None:
            assert all(len(e.waits) <= cap for e in j._engines.values())
    return j, out + j.flush(), left


def _steps(out: list[Observation]) -> dict[int, StepObservation]:
    """The one-step observations of sampled steps, by step."""
    return {
        o.step: o
        for o in out
        if isinstance(o, StepObservation) and o.period_method is not PeriodMethod.JOURNEY_SPAN
    }


def test_steps_of_long_requests_get_their_batches_when_their_journeys_arrive(
    fleet: FleetRun,
) -> None:
    truth = fleet.steps_truth()
    j, out, _ = _join(fleet.batches, JoinerConfig(window_s=WINDOW_S))
    steps = _steps(out)
    by = collections.Counter(o.composition for o in steps.values())
    waits = j.metrics.composition_waits
    assert by[Composition.JOURNEYS] >= 100 and waits["completed"] >= 100, (by, waits)
    for o in steps.values():
        if o.composition is Composition.JOURNEYS:
            assert batch_shape(o.requests) == batch_shape(truth[(o.source.id, o.step)].blis)
    # without the wait every step leaves at the window with its totals alone; nothing
    # else about the steps, and nothing about the requests, depends on the wait
    j0, out0, _ = _join(fleet.batches, JoinerConfig(window_s=WINDOW_S, composition_wait_s=WINDOW_S))
    steps0 = _steps(out0)
    assert not j0.metrics.composition_waits
    assert collections.Counter(o.composition for o in steps0.values()) == {
        Composition.AGGREGATES: len(steps0)
    }
    assert steps0 == {
        n: msgspec.structs.replace(o, composition=Composition.AGGREGATES, requests=())
        for n, o in steps.items()
    }
    reqs = [o for o in out if isinstance(o, RequestObservation)]
    assert reqs and reqs == [o for o in out0 if isinstance(o, RequestObservation)]
    assert len(out) == len(out0)


def test_the_cap_on_waiting_steps_is_counted_and_nothing_is_lost(fleet: FleetRun) -> None:
    cap = 16
    j, out, _ = _join(
        fleet.batches, JoinerConfig(window_s=WINDOW_S, max_composition_waits=cap), cap=cap
    )
    _, free, _ = _join(fleet.batches, JoinerConfig(window_s=WINDOW_S))
    waits = j.metrics.composition_waits
    assert waits["capacity"] > 0, waits
    # each step leaves once, with its batch if the journeys came in time, else its totals
    steps, steps_free = _steps(out), _steps(free)
    assert steps.keys() == steps_free.keys()
    for n, o in steps.items():
        if o.composition is Composition.JOURNEYS:
            assert o == steps_free[n]
        else:
            assert o == msgspec.structs.replace(
                steps_free[n], composition=Composition.AGGREGATES, requests=()
            )
    assert j.metrics.observed["step"] == len([o for o in out if isinstance(o, StepObservation)])


def test_a_journey_that_never_arrives_leaves_the_totals_at_the_deadline(
    fleet: FleetRun,
) -> None:
    """The longest request that ended in the first 20 s loses its ``llm_core`` span: the
    steps it ran in wait ``composition_wait_s`` after their summary, then leave with the
    summary's totals (their batch cannot be complete), well before the stream ends."""
    wait_s = 20.0
    recs = [r for b in fleet.batches for r in b]
    t0 = min(r.wall_ns for r in recs if isinstance(r, BatchSummary))
    first: dict[bytes, int] = {}
    lives: dict[bytes, tuple[int, int]] = {}
    for r in recs:
        if not isinstance(r, JourneyEvent):
            continue
        tid = r.span.trace_id
        if r.kind is JourneyKind.SCHEDULED:
            first.setdefault(tid, r.step)
        elif r.kind is JourneyKind.FINISHED and r.wall_ns < t0 + 20 * S and tid in first:
            lives[tid] = (first[tid], r.step)
    lost = max(lives, key=lambda t: lives[t][1] - lives[t][0])
    lo, hi = lives[lost]
    assert hi - lo >= 200, (lo, hi)  # ~6 s of 28 ms steps: it outlived the window
    batches = [
        [r for r in b if not (isinstance(r, CoreSpan | JourneyEvent) and r.span.trace_id == lost)]
        for b in fleet.batches
    ]
    cfg = JoinerConfig(window_s=WINDOW_S, composition_wait_s=wait_s)
    j, out, left = _join(batches, cfg)
    _, full, _ = _join(fleet.batches, cfg)
    steps, steps_full = _steps(out), _steps(full)
    summary_wall = {r.step: r.wall_ns for r in recs if isinstance(r, BatchSummary)}
    ran_in = [n for n in steps if lo <= n <= hi]
    assert len(ran_in) >= 100
    # with its journey these steps waited and were rebuilt; without it they waited
    # until the deadline, then left with the totals, as they did at the window before
    completed = [n for n in ran_in if steps_full[n].composition is Composition.JOURNEYS]
    assert len(completed) >= 100, len(completed)
    for n in completed:
        assert steps[n].composition is Composition.AGGREGATES and steps[n].requests == ()
        assert n in left and left[n] >= summary_wall[n] + wait_s * S, n  # at the deadline
        assert steps[n] == msgspec.structs.replace(
            steps_full[n], composition=Composition.AGGREGATES, requests=()
        )
    assert j.metrics.composition_waits["expired"] >= len(completed)


# ----------------------------------------------------------------- CompositionWaits alone


def _summary(step: int, reqs: int, tokens: int) -> BatchSummary:
    src = Source("engine", ())
    info = SpanInfo(b"\1" * 16, b"\2" * 8, b"", "scheduler_steps", "s", src, 0, 0)
    wall = step * S  # one step a second keeps the deadlines apart
    return BatchSummary(
        info, wall, step, wall, wall + 1, 1, reqs, 0, 0, reqs, tokens, 0, tokens, 0, 0, 0.5, 8, 4
    )


def _obs(s: BatchSummary) -> StepObservation:
    return StepObservation(
        source=s.span.source,
        step=s.step,
        start_mono_ns=s.start_mono_ns,
        period_us=28_000.0,
        period_method=PeriodMethod.CONSECUTIVE_SUMMARIES,
        period_uncertainty_us=100.0,
        scheduler_duration_us=1,
        composition=Composition.AGGREGATES,
        requests=(),
        aggregates=aggregates_of(s),
        async_scheduling=False,
    )


def _decode(first: int, last: int, input_len: int = 100) -> Life:
    return Life(first, first, last, input_len, last - first, False)


def _hold(w: CompositionWaits, step: int, reqs: int, covering: list[Life]) -> bool:
    s = _summary(step, reqs, reqs)
    return w.hold(_obs(s), s, covering)


def test_a_held_step_leaves_once_complete_or_impossible_and_otherwise_at_its_deadline() -> None:
    w = CompositionWaits(wait_ns=100 * S, cap=8)
    running = _decode(1, 30)
    assert _hold(w, 10, 2, [running])  # one of its two requests still running
    assert _hold(w, 11, 2, [running])
    assert _hold(w, 12, 3, [running])
    assert not _hold(w, 13, 1, [running])  # complete already: nothing to wait for
    assert not _hold(w, 14, 2, [running, Life(5, None, 20, 100, 0, True)])  # preempted in it
    w.add_life(_decode(2, 11, input_len=40))  # the other request of steps 10 and 11
    assert [(o.step, o.composition, how) for o, how in w.released] == [
        (10, Composition.JOURNEYS, "completed"),
        (11, Composition.JOURNEYS, "completed"),
    ]
    assert w.released[0][0].requests == (
        BatchRequest(40, 40 + 10 - 2 - 1, 1, 9),
        BatchRequest(100, 100 + 10 - 1 - 1, 1, 29),
    )
    w.released.clear()
    assert w.steps == [12] and len(w) == 1
    w.due(12 * S + 100 * S - 1)
    assert not w.released
    w.due(12 * S + 100 * S)
    assert [(o.step, o.composition, how) for o, how in w.released] == [
        (12, Composition.AGGREGATES, "expired")
    ]
    assert not w and w.steps == []


def test_a_request_that_cannot_be_rebuilt_ends_the_wait_at_once() -> None:
    w = CompositionWaits(wait_ns=100 * S, cap=8)
    assert _hold(w, 10, 2, [_decode(1, 30)])
    w.add_life(Life(8, None, 12, 100, 0, True))  # preempted (or aborted) while in it
    assert [(o.step, how) for o, how in w.released] == [(10, "unusable")]


def test_at_the_cap_the_oldest_held_step_leaves_with_its_totals() -> None:
    w = CompositionWaits(wait_ns=100 * S, cap=2)
    for n in (10, 11, 12):
        assert _hold(w, n, 2, [_decode(1, 30)])
    assert [(o.step, how) for o, how in w.released] == [(10, "capacity")]
    assert w.steps == [11, 12] and len(w) == 2
    w.release_all()  # the stream ended: no journey will come
    assert [(o.step, how) for o, how in w.released[1:]] == [(11, "ended"), (12, "ended")]
    assert not w and w.expired == 0


def test_where_waits_keep_expiring_only_a_probe_waits() -> None:
    """Sampled journeys: most batches never complete. After 64 expiries with no
    completion, one step in 64 still waits (and could prove the journeys whole again)."""
    w = CompositionWaits(wait_ns=1, cap=10_000)
    for n in range(1, 66):
        assert _hold(w, n, 2, [_decode(0, 10_000)])
        w.due(n * S + 1)
    assert w.expired == 65
    held = [_hold(w, n, 2, [_decode(0, 10_000)]) for n in range(100, 100 + 128)]
    assert sum(held) == 2
