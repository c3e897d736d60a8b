"""The learning consumer puts per-observation metrics into their families at the tick."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.settings import load_settings
from coeffd.records.observations import RequestObservation
from coeffd.simfleet import SampleRates
from tests.support.simfleet_obs import simfleet_observations


def _requests() -> list[RequestObservation]:
    obs = simfleet_observations(8, 2, SampleRates(1.0, 0.01, 0.0, 100))
    return [o for o in obs if isinstance(o, RequestObservation)]


def _total(reg: CollectorRegistry, name: str) -> float:
    return sum(s.value for f in reg.collect() for s in f.samples if s.name == name)


def test_request_metrics_are_counted_at_the_flush(tmp_path: Path) -> None:
    reqs = _requests()
    assert len(reqs) > 20
    settings = load_settings(
        overrides={"publish": {"snapshot_dir": str(tmp_path)}, "state": {"state_dir": ""}},
        environ={},
    )
    reg = CollectorRegistry()
    consumer, _ = build_consumer(settings, reg, live=False)
    consumer.learn(reqs, 0.0)
    learned = "coeffd_learner_observations_total"
    errors = "coeffd_prediction_relative_error_ratio_count"
    assert _total(reg, learned) == 0 and _total(reg, errors) == 0  # not yet: at the tick
    consumer.flush_metrics()
    # one count per scored target of every request: what the evaluator scored
    n = _total(reg, learned)
    ev, cid = consumer.registry.evaluator, consumer.registry.ids()[0]
    scored = sum(ev.summary(cid, t)["learned"]["all"]["n"] for t in ev.targets(cid))
    assert n == scored >= len(reqs) == consumer.observations
    assert _total(reg, errors) >= n  # learned and BLIS's default, at least
    consumer.flush_metrics()  # nothing new: nothing added
    assert _total(reg, learned) == n
    consumer.tick(1.0)  # the tick flushes what was learned since
    consumer.learn(reqs[:5], 1.0)
    consumer.close()
    assert _total(reg, learned) > n
