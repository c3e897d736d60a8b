"""Batched step learning is the same computation as learning one observation at a time."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from coeffd.learners.features.config import ServingConfig
from coeffd.learners.registry import LearnerRegistry
from coeffd.records.observations import Composition, StepObservation
from coeffd.simfleet import SampleRates
from tests.support.simfleet_obs import simfleet_observations

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py


def _steps() -> list[StepObservation]:
    obs = simfleet_observations(40, 3, SampleRates(1.0, 1.0, 0.05, 100))
    return [o for o in obs if isinstance(o, StepObservation)]


def test_learn_steps_equals_one_by_one() -> None:
    steps = _steps()
    assert len(steps) > 400  # past the young phase, across many fold boundaries
    cfg = ServingConfig.from_resource(steps[0].source)
    one, many = LearnerRegistry(), LearnerRegistry()
    seq = [s for o in steps for s in one.learn(cfg, o)]
    # uneven batches, as the joiner releases them
    bat = []
    for i in range(0, len(steps), 37):
        bat.extend(many.learn_steps(cfg, steps[i : i + 37]))
    # summary-only steps are left out the same way one by one and in batches
    assert one.approximate_skipped == many.approximate_skipped < len(steps) / 10
    assert len(seq) == len(bat) == len(steps) - one.approximate_skipped
    for a, b in zip(seq, bat, strict=True):
        assert a.y == b.y and a.regime == b.regime
        assert a.predictions.keys() == b.predictions.keys()
        for k in a.predictions:
            assert np.isclose(a.predictions[k], b.predictions[k], rtol=1e-9, atol=0), k
    sa, sb = one.estimate(cfg.id), many.estimate(cfg.id)
    np.testing.assert_allclose(sa.beta, sb.beta, rtol=1e-9)
    assert sa.observations == sb.observations
    # the rolling error windows (bulk-appended per batch) hold the same rows
    assert sa.errors.keys() == sb.errors.keys()
    for target, by_source in sa.errors.items():
        for source, by_regime in by_source.items():
            for regime, stats in by_regime.items():
                other = sb.errors[target][source][regime]
                assert stats["n"] == other["n"], (target, source, regime)
                np.testing.assert_allclose(stats["mape"], other["mape"], rtol=1e-6)


def test_summary_only_steps_are_learned_only_when_nothing_better_flows() -> None:
    """Steps known only by their BATCH_SUMMARY totals have estimated terms (decode context
    from KV blocks, which prefix sharing makes too low): left out while steps with their
    requests flow, counted, and learned when they are all there is."""
    steps = _steps()
    cfg = ServingConfig.from_resource(steps[0].source)
    exact = [s for s in steps if s.requests and s.composition is not Composition.AGGREGATES]
    approx = [msgspec.structs.replace(s, composition=Composition.AGGREGATES) for s in exact]
    half = len(exact) // 2
    assert half > 1000
    # a run of 300 summary-only steps in an exact stream (a burst): the run is left out
    mixed = exact[:half] + approx[half : half + 300] + exact[half + 300 :]
    reg = LearnerRegistry()
    scored = reg.learn_steps(cfg, mixed)
    assert reg.approximate_skipped == 300 and reg.rejected == 0
    assert len(scored) == len(mixed) - 300
    # no journeys traced: the totals are what there is, and every one is learned
    only = LearnerRegistry()
    assert len(only.learn_steps(cfg, approx)) == len(approx)
    assert only.approximate_skipped == 0
