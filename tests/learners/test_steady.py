"""The published β estimate (learners.steady): steady when the physics is, fast when not,
and honest about which terms the data identify."""

from __future__ import annotations

import numpy as np
import pytest

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.features import (
    BLIS_DEFAULT_BETA,
    TERM_NAMES,
    BlisBasis,
    load_hardware,
    load_model,
)
from coeffd.learners.prior import prior_precision
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.steady import STEADY, TRACKING, SteadyEstimator, identified_fit, term_sources
from tests.support.synthetic_steps import TRUE_BETA, synth_steps

BASIS = BlisBasis(load_model("llama-3.1-8b-instruct"), load_hardware("H100"), tp=1)


def _learner(forgetting: float, drift: bool) -> RLSRegressor:
    cfg = LearnersConfig()
    d = cfg.drift
    return RLSRegressor(
        TERM_NAMES,
        forgetting=forgetting,
        prior_mean=list(BLIS_DEFAULT_BETA),
        prior_precision=prior_precision(BLIS_DEFAULT_BETA, cfg.prior_strength),
        weighting="relative",
        huber=cfg.huber,
        drift=DriftMonitor(d.detector, d.params, d.grace, d.keep) if drift else None,
    )


def _estimator() -> SteadyEstimator:
    cfg = LearnersConfig()
    return SteadyEstimator(_learner(cfg.forgetting, True), _learner(cfg.steady_forgetting, True))


def test_stationary_stream_stays_steady_and_beats_the_fast_tracker_against_the_truth() -> None:
    s = synth_steps(BASIS, TRUE_BETA, 5000, seed=4, sigma=0.03)
    est = _estimator()
    p = est.learn_many_prequential(s.x, s.y)
    assert est.mode == STEADY and est.switches == 0
    late = slice(2000, None)
    x, truth = s.x[late], s.mean[late]
    err_slow = np.mean(np.abs(x @ est.slow.nonnegative_coef() / truth - 1))
    err_fast = np.mean(np.abs(x @ est.fast.nonnegative_coef() / truth - 1))
    # ~2,000 observations of memory against ~90: the noise averages ~4.7× further down;
    # demand at least half of that
    assert err_slow < err_fast / 2, (err_slow, err_fast)
    # the published predictions were the long-memory learner's all along
    assert np.mean(np.abs(p[late] / truth - 1)) < 0.01


def test_abrupt_change_publishes_the_fast_tracker_then_returns_to_steady() -> None:
    after = np.asarray(TRUE_BETA) * np.array([1.3, 1, 1.2, 1, 1, 1, 1, 1, 1, 1.25, 1])
    s = synth_steps(BASIS, TRUE_BETA, 6000, seed=5, sigma=0.03, change_at=2000, beta_after=after)
    est = _estimator()
    modes = []
    for i in range(0, 6000, 16):
        est.learn_many_prequential(s.x[i : i + 16], s.y[i : i + 16])
        modes.append(est.mode)
    before, change = modes[: 2000 // 16], modes[2000 // 16 :]
    assert set(before) == {STEADY}
    assert TRACKING in change[:30]  # within ~500 observations of the change
    assert change[-1] == STEADY  # ...and back once the long memory holds only new data
    x, truth = s.x[-1000:], s.mean[-1000:]
    assert np.mean(np.abs(x @ est.published.nonnegative_coef() / truth - 1)) < 0.01
    # restored from its state, the estimator carries on in the same mode
    clone = SteadyEstimator(est.fast, est.slow)
    clone.load_state(est.state_dict())
    assert clone.mode == est.mode and clone.state_dict() == est.state_dict()


def test_identification_separates_data_terms_from_prior_terms() -> None:
    s = synth_steps(BASIS, TRUE_BETA, 4000, seed=6, sigma=0.03)
    m = _learner(0.9995, False)
    m.learn_many(s.x, s.y)
    fit, share = identified_fit(m, max_rel_std=0.1)
    a_data, _ = m.data_information()
    src = term_sources(TERM_NAMES, share, np.diag(a_data) > 0)
    # zero columns at TP 1 on a dense model: nothing to learn, the prior stands
    for name in ("T_tp_comm", "chi_L_moe", "T_moe_dispatch"):
        assert src[name] == "prior"
        i = TERM_NAMES.index(name)
        assert fit[i] == pytest.approx(BLIS_DEFAULT_BETA[i], rel=1e-12)
    # the prefill compute and decode memory terms are pinned by every regime's batches
    assert src["T_pf_compute"] == "data" and src["T_dc_kv"] == "data"
    # the constants (weights, layers, per step) move together: only their sum is learned
    assert {src["L"], src["one"]} <= {"data+prior", "prior"}
    # predictions along the identified directions stay the data's
    assert np.mean(np.abs(s.x @ fit / s.mean - 1)) < 0.02
