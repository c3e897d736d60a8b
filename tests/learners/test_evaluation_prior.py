"""Prequential evaluation, batch-refit baseline, pooled prior, settings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coeffd.learners.config import LearnersConfig
from coeffd.learners.evaluation import Evaluator, RollingError, WindowedRefit, step_regime
from coeffd.learners.features import BLIS_DEFAULT_BETA
from coeffd.learners.prior import PooledPrior, prior_precision


def test_rolling_error_window_and_regimes() -> None:
    ev = Evaluator(window=3)
    for y, p, reg in [
        (10, 11, "decode_heavy"),
        (10, 9, "decode_heavy"),
        (10, 10, "mixed"),
        (10, 20, "mixed"),
    ]:
        ev.record("c", "step_period", y, {"learned": p}, reg)
    s = ev.summary("c", "step_period")["learned"]
    assert s["all"]["n"] == 3  # window
    assert s["all"]["mape"] == pytest.approx((0.1 + 0 + 1.0) / 3)
    assert s["decode_heavy"]["mape"] == pytest.approx(0.1)
    assert s["all"]["rmse"] == pytest.approx(math.sqrt((1 + 0 + 100) / 3))
    ev.record("c", "step_period", math.nan, {"learned": 1.0})  # ignored
    ev.drop("c")
    assert ev.summary("c", "step_period") == {}
    assert math.isnan(RollingError(5).mape)


def test_regime_classification() -> None:
    assert step_regime(0, 0, 0.1) == "mixed"
    assert step_regime(100, 900, 0.1) == "decode_heavy"
    assert step_regime(900, 100, 0.1) == "prefill_heavy"
    assert step_regime(500, 500, 0.1) == "mixed"
    assert step_regime(0, 64, 0.95) == "kv_saturated"


def test_windowed_refit_tracks_a_change() -> None:
    rng = np.random.default_rng(0)
    m = WindowedRefit(window=100, refit_every=20, n_features=2)
    for i in range(400):
        x = np.array([rng.uniform(1, 5), 1.0])
        theta = (2.0, 3.0) if i < 200 else (4.0, 1.0)
        m.learn_row(x, float(x @ np.array(theta)))
    np.testing.assert_allclose(m.coef, [4.0, 1.0], rtol=1e-6)
    assert np.all(m.coef >= 0)


def test_pooled_prior_similarity_weighting() -> None:
    pool = PooledPrior(BLIS_DEFAULT_BETA)
    near = np.full(11, 1.0)
    far = np.full(11, 3.0)
    pool.add({"model": "m", "gpu": "H100", "tp": 2}, near, n_effective=1000)
    pool.add({"model": "other", "gpu": "L40S", "tp": 1}, far, n_effective=1000)
    est = pool.prior_for({"model": "m", "gpu": "H100", "tp": 1})
    # (terms with large defaults — L, per-step, MoE layer — are also shrunk toward them)
    small = [0, 1, 2, 3, 8, 9, 10]
    assert np.all(np.abs(est.mean[small] - 1.0) < 0.1)
    assert len(est.sources) == 2
    # Never pools an unpublishable vector.
    pool.add({"model": "x", "gpu": "H100"}, [-1.0] * 11)
    pool.add({"model": "y", "gpu": "H100"}, [math.nan] * 11)
    assert len(pool) == 2
    back = PooledPrior(BLIS_DEFAULT_BETA)
    back.load_state(pool.state_dict())
    np.testing.assert_allclose(
        back.prior_for({"model": "m", "gpu": "H100", "tp": 1}).mean, est.mean
    )
    # Unidentified coefficients of a source hardly move the pooled mean.
    p2 = PooledPrior(BLIS_DEFAULT_BETA)
    ident = np.ones(11, dtype=bool)
    ident[3] = False
    p2.add({"model": "m", "gpu": "H100", "tp": 2}, far, ident, n_effective=1000)
    e2 = p2.prior_for({"model": "m", "gpu": "H100", "tp": 1})
    assert abs(e2.mean[3] - BLIS_DEFAULT_BETA[3]) < abs(e2.mean[0] - BLIS_DEFAULT_BETA[0])


def test_prior_precision_units() -> None:
    p = prior_precision([0.0, 2.0, 100.0], 0.5, floor=1.0)
    np.testing.assert_allclose(p, [0.5, 0.125, 0.5e-4])


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        LearnersConfig(forgetting=0.0)
    with pytest.raises(ValueError):
        LearnersConfig(drift={"detector": "cusum"})  # type: ignore[arg-type]
    cfg = LearnersConfig(drift={"detector": "page_hinkley", "params": {"threshold": 20}})  # type: ignore[arg-type]
    assert cfg.drift.params == {"threshold": 20}
