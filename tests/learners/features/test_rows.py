"""features.rows: the terms of many steps at once are the one-step functions' terms."""

from __future__ import annotations

import msgspec
import numpy as np

from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.features.extended import extended_terms
from coeffd.learners.features.observe import step_features
from coeffd.learners.features.rows import step_rows
from coeffd.learners.linalg import spd_solve
from coeffd.records.observations import Composition, StepObservation
from coeffd.simfleet import SampleRates
from tests.support.simfleet_obs import simfleet_observations


def _steps(seconds: float = 6.0) -> list[StepObservation]:
    obs = simfleet_observations(seconds, 5, SampleRates(1.0, 1.0, 0.05, 100))
    return [o for o in obs if isinstance(o, StepObservation)]


def test_step_rows_equal_the_one_step_terms() -> None:
    steps = _steps()
    assert len(steps) > 150
    cfg = ServingConfig.from_resource(steps[0].source)
    basis = BasisResolver().basis(cfg)
    # every kind of row: exact, summary-only, a journey span of two batches, an empty one
    two = msgspec.structs.replace(steps[10], more_batches=(steps[11].requests, ()))
    summary = msgspec.structs.replace(steps[12], composition=Composition.AGGREGATES)
    bare = msgspec.structs.replace(steps[13], requests=(), composition=Composition.AGGREGATES)
    rows = [*steps, two, summary, bare]
    x, xe = step_rows(rows, basis, cfg, extended=True)
    want = np.array([step_features(o, basis, block_size=cfg.block_size) for o in rows])
    want_e = np.array([extended_terms(o, basis, cfg) for o in rows])
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-9)
    np.testing.assert_array_equal(np.isnan(xe), np.isnan(want_e))
    np.testing.assert_allclose(xe, want_e, rtol=1e-15, atol=0)
    assert np.isnan(xe[-3]).all() and not np.isnan(xe[:-3]).any()
    x_only, none = step_rows(rows, basis, cfg, extended=False)
    assert none is None and np.array_equal(x_only, x)


def test_spd_solve_is_numpy_linalg_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for d in (1, 4, 11, 21):
        m = rng.normal(size=(3 * d, d))
        a, b = m.T @ m + 1e-3 * np.eye(d), rng.normal(size=d)
        c = np.linalg.cholesky(a)
        got = spd_solve(a, b)
        assert got is not None
        assert np.array_equal(got, np.linalg.solve(c.T, np.linalg.solve(c, b)))
    assert spd_solve(-np.eye(3), np.ones(3)) is None
