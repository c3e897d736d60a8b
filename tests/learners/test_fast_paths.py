"""The learners' batched and warm-started paths (issue 34) compute what the plain ones do.

Each comparison runs the production configuration (relative weights, Huber, ADWIN) on a
stream with a change in it, so folds, down-weighted rows, drift alarms and their fast
spells all happen on both sides.
"""

from __future__ import annotations

import numpy as np
import pytest

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.evaluation import WindowedRefit
from coeffd.learners.features import BLIS_DEFAULT_BETA, TERM_NAMES
from coeffd.learners.nnls import nnls_information
from coeffd.learners.prior import prior_precision
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.targets import make_learner
from tests.support.simfleet_obs import simfleet_observations


def _stream(n: int = 3000, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Step-like rows; the true β moves by 30 % half way; a few stalls."""
    rng = np.random.default_rng(seed)
    d = len(TERM_NAMES)
    x = rng.uniform(0.0, 2.0, (n, d)) * (rng.random((n, d)) < 0.7)
    beta = np.asarray(BLIS_DEFAULT_BETA) + 0.2
    y = x @ beta * np.exp(rng.normal(0, 0.03, n)) + 5.0
    y[n // 2 :] *= 1.3
    y[rng.choice(n, 20, replace=False)] *= 4.0  # stalls: Huber's rows
    return x, y


def _learner(target: str = "beta", alpha_prior: float = 1.0) -> RLSRegressor:
    s = LearnersConfig()
    bp = np.asarray(BLIS_DEFAULT_BETA)
    prec = prior_precision(bp, s.prior_strength, s.prior_scale_floor)
    return make_learner(target, s, bp, prec, np.full(3, alpha_prior), f"test/{target}")


def test_prequential_batches_equal_row_by_row_learn_one() -> None:
    x, y = _stream()
    fast, ref = _learner(), _learner()
    got = np.concatenate(
        [fast.learn_many_prequential(x[i : i + 97], y[i : i + 97]) for i in range(0, len(y), 97)]
    )
    names = list(TERM_NAMES)
    want = []
    for row, t in zip(x.tolist(), y.tolist(), strict=True):
        want.append(float(np.asarray(row) @ ref.prediction_coef()))
        ref.learn_one(dict(zip(names, row, strict=True)), t)  # the pending-list path
    assert ref.drift is not None and ref.drift.detections > 0 and ref.n_downweighted > 0
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(fast.nonnegative_coef(), ref.nonnegative_coef(), rtol=1e-12)
    assert fast.drift is not None and fast.drift.detections == ref.drift.detections
    assert fast.n_downweighted == ref.n_downweighted and fast.n_learned == ref.n_learned


def test_drift_update_many_is_update_row_by_row() -> None:
    rng = np.random.default_rng(1)
    z = np.concatenate([rng.normal(0, 1, 3000), rng.normal(1.5, 1, 3000)] * 2)
    one, many = DriftMonitor(label="one"), DriftMonitor(label="many")
    hits = [i for i, v in enumerate(z.tolist()) if one.update(v, i)]
    got: list[int] = []
    for start in range(0, len(z), 50):
        k = many.update_many(z[start : start + 50], start)
        if k >= 0:
            got.append(start + k)
    assert len(hits) >= 2 and many.detections == one.detections
    assert [e["n"] for e in many.history] == [e["n"] for e in one.history] == hits
    assert set(got) <= set(hits)  # the first alarm of each call
    # River's own ADWIN fed row by row (a fresh one after each alarm, after the grace
    # rows): the monitor feeds its window directly, and alarms at the same rows
    from river.drift import ADWIN

    ref: list[int] = []
    det, seen = ADWIN(delta=1e-4), 0
    for i, v in enumerate(z.tolist()):
        if seen < one.grace:
            seen += 1
            continue
        det.update(v)
        if det.drift_detected:
            ref.append(i)
            det, seen = ADWIN(delta=1e-4), 0
    assert ref == hits


def test_nnls_warm_start_gives_the_cold_result_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    for _ in range(300):
        m = rng.normal(size=(30, 11))
        a, b = m.T @ m + 1e-6 * np.eye(11), m.T @ rng.normal(size=30)
        cold = nnls_information(a, b)
        for warm in (rng.random(11) < 0.5, cold > 0, np.ones(11, dtype=bool)):
            assert np.array_equal(nnls_information(a, b, warm=warm), cold)


def test_batch_refit_warm_start_equals_a_cold_refit() -> None:
    x, y = _stream(1500)
    m = WindowedRefit(window=400, refit_every=50, n_features=x.shape[1])
    for i in range(0, len(y), 50):
        m.learn_many_prequential(x[i : i + 50], y[i : i + 50])
        xs, ys = m.rows()
        w = 1.0 / (ys * ys)
        a = (xs * w[:, None]).T @ xs
        a += np.eye(len(a)) * 1e-12 * max(float(np.trace(a)), 1e-300)
        # the compiled NNLS (when built) against the pure one: round-off apart (1e-9)
        want = nnls_information(a, xs.T @ (w * ys))
        assert np.array_equal(m.coef > 0, want > 0)
        np.testing.assert_allclose(m.coef, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_evaluator_rows_recorded_one_at_a_time_reach_the_same_windows() -> None:
    from coeffd.learners.evaluation import Evaluator, RollingError

    rng = np.random.default_rng(4)
    ev, ref = Evaluator(window=50), RollingError(50)
    for i, y in enumerate(rng.uniform(0.0, 10.0, 400).tolist()):
        yhat = y * (1.0 + rng.normal(0, 0.1)) if i % 9 else y  # some exact predictions
        rel = ev.record("c", "t", y, {"learned": yhat, "none": float("nan")})
        assert rel["learned"] == ref.update(y, yhat) and "none" not in rel
        if i % 37 == 0:  # reads in between put what waits into the windows first
            assert ev.summary("c", "t")["learned"]["all"] == ref.as_dict()
    assert ev.mape("c", "t") == ref.mape and ev.targets("c") == ["t"]
    assert ev.summary("c", "t")["learned"]["all"] == ref.as_dict()


def _alpha_stream(n: int = 4000, seed: int = 11) -> np.ndarray:
    """Request-like α targets (µs): multiplicative noise, a 40 % jump a third of the way
    and a slow 20 % drift later, a few stalls."""
    rng = np.random.default_rng(seed)
    y = 400.0 * np.exp(rng.normal(0, 0.3, n))
    y[n // 3 :] *= 1.4
    y[2 * n // 3 :] *= np.linspace(1.0, 1.2, n - 2 * n // 3)
    y[rng.choice(n, 30, replace=False)] *= 6.0
    return y


def test_one_feature_scalar_fold_agrees_with_the_array_fold() -> None:
    """The α learners (one feature) fold in plain floats (``RLSRegressor._fold_scalar``);
    rows learned as 1-row arrays take the array path. Only the order in which a fold's
    16 products are summed differs (a few ulps, 1e-16 relative, per fold), and each fold
    forgets the earlier ones, so the difference stays at round-off: 1e-12 relative is
    ~1,000× what this stream shows, and far below the 1e-9 the published figures must
    keep."""
    y = _alpha_stream()
    alarms = downweighted = 0
    for target in ("arrival_to_queued", "output_token", "output_token_steady"):
        scalar, array = _learner(target, 300.0), _learner(target, 300.0)
        got, want = [], []
        for t in y.tolist():
            got.append(float(scalar.prediction_coef()[0]))
            scalar.learn_one({"one": 1.0}, t)
            want.append(float(array.prediction_coef()[0]))
            array.learn_many(np.ones((1, 1)), np.array([t]))
        assert array.drift is not None and scalar.drift is not None
        alarms += array.drift.detections
        downweighted += array.n_downweighted
        assert scalar.drift.detections == array.drift.detections
        assert [e["n"] for e in scalar.drift.history] == [e["n"] for e in array.drift.history]
        assert scalar.n_downweighted == array.n_downweighted
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(scalar.coef, array.coef, rtol=1e-12, atol=0)
        np.testing.assert_allclose(scalar.coef_std(), array.coef_std(), rtol=1e-12, atol=0)
        assert scalar.n_effective == pytest.approx(array.n_effective, rel=1e-12)
    # the fast trackers' alarms and Huber's stalls (the long-memory twin may take both quietly)
    assert alarms >= 2 and downweighted > 0


def test_one_by_one_solve_is_lapacks() -> None:
    """A 1×1 system is solved in floats, as LAPACK's Cholesky does it: bit for bit."""
    from coeffd.learners.linalg import spd_solve
    from coeffd.learners.rls import _solve

    rng = np.random.default_rng(5)
    for a, b in zip(np.exp(rng.uniform(-30, 30, 2000)), rng.normal(0, 1e3, 2000), strict=True):
        want = spd_solve(np.array([[a]]), np.array([b]))
        assert want is not None
        assert np.array_equal(_solve(np.array([[a]]), np.array([b]), np.zeros(1)), want)


def _state(m: RLSRegressor) -> dict[str, object]:
    """A learner's state without its drift alarms' wall clocks (when the test ran)."""
    st = m.state_dict()
    drift = st.pop("drift")
    if drift is not None:
        st["alarms"] = [e["n"] for e in drift["history"]]
    return st


def test_intercept_paths_are_learn_one_of_the_intercept_row() -> None:
    """A finished request's α rows go through ``learn_intercept`` (no dict): the same
    learner, bit for bit, as ``learn_one({"one": 1.0}, y)``; likewise the steady pair."""
    from coeffd.learners.steady import SteadyEstimator

    y = [*_alpha_stream(3000, seed=3).tolist(), float("nan"), float("inf")]
    one, fast = _learner("output_token", 300.0), _learner("output_token", 300.0)
    for t in y:
        assert fast.intercept_prequential() == one.predict_prequential({"one": 1.0})
        one.learn_one({"one": 1.0}, t)
        fast.learn_intercept(t)
    assert np.array_equal(one.coef, fast.coef) and _state(one) == _state(fast)
    assert fast.n_rejected == 2

    def pair() -> SteadyEstimator:
        return SteadyEstimator(
            _learner("arrival_to_queued", 300.0), _learner("arrival_to_queued_steady", 300.0)
        )

    a, b = pair(), pair()
    got = [a.learn_intercept_prequential(t) for t in y[:-2]]
    want = [b.learn_one_prequential({"one": 1.0}, t) for t in y[:-2]]
    assert got == want and a.state_dict() == b.state_dict() and a.switches > 0
    assert _state(a.fast) == _state(b.fast) and _state(a.slow) == _state(b.slow)


def test_a_burst_of_requests_learns_as_one_by_one() -> None:
    """``LearnerRegistry.learn_requests`` (the consumer's path for a joiner burst) gives
    the scores, estimates and counters of ``learn`` request by request."""
    from coeffd.learners.features.config import ServingConfig
    from coeffd.learners.registry import LearnerRegistry
    from coeffd.records.observations import RequestObservation
    from coeffd.simfleet import SampleRates

    obs = simfleet_observations(20, 2, SampleRates(1.0, 0.01, 0.0, 100), max_events=200_000)
    reqs = [o for o in obs if isinstance(o, RequestObservation)]
    assert len(reqs) > 100
    cfg = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100")  # simfleet's engine
    one, burst = LearnerRegistry(), LearnerRegistry()
    want = [s for o in reqs for s in one.learn(cfg, o)]
    got = []
    n = 0
    for i in range(0, len(reqs), 37):
        scored, learned = burst.learn_requests(cfg, reqs[i : i + 37])
        got.extend(scored)
        n += learned
    assert got == want and n == one.get(cfg.id).observations  # type: ignore[union-attr]
    assert burst.rejected == one.rejected
    a, b = one.estimate(cfg.id), burst.estimate(cfg.id)
    assert a.alpha == b.alpha and a.errors == b.errors and a.version == b.version
    ls_one, ls_burst = one.get(cfg.id), burst.get(cfg.id)
    assert ls_one is not None and ls_burst is not None
    assert {k: _state(m) for k, m in ls_one.learners.items()} == {
        k: _state(m) for k, m in ls_burst.learners.items()
    }


def test_evaluator_add_scored_is_record_without_a_regime() -> None:
    from coeffd.learners.evaluation import Evaluator

    rng = np.random.default_rng(6)
    a, b = Evaluator(window=40), Evaluator(window=40)
    for y in [*rng.uniform(0.0, 10.0, 300).tolist(), float("nan")]:
        a.add_scored("c", "t", y, y * 1.1, 2.0)
        b.record("c", "t", y, {"learned": y * 1.1, "blis_default": 2.0})
        # no default (queue wait), and a non-finite prediction: skipped alike
        a.add_scored("c", "w", y, float("nan") if y > 9.0 else y * 0.9, None)
        b.record("c", "w", y, {"learned": float("nan") if y > 9.0 else y * 0.9})
    assert a.summary("c", "t") == b.summary("c", "t") and a.targets("c") == ["t", "w"]
    assert a.summary("c", "w") == b.summary("c", "w")


def test_evaluator_rows_of_a_burst_are_add_scored_one_by_one() -> None:
    """``add_scored_rows``: a burst's request scores in one call, the windows as after
    ``add_scored`` row by row (past a window's length, NaN and None included)."""
    from coeffd.learners.evaluation import Evaluator

    rng = np.random.default_rng(4)
    a, b = Evaluator(window=40), Evaluator(window=40)
    rows: list[tuple[str, float, float, float | None]] = []
    for y in [*rng.uniform(0.0, 10.0, 300).tolist(), float("nan")]:
        rows.append(("t", y, y * 1.1, 2.0))
        rows.append(("w", y, float("nan") if y > 9.0 else y * 0.9, None))
    for target, y, p, d in rows:
        a.add_scored("c", target, y, p, d)
    for i in range(0, len(rows), 37):
        b.add_scored_rows("c", rows[i : i + 37])
    assert a.targets("c") == b.targets("c") == ["t", "w"]
    for t in ("t", "w"):
        assert a.summary("c", t) == b.summary("c", t)
        assert a.summary("c", t)["learned"]["all"]["n"] == 40


def test_step_regimes_are_step_regime_row_by_row() -> None:
    """The vectorised regimes of a burst: the same quotients and thresholds, edges
    included (no tokens, exactly at the heavy fraction, KV exactly saturated, NaN KV)."""
    from coeffd.learners.evaluation import step_regime, step_regimes

    rng = np.random.default_rng(5)
    pre = rng.integers(0, 3000, 2000).astype(float)
    dec = rng.integers(0, 300, 2000).astype(float)
    pre[:50] = dec[:50] = 0.0
    pre[50:60], dec[50:60] = 800.0, 200.0  # prefill share exactly 0.8
    pre[60:70], dec[60:70] = 200.0, 800.0
    kv = rng.uniform(0.0, 1.0, 2000)
    kv[70:80] = 0.9
    kv[80:90] = np.nan
    got = step_regimes(pre, dec, kv, heavy_fraction=0.8, kv_saturated=0.9)
    want = [
        step_regime(int(p), int(d), k, heavy_fraction=0.8, kv_saturated=0.9)
        for p, d, k in zip(pre.tolist(), dec.tolist(), kv.tolist(), strict=True)
    ]
    assert got == want and len(set(got)) == 4


def test_drift_feed_is_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled feed of a fold's residuals into ADWIN alarms where the Python loop
    does, at the same rows, through grace spells and repeated alarms."""
    from coeffd.learners import native

    if native.feed is None:
        pytest.skip(native.UNAVAILABLE)
    rng = np.random.default_rng(8)
    z = np.clip(np.r_[rng.normal(0, 1, 3000), rng.normal(1.5, 1, 3000)], -3, 3).tolist()

    def alarms(compiled: bool) -> list[int]:
        monkeypatch.setattr(native, "feed", native.feed if compiled else None)
        m = DriftMonitor()
        for i in range(0, len(z), 16):
            m.update_many(z[i : i + 16], i)
        monkeypatch.undo()
        return [e["n"] for e in m.history]

    got = alarms(True)
    assert got and got == alarms(False)
