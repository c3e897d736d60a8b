"""Delivery robustness: shuffled, duplicated and delayed exports give the same
observations; the window stays bounded on an endless stream; idle gaps never become
periods."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from dataclasses import replace

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.joiner.engine import EngineState
from coeffd.records.events import Source
from coeffd.records.observations import (
    KVTransferObservation,
    Observation,
    PeriodMethod,
    RequestObservation,
    StepObservation,
)
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate


def _key(o: Observation) -> tuple:
    if isinstance(o, StepObservation):
        return ("step", o.source.id, o.step)
    if isinstance(o, RequestObservation):
        return ("request", o.source.id, o.request_id)
    assert isinstance(o, KVTransferObservation)
    return ("kv", o.source.id, o.dp_rank, o.transfer_id)


def _run(batches: list[Batch], cfg: JoinerConfig, registry: CollectorRegistry | None = None):
    j = Joiner(cfg, registry)
    out: list[Observation] = []
    for _, recs in batches:
        out += j.push_many(recs)
    out += j.flush()
    return j, {_key(o): msgspec.json.encode(o) for o in out}, out


def _perturb(batches: list[Batch], seed: int, max_delay_s: float) -> list[Batch]:
    """Delay each export by up to ``max_delay_s``, resend ~10 % of them (exporter
    retries), then deliver in the new time order."""
    rng = random.Random(seed)
    out = []
    for t, recs in batches:
        out.append((t + int(rng.random() * max_delay_s * S_NS), recs))
        if rng.random() < 0.1:
            out.append((t + int(rng.random() * 2 * max_delay_s * S_NS), list(recs)))
    out.sort(key=lambda b: b[0])
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_shuffled_duplicated_delayed_give_same_observations(async_scheduling: bool) -> None:
    cfg_s = SynthConfig(
        duration_s=15,
        async_scheduling=async_scheduling,
        step_rate=0.2,
        rich_rate=0.1,
        rate_per_s=30,
        idle_every_s=5,
        kv_offload=True,
        tp=2,
        seed=3,
    )
    batches, _ = generate(cfg_s)
    # exports are delayed by up to 16 s below (retries): the loop waits are decided after
    # that, like everything else in the window, so every order gives the same answer
    cfg = JoinerConfig(window_s=60, loop_wait_delay_s=30)
    _, base, base_out = _run(batches, cfg)
    assert len(base) > 50
    assert {k[0] for k in base} == {"step", "request", "kv"}
    # journey-pinned spans and loop waits (decided a data-time window later) are covered
    assert any(
        isinstance(o, StepObservation) and o.period_method is PeriodMethod.JOURNEY_SPAN
        for o in base_out
    )
    assert any(isinstance(o, RequestObservation) and o.queued_loop_wait_us for o in base_out)
    for seed in range(3):
        j, got, _ = _run(_perturb(batches, seed, max_delay_s=8.0), cfg)
        assert got == base
        assert j.metrics.outcomes[("request", "duplicate")] > 0
    # fully reversed arrival order inside the window: still the same
    _, rev, _ = _run(list(reversed(batches)), cfg)
    assert rev == base


def test_duplicate_spans_counted_and_change_nothing() -> None:
    batches, _ = generate(SynthConfig(duration_s=5, rate_per_s=10, step_rate=0.5, seed=5))
    cfg = JoinerConfig(window_s=60)
    _, base, _ = _run(batches, cfg)
    doubled = [b for b in batches for _ in range(2)]
    reg = CollectorRegistry()
    j, got, _ = _run(doubled, cfg, reg)
    assert got == base
    n_req = sum(1 for k in base if k[0] == "request")
    # each request's API and core span came twice
    assert j.metrics.outcomes[("request", "duplicate")] == 2 * n_req
    v = reg.get_sample_value(
        "coeffd_join_outcomes_total", {"observation": "request", "outcome": "duplicate"}
    )
    assert v == 2 * n_req
    assert reg.get_sample_value("coeffd_observations_total", {"observation": "request"}) == n_req


def _endless(cfg_s: SynthConfig, chunks: int) -> Iterator[Batch]:
    """Consecutive synthetic runs on one timeline (fresh ids, the same engine)."""
    for i in range(chunks):
        batches, _ = generate(replace(cfg_s, seed=cfg_s.seed + 1000 * i))
        shift = int(i * cfg_s.duration_s * S_NS)
        for t, recs in batches:
            yield t + shift, [_shift_record(r, shift, i) for r in recs]


def _shift_record(r, shift: int, i: int, renumber: bool = True):
    """Move a record ``shift`` ns later on both clocks and (optionally) renumber its steps."""
    i = i if renumber else 0
    fields = {}
    for f in type(r).__struct_fields__:
        v = getattr(r, f)
        if f in ("wall_ns", "mono_ns", "start_mono_ns", "end_mono_ns"):
            v = v + shift
        elif (f in ("step",) and isinstance(v, int)) or (
            f in ("range_start", "range_end") and isinstance(v, int)
        ):
            v = v + i * 1_000_000
        elif f == "span":
            v = msgspec.structs.replace(
                v, start_wall_ns=v.start_wall_ns + shift, end_wall_ns=v.end_wall_ns + shift
            )
        elif f == "batch":
            v = msgspec.structs.replace(v, wall_ns=v.wall_ns + shift)
        elif f == "scheduler_step" and isinstance(v, int):
            v = v + i * 1_000_000
        fields[f] = v
    return type(r)(**fields)


def test_endless_stream_memory_stays_within_window() -> None:
    """A long stream (20 windows) keeps entries flat: bounded by rate × window."""
    cfg_s = SynthConfig(
        duration_s=10, rate_per_s=40, step_rate=0.3, rich_rate=0.05, kv_offload=True
    )
    cfg = JoinerConfig(window_s=2.0)
    j = Joiner(cfg)
    peaks: list[int] = []
    n_obs = 0
    for k, (_, recs) in enumerate(_endless(cfg_s, chunks=4)):
        n_obs += len(j.push_many(recs))
        if k % 50 == 0:
            e = j.entries()
            peaks.append(sum(e.values()))
    assert n_obs > 0
    half = len(peaks) // 2
    # flat: the second half never holds more than the first half's peak (+ slack)
    assert max(peaks[half:]) <= 1.5 * max(peaks[:half]) + 50
    # and the request window holds at most ~rate × (window + export delay) entries
    assert j.entries().get("request", 0) <= 40 * (2.0 + 5.0) * 2


def test_window_step_state_is_not_tracked_by_the_cyclic_gc() -> None:
    """A loaded daemon holds hundreds of thousands of per-step anchors and request lives;
    as GC-tracked objects they made every full collection a ~0.3 s pause. They hold no
    references, so they must stay out of the collector's sight."""
    cfg_s = SynthConfig(duration_s=10, rate_per_s=40, step_rate=0.3, rich_rate=0.05)
    j = Joiner(JoinerConfig(window_s=30.0))
    batches, _ = generate(cfg_s)
    for _, recs in batches:
        j.push_many(recs)
    gc.collect()  # tuples of ints leave tracking at their first collection
    engines = list(j._engines.values())
    anchors = [t for e in engines for d in e.anchors for t in d.values()]
    lives = [life for e in engines for b in e.lives.values() for life in b]
    assert len(anchors) > 100 and len(lives) > 50
    assert not any(gc.is_tracked(x) for x in anchors + lives)


def test_caps_bound_entries_even_without_watermark_progress() -> None:
    batches, _ = generate(SynthConfig(duration_s=10, rate_per_s=50, step_rate=1.0))
    cfg = JoinerConfig(window_s=1e6, max_requests=50, max_steps=200, max_anchor_steps=300)
    j = Joiner(cfg)
    for _, recs in batches:
        j.push_many(recs)
        j.tick()
        e = j.entries()
        assert e.get("request", 0) <= 50
        assert e.get("step_summary", 0) <= 200
    assert j.metrics.outcomes[("step", "expired")] > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_no_period_across_idle_gap(async_scheduling: bool) -> None:
    """Quiet phases of 2 s every 4 s: every emitted period matches the truth."""
    cfg_s = SynthConfig(
        duration_s=20,
        async_scheduling=async_scheduling,
        step_rate=1.0,
        rate_per_s=15,
        idle_every_s=4,
        idle_for_s=2,
        seed=11,
    )
    batches, truth = generate(cfg_s)
    _, _, out = _run(batches, JoinerConfig(window_s=60))
    steps = [o for o in out if isinstance(o, StepObservation)]
    assert steps
    for o in steps:
        assert o.step in truth.period_us, f"period for empty step {o.step}"
        assert abs(o.period_us - truth.period_us[o.step]) <= o.period_uncertainty_us + 1e-3
        assert o.period_us < 1000 * 1000  # never an idle gap (~2 s)


def test_engine_restart_same_identity() -> None:
    """Step ids start again at 1 after a restart: the second run is not dropped as late."""
    cfg_s = SynthConfig(duration_s=8, rate_per_s=20, step_rate=1.0, seed=21)
    a, truth_a = generate(cfg_s)
    b, truth_b = generate(replace(cfg_s, seed=22))
    shift = 30 * S_NS
    stream = a + [
        (t + shift, [_shift_record(r, shift, 1, renumber=False) for r in recs]) for t, recs in b
    ]
    j = Joiner(JoinerConfig(window_s=5.0))
    out = []
    for _, recs in stream:
        out += j.push_many(recs)
    out += j.flush()
    steps = [o for o in out if isinstance(o, StepObservation)]
    second = [o for o in steps if o.start_mono_ns >= min(truth_b.start_ns.values()) + shift]
    first = [o for o in steps if o not in second]
    assert len(first) > 100 and len(second) > 100
    for o in first:
        assert abs(o.period_us - truth_a.period_us[o.step]) <= o.period_uncertainty_us
    for o in second:
        assert abs(o.period_us - truth_b.period_us[o.step]) <= o.period_uncertainty_us


def test_push_one_by_one_equals_push_many() -> None:
    batches, _ = generate(
        SynthConfig(duration_s=6, rate_per_s=20, step_rate=0.3, rich_rate=0.1, seed=31)
    )
    cfg = JoinerConfig(window_s=60)
    _, base, _ = _run(batches, cfg)
    j = Joiner(cfg)
    out: list[Observation] = []
    for _, recs in batches:
        for r in recs:
            out += j.push(r)
    out += j.tick()
    out += j.flush()
    assert {_key(o): msgspec.json.encode(o) for o in out} == base


def test_tick_with_wall_clock_finalizes_an_idle_engine() -> None:
    """No more data arrives: a live tick(now) completes what the window was holding
    (the source idle since the tick that last saw its data advance)."""
    batches, _ = generate(SynthConfig(duration_s=4, rate_per_s=20, step_rate=0.5, seed=32))
    j = Joiner(JoinerConfig(window_s=5))
    got = []
    for _, recs in batches:
        got += j.push_many(recs)
    last_wall = max(t for t, _ in batches)
    got += j.tick(last_wall)  # the data arrived by now
    got += j.tick(last_wall + 60 * S_NS)
    assert any(isinstance(o, StepObservation) for o in got)
    # steps with requests the stream cut off wait for their journeys until
    # composition_wait_s (max_lateness_s) after their summary, then leave on the clock too
    assert j.metrics.composition_waits["expired"] == 0
    got += j.tick(last_wall + 360 * S_NS)
    assert j.metrics.composition_waits["expired"] > 0
    assert j.flush() == []  # nothing was left waiting


def test_two_engines_behind_one_identity_give_no_step_observations() -> None:
    """DP=2 without a per-process resource attribute: step ids collide (spec §7.5)."""
    a, _ = generate(SynthConfig(duration_s=5, step_rate=0.5, seed=41))
    b, _ = generate(SynthConfig(duration_s=5, step_rate=0.5, seed=42))
    shift = 3_000_001  # a different mono history, same source id
    b = [(t, [_shift_record(r, shift, 0, renumber=False) for r in recs]) for t, recs in b]
    merged = sorted(a + b, key=lambda x: x[0])
    j, _, out = _run(merged, JoinerConfig(window_s=60))
    assert not [o for o in out if isinstance(o, StepObservation)]
    assert j.metrics.reasons[("step", "rejected", "ambiguous_source")] > 0


def test_expiry_reaches_the_newest_sightings_of_an_idle_engine() -> None:
    """The newest timeline bucket (held apart from the others) expires too once the
    engine falls silent, so its steps leave the window."""
    eng = EngineState(Source("idle", ()), JoinerConfig(window_s=1.0))
    w = 10**18
    for i in range(1, 6):  # five steps within one 50 ms bucket
        eng._first_sighting(w + i * 1_000_000, 100 + i)
    eng.expire(w + 500_000_000)  # the bucket is still inside the window
    assert eng.horizon == 0
    eng.expire(w + 2_000_000_000)
    assert eng.horizon == 105 - 2  # below the newest step seen, like every bucket


def test_engines_that_fall_silent_are_forgotten() -> None:
    """Engines come and go (replicas replaced, pods renamed): an engine silent for
    ``max_lateness_s`` of the fleet's data (here two windows) leaves no state behind, so
    memory follows the live engines, not all ever seen."""
    window = 5.0
    j = Joiner(JoinerConfig(window_s=window, max_lateness_s=2 * window))
    held = []
    for i in range(12):  # a new engine identity every 3 s of data, each sending 3 s
        batches, _ = generate(
            SynthConfig(duration_s=3, rate_per_s=20, step_rate=0.3, engine_name=f"e{i}", seed=i)
        )
        shift = int(i * 3 * S_NS)
        for _, recs in batches:
            j.push_many([_shift_record(r, shift, 0, renumber=False) for r in recs])
        held.append((len(j._engines), j.entries().get("step_summary", 0)))
    j.tick()
    # engines heard from within about two windows (one sending, the rest draining)
    assert max(n for n, _ in held) <= 2 + int(2 * window / 3)
    assert held[-1][1] <= 2 * max(s for _, s in held[:4])
