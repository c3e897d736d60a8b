"""Learning load shedding, through the real learning consumer fed by simfleet telemetry:
under backlog an evenly spread share of step observations is learned, every request
observation still is, and everything shed is counted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_app, build_consumer
from coeffd.daemon.commands.replay import replay_settings
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import BatchSummary
from coeffd.simfleet import SampleRates, run


@pytest.fixture(scope="module")
def batches() -> list[list[Any]]:
    dec = Decoder()
    out: list[list[Any]] = []
    run(
        "steady",
        60,
        3,
        rates=SampleRates(1.0, 1.0, 0.02, 100),
        trace_sinks=[lambda r: out.append(dec.decode(r).records)],
        max_events=100_000,
        drain_s=5,
    )
    return out


@pytest.fixture(scope="module")
def raw_requests() -> list[Any]:
    out: list[Any] = []

    def keep(req: Any) -> None:
        copy = type(req)()
        copy.CopyFrom(req)
        out.append(copy)

    run("steady", 30, 4, rates=SampleRates(1.0, 1.0, 0.02, 100), trace_sinks=[keep], drain_s=5)
    return out


def _learn(batches: list[list[Any]], tmp: Path, backlog: float) -> tuple[LearningConsumer, dict]:
    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp / "s")}, "state": {"state_dir": ""}},
        environ={},
    )
    reg = CollectorRegistry()
    consumer, _ = build_consumer(settings, reg, live=False)
    consumer.backlog = lambda: backlog
    for b in batches:
        consumer.consume(b)
    consumer.close()
    learned: dict[str, float] = {}
    for fam in reg.collect():
        for s in fam.samples:
            if s.name == "coeffd_learner_observations_total":
                learned[s.labels["target"]] = learned.get(s.labels["target"], 0) + s.value
            if s.name == "coeffd_observations_shed_total":
                learned["shed:" + s.labels["kind"]] = s.value
            if s.name == "coeffd_learning_keep_ratio":
                learned[s.name] = s.value
    return consumer, learned


@pytest.fixture(scope="module")
def unshed(
    batches: list[list[Any]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[LearningConsumer, dict]:
    """``batches`` learned with no backlog, once for the tests that compare with it (they
    only read the closed consumer and its counts)."""
    return _learn(batches, tmp_path_factory.mktemp("unshed"), 0.0)


def test_no_backlog_learns_everything(unshed: tuple[LearningConsumer, dict]) -> None:
    consumer, got = unshed
    assert consumer.shed == consumer.shed_requests == 0
    assert got.get("shed:step", 0) == got.get("shed:request", 0) == 0
    assert got["coeffd_learning_keep_ratio"] == 1.0
    assert got["step_period"] > 1000


@pytest.mark.parametrize("backlog", [0.3, 1.0])
def test_backlog_learns_an_even_share_of_steps_and_requests(
    batches: list[list[Any]], unshed: tuple[LearningConsumer, dict], tmp_path: Path, backlog: float
) -> None:
    _, full = unshed
    consumer, got = _learn(batches, tmp_path / "shed", backlog)
    keep = consumer.shedder.update(backlog)  # type: ignore[union-attr]
    assert keep == pytest.approx(0.515625 if backlog == 0.3 else 1 / 32)
    assert got["coeffd_learning_keep_ratio"] == pytest.approx(keep)
    total = full["step_period"]
    # every step not learned is accounted for: shed (before joining) counts at least the
    # observations missing (it also counts steps the joiner would have rejected anyway),
    # up to the few journey-pinned spans that lose a shed summary's calibration (≤ 1 %)
    missing = total - got["step_period"]
    assert got["shed:step"] == consumer.shed >= 0.99 * missing > 0

    # the share kept: within 4 binomial standard deviations of the target ratio
    def tol(n: float) -> float:
        return 4 * math.sqrt(keep * (1 - keep) / n) + 1 / n

    assert abs(got["step_period"] / total - keep) < tol(total)
    # request observations (one per request, every one built) are learned at that share
    # too, each counted when shed
    assert got["shed:request"] == consumer.shed_requests
    for target in ("finished_to_departed", "output_token"):
        n = full[target]
        assert abs(got[target] / n - keep) < tol(n)
        assert consumer.shed_requests >= n - got[target] > 0
    # α0 is learned once the engine's loop period is known; shed steps still feed that
    # estimate (their consecutive-summary period), so only its start-up may differ a bit
    n = full["arrival_to_queued"]
    assert abs(got["arrival_to_queued"] / n - keep) < tol(n) + 0.05 * keep


def test_shed_learning_still_publishes_valid_coefficients(
    batches: list[list[Any]], tmp_path: Path
) -> None:
    """Learning from 1/32 of the steps and requests still yields finite, non-negative
    vectors, α included."""
    consumer, _ = _learn(batches, tmp_path, 1.0)
    snaps = list((tmp_path / "s").rglob("latest.json"))
    assert snaps, "nothing published while shedding"
    for cid in consumer.registry.ids():
        snap = consumer.registry.estimate(cid)
        beta, alpha = np.asarray(snap.beta), np.asarray(snap.alpha)
        assert beta.shape == (11,) and np.all(np.isfinite(beta)) and np.all(beta >= 0)
        assert alpha.shape == (3,) and np.all(np.isfinite(alpha)) and np.all(alpha >= 0)
        # α is learned from the requests kept, not left at its prior
        assert {"finished_to_departed", "output_token"} <= set(snap.vectors)
        assert snap.vectors["finished_to_departed"].observations > 0


def test_replay_never_sheds(tmp_path: Path) -> None:
    """A replay waits for queue room (no sender to push back on), so a full queue is
    normal there and must not make it learn less, or sample engines."""
    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp_path / "s")}, "state": {"state_dir": ""}},
        environ={},
    )
    assert settings.pipeline.shed_learning  # the daemon's default
    app = build_app(replay_settings(settings, serve=False), live=False)
    assert isinstance(app.consumer, LearningConsumer) and app.consumer.shedder is None
    # nor skip engines: a replay reads every engine of its files
    assert settings.pipeline.sample_engines and app.consumer.sampler is None
    assert app.decoder.source_filter is None
    assert replay_settings(settings, serve=True).receivers.otlp_grpc.enabled


def test_long_ticks_lower_the_share(batches: list[list[Any]], tmp_path: Path) -> None:
    """Ticks over budget lower the share even with an empty queue (long ticks delay every
    snapshot); ticks within it let the share recover."""
    settings = load_settings(
        overrides={
            "publish": {"snapshot_dir": str(tmp_path / "s")},
            "state": {"state_dir": ""},
            "pipeline": {"shed_tick_budget": 0.001, "tick_interval_seconds": 0.001},
        },
        environ={},
    )  # a 1 µs budget: every real tick is far over it
    consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
    consumer.backlog = lambda: 0.0
    shedder = consumer.shedder
    assert shedder is not None and shedder.tick_budget_s == pytest.approx(1e-6)
    for b in batches[:50]:
        consumer.consume(b)
        consumer.tick(0.0)
    assert shedder.update(0.0) == shedder.min_keep  # driven down to the floor
    shedder.tick_budget_s = 10.0  # now every tick is well within budget
    for _ in range(8):
        consumer.tick(0.0)
    assert shedder.update(0.0) == 1.0
    consumer.close()


def test_partial_decoding_of_shed_steps_changes_no_learning(
    raw_requests: list[Any], tmp_path: Path
) -> None:
    """The consumer's decoders read the steps it sheds partially; what is learned is
    exactly what full decoding gives at the same share, and nothing partial is learned."""
    results = []
    for wired in (False, True):
        settings = load_settings(
            overrides={
                "publish": {"snapshot_dir": str(tmp_path / str(wired))},
                "state": {"state_dir": ""},
            },
            environ={},
        )
        consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
        consumer.backlog = lambda: 1.0  # the 1/32 floor all along
        dec = Decoder()
        if wired:
            consumer.decoders.append(dec)
        partial = summaries = 0
        for req in raw_requests:
            records = dec.decode(req).records
            for r in records:
                if isinstance(r, BatchSummary):
                    summaries += 1
                    partial += r.partial
            consumer.consume(records)
        consumer.close()  # flushes the joiner's window into the learners
        snaps = {cid: consumer.registry.estimate(cid) for cid in consumer.registry.ids()}
        results.append((partial, summaries, consumer.shed, snaps))
    (p0, n0, shed0, full), (p1, n1, shed1, part) = results
    assert p0 == 0 and n0 == n1 > 1000
    # all but the first request's summaries are read under the 1/32 share
    assert p1 / n1 == pytest.approx(31 / 32, abs=4 * math.sqrt(31 / 32**2 / n1) + 0.02)
    assert shed1 == shed0 > 0
    assert full.keys() == part.keys() and full
    for cid, snap in full.items():
        assert part[cid].observations == snap.observations > 0
        assert part[cid].beta == snap.beta and part[cid].alpha == snap.alpha


def test_partial_summaries_are_never_learned(raw_requests: list[Any], tmp_path: Path) -> None:
    """A summary decoded partially while shedding stays shed even if the share is back
    to 1 when its step is finalized."""
    dec = Decoder()
    dec.step_filter = lambda n: n % 4 == 0
    batches = [dec.decode(r).records for r in raw_requests]
    partial = sum(1 for b in batches for r in b if isinstance(r, BatchSummary) and r.partial)
    consumer, got = _learn(batches, tmp_path, 0.0)  # no backlog: the consumer sheds nothing
    assert got["coeffd_learning_keep_ratio"] == 1.0
    assert consumer.shed == partial > 0
    _, full = _learn([Decoder().decode(r).records for r in raw_requests], tmp_path / "f", 0.0)
    assert 0 < got["step_period"] <= full["step_period"] / 4 + 1


def test_shedding_warns_only_when_really_behind(tmp_path: Path) -> None:
    """Issue 19: a long tick trims the keep ratio to ~0.98 with an empty queue — routine,
    not worth a warning; real shedding warns once, and catching up is info, not a warning."""
    from structlog.testing import capture_logs

    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp_path / "s")}, "state": {"state_dir": ""}},
        environ={},
    )
    consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
    backlog = [0.0]
    consumer.backlog = lambda: backlog[0]
    shedder = consumer.shedder
    assert shedder is not None
    budget = shedder.tick_budget_s
    with capture_logs() as logs:
        shedder.observe_tick(budget * 1.04)  # one slightly long tick: share ~0.98
        consumer.consume([])
        assert 0.9 < shedder.ratio < 1.0
        assert not [e for e in logs if "shedding" in e["event"]], logs
        backlog[0] = 1.0  # the queue is full: learning really is behind
        consumer.consume([])
        consumer.consume([])
        backlog[0] = 0.0
        for _ in range(10):
            shedder.observe_tick(budget / 100)
        consumer.consume([])
    assert shedder.ratio == 1.0
    behind = [e for e in logs if e["event"].startswith("learning behind")]
    caught_up = [e for e in logs if e["event"].startswith("learning caught up")]
    assert [e["log_level"] for e in behind] == ["warning"]
    assert [e["log_level"] for e in caught_up] == ["info"]
