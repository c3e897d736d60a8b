"""Engine sampling (daemon.load): the rules of the sampler, the decoder's skip and
count, and the learning consumer fed by a fleet of simfleet engines while it samples."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.load.sampling import EngineSampler, engine_hash
from coeffd.daemon.settings import SettingsError, load_settings
from coeffd.receivers.otlp.decode import Decoder
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import Source
from coeffd.simfleet import SampleRates, replica, run

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def idle() -> float:
    """A CPU clock that never advances: the CPU rule stays out of tests of the others."""
    return 0.0


def _src(engine: str, model: str = "m") -> Source:
    return source_from_attributes({"coeffd.model": model, "coeffd.engine": engine})


def _halve(s: EngineSampler, clock: Clock, times: int) -> None:
    for i in range(times):
        clock.t += s.down_hold_s
        s.update(0.7 + 0.01 * i, 1 / 32)


# ------------------------------------------------------------------ sampler rules
def test_kept_share_is_even_and_nested() -> None:
    clock = Clock()
    s = EngineSampler(min_engines=1, clock=clock, cpu_clock=idle, worker_clock=idle)
    engines = [_src(f"e{i}") for i in range(4000)]
    kept: list[set[str]] = []
    for halvings in range(4):
        _halve(s, clock, 1 if halvings else 0)
        kept.append({e.get("coeffd.engine") for e in engines if s.keep(e)})  # type: ignore[misc]
    assert len(kept[0]) == 4000
    for k in range(1, 4):
        p, n = 0.5**k, len(engines)
        assert s.share == p or k < 3
        # within 4 binomial σ of the share (+1: the configuration's floor engine)
        assert abs(len(kept[k]) - p * n) <= 4 * math.sqrt(n * p * (1 - p)) + 1
        assert kept[k] <= kept[k - 1]  # halving only drops engines


def test_every_configuration_keeps_its_floor() -> None:
    clock = Clock()
    s = EngineSampler(
        min_engines=2, min_share=1 / 64, clock=clock, cpu_clock=idle, worker_clock=idle
    )
    groups = {f"model{g}": [_src(f"g{g}-e{i}", f"model{g}") for i in range(3)] for g in range(60)}
    _halve(s, clock, 10)
    assert s.share == 1 / 64
    for members in groups.values():
        kept = [m for m in members if s.keep(m)]
        assert len(kept) >= 2
        # the floor is the configuration's lowest-hash engines
        by_hash = sorted(members, key=lambda m: engine_hash(str(m.get("coeffd.engine"))))
        assert (
            by_hash[:2] == sorted(kept, key=lambda m: engine_hash(str(m.get("coeffd.engine"))))[:2]
        )


def test_kv_streams_follow_their_engines_spans() -> None:
    clock = Clock()
    s = EngineSampler(min_engines=1, clock=clock, cpu_clock=idle, worker_clock=idle)
    engines = [_src(f"e{i}") for i in range(300)]
    _halve(s, clock, 3)
    for e in engines:  # their spans arrive (and register them)
        s.keep(e)
    decided = [s.keep(e) for e in engines]
    assert decided == [s.keep_engine(str(e.get("coeffd.engine"))) for e in engines]
    assert 0 < sum(decided) < len(engines)


def test_share_halves_only_while_the_backlog_rises_and_recovers_when_calm() -> None:
    clock = Clock()
    s = EngineSampler(
        high=0.6,
        low=0.1,
        down_hold_s=1.0,
        up_hold_s=60.0,
        clock=clock,
        cpu_clock=idle,
        worker_clock=idle,
    )
    clock.t = 1.0
    assert s.update(0.7, 1 / 32) == 0.5
    clock.t = 1.5
    assert s.update(0.9, 1 / 32) == 0.5  # within the hold
    clock.t = 2.5
    assert s.update(0.65, 1 / 32) == 0.5  # high but falling: the last halving is working
    assert s.update(0.5, 1 / 32) == 0.5  # between the marks: hold
    clock.t = 3.5
    assert s.update(0.8, 1 / 32) == 0.25
    # calm but learning still below half of the steps: no recovery
    for t in range(4, 200, 5):
        clock.t = t
        assert s.update(0.05, 0.3) == 0.25
    # calm with learning at half or more, for up_hold_s: doubles, one step at a time
    clock.t = 200
    assert s.update(0.05, 0.6) == 0.25
    clock.t = 259
    assert s.update(0.05, 0.6) == 0.25
    clock.t = 261
    assert s.update(0.05, 0.6) == 0.5
    clock.t = 300
    s.update(0.3, 0.6)  # a busy spell resets the calm
    clock.t = 330
    assert s.update(0.05, 0.6) == 0.5
    clock.t = 389
    assert s.update(0.05, 0.6) == 0.5
    clock.t = 391
    assert s.update(0.05, 1.0) == 1.0
    clock.t = 500
    assert s.update(0.05, 1.0) == 1.0  # never above 1


def test_full_receivers_halve_the_share_once_learning_is_at_its_floor() -> None:
    """With the queue short, receivers whose worker pool is full most of the time while
    step learning is at its floor are behind: the share halves, once per measured second
    after each change has settled. It recovers only with the CPU at most half of
    ``cpu_high`` (doubling the share at most doubles it)."""
    clock, cpu = Clock(), Clock()
    full = [0.0]
    s = EngineSampler(
        cpu_high=0.9,
        step_floor=1 / 32,
        up_hold_s=10.0,
        clock=clock,
        cpu_clock=cpu,
        receivers_full=lambda: full[0],
    )

    def second(pool_full: float, ratio: float, busy: float = 0.97) -> float:
        clock.t += 1.0
        cpu.t += busy
        full[0] = pool_full
        return s.update(0.05, ratio)

    assert [second(0.9, 0.25) for _ in range(5)] == [1.0] * 5  # steps still sheddable
    assert [second(0.3, 1 / 32) for _ in range(5)] == [1.0] * 5  # busy, not behind
    shares = [second(0.9, 1 / 32) for _ in range(14)]
    # halvings 6 s apart: seconds starting within cpu_settle_s (5) of a change don't count
    assert shares == [0.5] * 6 + [0.25] * 6 + [0.125] * 2
    # calm queue and pool, learning back at half, but the CPU at 0.6 (> 0.45): no recovery
    assert {second(0.0, 0.6, busy=0.6) for _ in range(30)} == {0.125}
    # with the CPU at 0.3, after up_hold_s: doubles
    assert second(0.0, 0.6, busy=0.3) == 0.125
    assert [second(0.0, 0.6, busy=0.3) for _ in range(11)][-1] == 0.25


def test_a_saturated_core_halves_the_share_while_the_worker_costs_enough() -> None:
    """With the pool not full (the gRPC poller itself may be starved) but the core
    saturated at the step floor, the share halves while the worker's own CPU is worth
    halving; once the CPU is mostly receiving, it rests."""
    clock, cpu, worker = Clock(), Clock(), Clock()
    s = EngineSampler(cpu_high=0.9, clock=clock, cpu_clock=cpu, worker_clock=worker)

    def second(busy: float, worker_busy: float, ratio: float = 1 / 32) -> float:
        clock.t += 1.0
        cpu.t += busy
        worker.t += worker_busy
        return s.update(0.05, ratio)

    assert {second(0.97, 0.5, ratio=0.3) for _ in range(8)} == {1.0}  # steps sheddable
    assert {second(0.8, 0.5) for _ in range(8)} == {1.0}  # core not saturated
    # learning dips to its floor within each second but not for a whole one: busy
    for _ in range(8):
        for ratio in (0.2, 1 / 32):
            clock.t += 0.5
            cpu.t += 0.5
            worker.t += 0.3
            assert s.update(0.05, ratio) == 1.0
    assert [second(0.97, 0.5) for _ in range(7)] == [0.5] * 6 + [0.25]
    assert {second(0.97, 0.1) for _ in range(20)} == {0.25}  # the worker costs little


def test_share_stops_at_min_share() -> None:
    clock = Clock()
    s = EngineSampler(min_share=1 / 8, clock=clock, cpu_clock=idle, worker_clock=idle)
    _halve(s, clock, 10)
    assert s.share == 1 / 8


def test_idle_engines_leave_the_floor() -> None:
    """A configuration whose floor engines went away hands the floor to live ones, so it
    keeps learning however the fleet changes."""
    clock = Clock()
    s = EngineSampler(
        min_engines=1,
        min_share=1 / 64,
        idle_s=100.0,
        clock=clock,
        cpu_clock=idle,
        worker_clock=idle,
    )
    members = sorted(
        (_src(f"e{i}") for i in range(40)), key=lambda m: engine_hash(str(m.get("coeffd.engine")))
    )
    for m in members:
        s.keep(m)
    _halve(s, clock, 8)
    assert s.keep(members[0])
    survivors = members[20:]  # the low-hash half stops sending
    for _ in range(30):
        clock.t += 10
        for m in survivors:
            s.keep(m)
        s.update(0.3, 1.0)
    kept = [m for m in survivors if s.keep(m)]
    assert members[20] in kept  # the lowest-hash live engine now holds the floor
    assert s.engines()[1] == 20  # the idle ones are forgotten


def test_concurrent_receivers_and_worker() -> None:
    """Receiver threads registering and consulting while the worker steers and expires:
    no exception, and the decision for an engine is the same whichever thread asks."""
    clock = Clock()
    s = EngineSampler(min_engines=1, idle_s=0.5, clock=clock, cpu_clock=idle, worker_clock=idle)
    errors: list[BaseException] = []
    stop = threading.Event()

    def receiver(k: int) -> None:
        try:
            i = 0
            while not stop.is_set():
                s.keep(_src(f"t{k}-{i % 500}", f"m{i % 7}"))
                i += 1
        except BaseException as e:  # the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=receiver, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for i in range(3000):
        clock.t += 0.01
        s.update(0.7 if i % 600 < 300 else 0.0, 1.0)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    probe = _src("t0-1", "m1")
    assert s.keep(probe) == s.keep(probe) == s.keep_engine("t0-1")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sample_engines_min_share", 0.0),
        ("sample_engines_min_per_config", 0),
        ("sample_engines_cpu", -1.0),
        ("sample_engines_recover_seconds", float("nan")),
        ("sample_engines_at", "high"),
    ],
)
def test_bad_sampling_settings_fail_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(SettingsError, match=rf"pipeline.*{key}"):
        load_settings(overrides={"pipeline": {key: value}}, environ={})


def test_sample_engines_at_must_be_above_shed_start() -> None:
    with pytest.raises(
        SettingsError,
        match=r"pipeline\.sample_engines_at \(0\.05\) must be above pipeline\.shed_start",
    ):
        load_settings(
            overrides={"pipeline": {"sample_engines_at": 0.05, "shed_start": 0.1}}, environ={}
        )


# ------------------------------------------------------------------ decoder + consumer
#: Engines in the sampled fleet (copies of one).
ENGINES = 20


@pytest.fixture(scope="module")
def fleet() -> list[bytes]:
    """ENGINES engines of one configuration: simfleet's ``steady`` engine, copied with new
    engine names and ids (as a fleet behind a collector sends)."""
    base: list[ExportTraceServiceRequest] = []

    def keep(req: Any) -> None:
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(req)
        base.append(copy)

    run("steady", 20, 5, rates=SampleRates(1.0, 1.0, 0.02, 100), trace_sinks=[keep], drain_s=5)
    out: list[bytes] = []
    for req in base:  # interleaved, as they would arrive
        for k in range(ENGINES):
            out.append(replica(req, k).SerializeToString())
    return out


def test_decoder_counts_what_it_skips(fleet: list[bytes]) -> None:
    full, sampled = Decoder(), Decoder()
    skip = {f"~{k}" for k in range(0, ENGINES, 3)}
    sampled.source_filter = lambda src: not str(src.get("coeffd.engine")).endswith(tuple(skip))
    kept = out = 0
    for body in fleet[:400]:
        a, b = full.decode_bytes(body), sampled.decode_bytes(body)
        everything = len(a.records) + a.ignored + a.rejected
        if b.sampled_out:
            assert not b.records and b.sampled_out == everything
            out += 1
        else:
            assert b.records == a.records and b.ignored == a.ignored
            kept += 1
    assert kept and out


def _learn_fleet(fleet: list[bytes], tmp: Path, overload: bool) -> tuple[LearningConsumer, int]:
    """Decode and learn ``fleet`` through the daemon's consumer, its decoder consulting its
    sampler; ``overload``: the queue fill rises past sample_engines_at for the first
    rounds. Returns the consumer and the events the decoder sampled out."""
    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp)}, "state": {"state_dir": ""}},
        environ={},
    )
    consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
    clock = Clock()
    consumer.sampler = EngineSampler(min_engines=2, clock=clock, cpu_clock=idle, worker_clock=idle)
    dec = Decoder()
    dec.source_filter = consumer.sampler.keep
    consumer.decoders.append(dec)
    fill = [0.0]
    consumer.backlog = lambda: fill[0]
    sampled_out = 0
    for i, body in enumerate(fleet):
        if overload and i < ENGINES * 4:
            clock.t += 1.0
            fill[0] = 0.6 + 0.01 * i
        else:
            fill[0] = 0.0
        res = dec.decode_bytes(body)
        sampled_out += res.sampled_out
        consumer.consume(res.records)
    consumer.close()
    return consumer, sampled_out


def test_consumer_learns_from_the_kept_engines_only(fleet: list[bytes], tmp_path: Path) -> None:
    """Overloaded (queue fill rising past sample_engines_at), the consumer samples engines:
    the decoder then skips the others entirely, every configuration still learns, and the
    published vectors stay valid and agree with what the whole fleet gives."""
    everyone, _ = _learn_fleet(fleet, tmp_path / "all", overload=False)
    sampler_consumer, sampled_out = _learn_fleet(fleet, tmp_path / "sampled", overload=True)
    sampler = sampler_consumer.sampler
    assert sampler is not None and sampler.share < 1 / 4
    kept, known = sampler.engines()
    p = sampler.share  # the floor (2) + within 4 binomial σ of the share
    n = ENGINES
    assert known == n and 2 <= kept <= 2 + n * p + 4 * math.sqrt(n * p * (1 - p))
    assert sampled_out > 0
    (cid,) = everyone.registry.ids()
    assert sampler_consumer.registry.ids() == [cid]
    a, b = everyone.registry.estimate(cid), sampler_consumer.registry.estimate(cid)
    n_all = a.vectors["beta"].observations
    n_sampled = b.vectors["beta"].observations
    assert 0 < n_sampled < n_all * (kept + 1) / n
    beta_b = np.asarray(b.beta)
    assert beta_b.shape == (11,) and np.all(np.isfinite(beta_b)) and np.all(beta_b >= 0)
    # the kept engines run the same physics: each β the whole fleet identifies agrees
    # within 4 of the two estimates' combined standard errors
    va, vb = a.vectors["beta"], b.vectors["beta"]
    for i, ident in enumerate(va.identified):
        if ident and vb.identified[i]:
            tol = 4 * math.hypot(va.std[i], vb.std[i])
            assert abs(va.values[i] - vb.values[i]) <= tol, (
                va.names[i],
                va.values[i],
                vb.values[i],
                tol,
            )
