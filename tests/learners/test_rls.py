"""RLSRegressor: recovery, River agreement, stability, robustness, state, merging."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from river import linear_model

from coeffd.learners.nnls import nnls_information
from coeffd.learners.rls import RLSRegressor

FEATS5 = ["a", "b", "c", "d", "e"]


def _rows(x: np.ndarray, names: list[str]) -> list[dict[str, float]]:
    return [dict(zip(names, r, strict=True)) for r in x.tolist()]


def test_noiseless_recovery_is_exact() -> None:
    rng = np.random.default_rng(0)
    theta = np.array([0.5, 2.0, 0.0, 7.0, 1.5])
    x = rng.uniform(0.1, 3.0, (200, 5))
    m = RLSRegressor(FEATS5, forgetting=1.0, prior_precision=1e-12)
    for row, y in zip(_rows(x, FEATS5), (x @ theta).tolist(), strict=True):
        m.learn_one(row, y)
    np.testing.assert_allclose(m.coef, theta, rtol=0, atol=1e-8)
    np.testing.assert_allclose(m.nonnegative_coef(), theta, rtol=0, atol=1e-8)


def test_noisy_recovery_within_derived_tolerance() -> None:
    # Tolerance from the noise and n: 4.5 standard errors of OLS, σ²(XᵀX)⁻¹ (the prior is
    # negligible), i.e. a false failure rate < 1e-5 per coefficient.
    rng = np.random.default_rng(1)
    theta = np.array([1.0, -2.0, 0.5, 3.0, 0.25])
    sigma, n = 0.3, 3000
    x = rng.normal(size=(n, 5))
    y = x @ theta + rng.normal(0, sigma, n)
    m = RLSRegressor(FEATS5, forgetting=1.0, prior_precision=1e-9)
    m.learn_many(x, y)
    se = sigma * np.sqrt(np.diag(np.linalg.inv(x.T @ x)))
    assert np.all(np.abs(m.coef - theta) < 4.5 * se)
    # The learner's own standard errors (from its robust residual scale) agree with the truth
    # once the scale is estimated: weighting="none" with huber set makes it track the scale.
    m2 = RLSRegressor(FEATS5, forgetting=1.0, prior_precision=1e-9, huber=10.0)
    m2.learn_many(x, y)
    np.testing.assert_allclose(m2.coef_std(), se, rtol=0.15)


@pytest.mark.parametrize("lam", [0.99, 0.999])
def test_agrees_with_river_bayesian_linear_regression(lam: float) -> None:
    # River: S ← s·S + (1−s)·β·xxᵀ, S₀ = I/α, η ← s·η + (1−s)·β·y·x, m = S⁻¹η. Dividing by
    # (1−s)β gives exponentially weighted RLS with a *decaying* prior of precision
    # 1/(α(1−s)β) and mean 0: our forget_prior=True with that precision.
    alpha, beta = 2.0, 0.5
    rng = np.random.default_rng(2)
    d = 11
    names = [f"f{i}" for i in range(d)]
    x = rng.uniform(0.0, 2.0, (1500, d))
    y = x @ rng.uniform(0, 3, d) + rng.normal(0, 0.2, 1500)
    river = linear_model.BayesianLinearRegression(alpha=alpha, beta=beta, smoothing=lam)
    ours = RLSRegressor(
        names, forgetting=lam, prior_precision=1.0 / (alpha * (1 - lam) * beta), forget_prior=True
    )
    batch = RLSRegressor(
        names, forgetting=lam, prior_precision=1.0 / (alpha * (1 - lam) * beta), forget_prior=True
    )
    rows = _rows(x, names)
    for i, (row, yy) in enumerate(zip(rows, y.tolist(), strict=True)):
        river.learn_one(row, yy)
        ours.learn_one(row, yy)
        if i % 97 == 0:  # predictions agree along the way, not only at the end
            assert ours.predict_one(row) == pytest.approx(river.predict_one(row), rel=1e-8)
    batch.learn_many(x[:333], y[:333])
    batch.learn_many(x[333:], y[333:])
    river._ensure_m()
    ref = np.array([river._m_arr[river._idx[f]] for f in names])
    np.testing.assert_allclose(ours.coef, ref, rtol=1e-8)
    np.testing.assert_allclose(batch.coef, ref, rtol=1e-8)


def test_learn_one_equals_learn_many_with_robust_weights() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 2, (500, 5))
    y = (x @ np.array([1, 2, 3, 4, 5.0])) * np.exp(rng.normal(0, 0.05, 500))
    kw = {"forgetting": 0.99, "prior_precision": 1e-3, "weighting": "relative", "huber": 2.0}
    a = RLSRegressor(FEATS5, **kw)  # type: ignore[arg-type]
    b = RLSRegressor(FEATS5, **kw)  # type: ignore[arg-type]
    for i, (row, yy) in enumerate(zip(_rows(x, FEATS5), y.tolist(), strict=True)):
        a.learn_one(row, yy)
        if i % 37 == 0:
            a.predict_one(row)  # forcing early folds must not change what is learned
    b.learn_many(x[:101], y[:101])
    b.learn_many(x[101:], y[101:])
    np.testing.assert_allclose(a.coef, b.coef, rtol=1e-10)
    assert a.n_downweighted == b.n_downweighted


def test_stable_over_many_updates_with_a_feature_idle() -> None:
    # 10⁵ updates; feature "c" is exactly zero for 10⁴ of them in the middle (50
    # forgetting memories: unregularised, its variance would grow by 0.995⁻¹⁰⁰⁰⁰ ≈ e⁵⁰).
    # With regularised forgetting the covariance stays bounded by the prior's (no
    # wind-up), the state stays symmetric PD, and the estimate is right before, during
    # and after. The 10⁶-update soak is ``python -m bench rls_soak``.
    rng = np.random.default_rng(4)
    theta = np.array([1.0, 2.0, 3.0, 0.5, 4.0])
    prior = 1e-2
    m = RLSRegressor(
        FEATS5, forgetting=0.995, prior_precision=prior, weighting="relative", huber=3.0
    )
    chunk = 10_000
    for k in range(10):
        x = rng.uniform(0.5, 2.0, (chunk, 5))
        if k == 5:
            x[:, 2] = 0.0
        y = (x @ theta) * np.exp(rng.normal(-0.5 * 0.02**2, 0.02, chunk))
        m.learn_many(x, y)
        a, b = m.information()
        assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
        np.testing.assert_array_equal(a, a.T)
        assert np.linalg.eigvalsh(a).min() > 0
        cov = np.linalg.inv(a)
        # Bounded wind-up: never more uncertain than the prior alone.
        assert np.all(np.diag(cov) <= 1.0 / prior * (1 + 1e-9))
        # Tolerance: 6 posterior standard deviations over the forgetting window.
        err = np.abs(m.coef - theta)
        tol = 6 * m.coef_std()
        if k == 5:
            assert np.all(np.delete(err < tol, 2))  # the idle coefficient only relaxes
            assert np.isfinite(m.coef[2])
        else:
            assert np.all(err < tol)
    assert m.n_learned == 10 * chunk


def test_non_finite_inputs_are_rejected_and_counted() -> None:
    m = RLSRegressor(["a", "b"], forgetting=1.0)
    m.learn_one({"a": 1.0, "b": 1.0}, 2.0)
    m.learn_one({"a": math.nan, "b": 1.0}, 2.0)
    m.learn_one({"a": 1.0, "b": math.inf}, 2.0)
    m.learn_one({"a": 1.0, "b": 1.0}, math.inf)
    m.learn_one({"a": 1e308, "b": 1e308}, 1.0)  # overflowing row: rejected, not learned
    m.learn_one({"a": "x", "b": 1.0}, 1.0)  # type: ignore[dict-item]
    x = np.array([[1.0, 2.0], [np.nan, 1.0], [1.0, -np.inf]])
    m.learn_many(x, np.array([3.0, 1.0, 1.0]))
    m.learn_many(np.ones((2, 2)), np.array([np.nan, 2.0]))
    assert m.n_rejected == 8
    assert m.n_learned == 3
    assert np.all(np.isfinite(m.coef))
    m.learn_one({"a": 1e200, "b": 1.0}, 1.0)  # finite, but its square is not
    m.learn_many(np.array([[1e200, 1.0]]), np.array([1.0]))
    a, b = m.information()  # (overflowing rows are caught when folded)
    assert m.n_rejected == 10 and m.n_learned == 3
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(np.isfinite(m.coef))


def test_valid_output_on_adversarial_data() -> None:
    rng = np.random.default_rng(5)
    names = ["a", "a_copy", "zero", "neg", "c"]
    prior = np.array([1.0, 1.0, 0.7, 1.0, 1.0])
    m = RLSRegressor(names, forgetting=0.999, prior_mean=prior, prior_precision=1e-4)
    a = rng.uniform(1, 2, 400)
    x = np.column_stack([a, a, np.zeros(400), rng.uniform(1, 2, 400), np.ones(400)])
    y = 3.0 * a - 2.0 * x[:, 3] + 10.0  # the truth wants a negative coefficient
    m.learn_many(x, y)
    v = m.nonnegative_coef()
    assert v.shape == (5,) and np.all(np.isfinite(v)) and np.all(v >= 0)
    assert v[0] + v[1] == pytest.approx(3.0, rel=0.05)  # collinear pair shares the effect
    assert v[2] == pytest.approx(0.7)  # an all-zero column keeps its prior
    assert v[3] == 0.0
    ident = m.identified()
    assert not ident[2]
    # NNLS is the constrained optimum of the same quadratic, not a clipped θ.
    a_mat, b_vec = m.information()
    scipy_opt = pytest.importorskip("scipy.optimize")
    r = np.linalg.cholesky(a_mat).T
    z = np.linalg.solve(r.T, b_vec)
    ref, _ = scipy_opt.nnls(r, z)
    np.testing.assert_allclose(v, ref, rtol=1e-6, atol=1e-8)
    clipped = np.maximum(m.coef, 0)
    f = lambda t: 0.5 * t @ a_mat @ t - b_vec @ t  # noqa: E731
    assert f(v) <= f(clipped) + 1e-9


def test_nnls_random_problems_match_scipy() -> None:
    scipy_opt = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(6)
    for _ in range(50):
        x = rng.normal(size=(30, 8))
        x[:, 3] = x[:, 2]  # collinear
        y = rng.normal(size=30)
        ref, _ = scipy_opt.nnls(x, y)
        got = nnls_information(x.T @ x, x.T @ y)
        assert np.all(got >= 0)
        # A warm start from any guess gives the same optimum.
        warm = nnls_information(x.T @ x, x.T @ y, warm=rng.random(8) < 0.5)
        np.testing.assert_allclose(x @ warm, x @ got, atol=1e-7)
        # Collinear columns make θ non-unique; the fitted values and objective are unique.
        np.testing.assert_allclose(x @ got, x @ ref, atol=1e-7)


def test_checkpoint_restore_gives_identical_predictions() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 2, (333, 5))
    y = (x @ np.array([1, 2, 3, 4, 5.0])) * np.exp(rng.normal(0, 0.05, 333))
    m = RLSRegressor(FEATS5, forgetting=0.99, prior_precision=1e-3, weighting="relative", huber=2.0)
    m.learn_many(x[:200], y[:200])
    state = json.loads(json.dumps(m.state_dict()))
    r = RLSRegressor([])
    r.load_state(state)
    np.testing.assert_array_equal(r.predict_many(x), m.predict_many(x))
    # ... and they keep learning identically.
    m.learn_many(x[200:], y[200:])
    r.learn_many(x[200:], y[200:])
    np.testing.assert_allclose(r.predict_many(x), m.predict_many(x), rtol=1e-12)
    np.testing.assert_allclose(r.nonnegative_coef(), m.nonnegative_coef(), rtol=1e-12)


@pytest.mark.parametrize("lam", [1.0, 0.99])
def test_merge_equals_learning_on_the_union(lam: float) -> None:
    rng = np.random.default_rng(8)
    x = rng.uniform(0.5, 2, (600, 5))
    y = x @ np.array([1, 2, 3, 4, 5.0]) + rng.normal(0, 0.1, 600)
    kw = {"forgetting": lam, "prior_mean": [1.0] * 5, "prior_precision": 0.1}
    first, second, union = (RLSRegressor(FEATS5, **kw) for _ in range(3))  # type: ignore[arg-type]
    first.learn_many(x[:250], y[:250])
    second.learn_many(x[250:], y[250:])
    union.learn_many(x, y)
    merged = first.merge(second)
    a_m, b_m = merged.information()
    a_u, b_u = union.information()
    np.testing.assert_allclose(a_m, a_u, rtol=1e-12)
    np.testing.assert_allclose(b_m, b_u, rtol=1e-12)
    np.testing.assert_allclose(merged.coef, union.coef, rtol=1e-10)
    assert merged.n_learned == 600
    if lam == 1.0:  # without forgetting the order does not matter
        np.testing.assert_allclose(second.merge(first).coef, union.coef, rtol=1e-10)


def test_huber_resists_stalls() -> None:
    rng = np.random.default_rng(9)
    theta = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    x = rng.uniform(0.5, 2, (3000, 5))
    y = (x @ theta) * np.exp(rng.normal(0, 0.03, 3000))
    y[rng.random(3000) < 0.02] *= 5.0  # 2 % stalls
    robust = RLSRegressor(FEATS5, forgetting=1.0, prior_precision=1e-6, huber=3.0)
    plain = RLSRegressor(FEATS5, forgetting=1.0, prior_precision=1e-6)
    robust.learn_many(x, y)
    plain.learn_many(x, y)
    err_r = np.abs(robust.coef / theta - 1).max()
    err_p = np.abs(plain.coef / theta - 1).max()
    # Huber bounds each stall's pull (one-sided contamination still leaves a small bias).
    assert err_r < err_p / 5
    assert robust.n_downweighted > 0
    rel = RLSRegressor(
        FEATS5, forgetting=1.0, prior_precision=1e-6, weighting="relative", huber=3.0
    )
    rel.learn_many(x, y)
    assert np.abs(rel.coef / theta - 1).max() < 0.03


def test_unidentified_constant_group_stays_at_prior() -> None:
    # Three columns constant within the stream (like T_weight, L and the per-step term in
    # one configuration): only their sum is identified; each member stays near its prior.
    rng = np.random.default_rng(10)
    n = 2000
    x = np.column_stack([rng.uniform(1, 2, n), np.ones(n), np.ones(n), np.ones(n)])
    y = x @ np.array([2.0, 10.0, 20.0, 30.0])
    prior = [1.0, 15.0, 15.0, 15.0]
    m = RLSRegressor(["a", "w", "l", "one"], forgetting=1.0, prior_mean=prior, prior_precision=1e-3)
    m.learn_many(x, y)
    ident = m.identified()
    assert ident.tolist() == [True, False, False, False]
    assert m.coef[1:].sum() == pytest.approx(60.0, rel=1e-6)
    np.testing.assert_allclose(m.coef[1:], [20.0, 20.0, 20.0], rtol=1e-4)  # prior split


def test_dataframe_input_clone_and_validation() -> None:
    class Frame:  # the DataFrame surface learn_many uses (pandas is not a dependency)
        def __init__(self, data: dict[str, np.ndarray]) -> None:
            self.data = data
            self.columns = list(data)

        def __len__(self) -> int:
            return len(next(iter(self.data.values())))

        def __getitem__(self, key: str) -> np.ndarray:
            return self.data[key]

    rng = np.random.default_rng(11)
    x = rng.uniform(0.5, 2, (100, 3))
    y = x @ np.array([1.0, 2.0, 3.0])
    m = RLSRegressor(["a", "b", "c"], forgetting=1.0, prior_precision=1e-9)
    frame = Frame({"c": x[:, 2], "b": x[:, 1], "a": x[:, 0], "z": x[:, 0]})  # by name
    m.learn_many(frame, y)
    np.testing.assert_allclose(m.coef, [1.0, 2.0, 3.0], rtol=1e-8)
    np.testing.assert_allclose(m.predict_many(frame), y, rtol=1e-8)
    fresh = m.clone()
    assert fresh.n_learned == 0 and fresh.features == m.features
    with pytest.raises(ValueError):
        m.learn_many(np.ones((3, 2)), np.ones(3))
    with pytest.raises(ValueError):
        RLSRegressor(["a"], forgetting=0.0)
    with pytest.raises(ValueError):
        RLSRegressor(["a", "b"], prior_mean=[1.0])
