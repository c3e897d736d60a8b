"""Recursive least squares with forgetting, in information form, as a River regressor.

Length: one estimator whose buffered fold, robust weights, drift policy and state must
change together (split, each piece would reach into the others' internals).

Why information form. The learner keeps ``A = Σ λ-decayed w x xᵀ`` and ``b = Σ λ-decayed
w y x`` (plus a prior) instead of the covariance ``P = A⁻¹`` that textbook RLS propagates.
Sums of symmetric rank-1 terms stay symmetric and PSD by construction, there is no
Riccati recursion whose round-off compounds over millions of updates, two learners'
statistics add exactly (sharding, checkpoints), and ``θ = A⁻¹b`` is one 11×11 Cholesky
solve, done lazily.

Why a non-decaying prior (default). With plain exponential forgetting a direction that
stops being excited (a feature at zero for a long stretch, e.g. no prefill) loses all its
information, ``P`` winds up as ``λ⁻ⁿ`` and the next observation in that direction throws
the estimate around. Here the prior information ``A₀`` is *not* forgotten (regularised
forgetting, Gunnarsson 1996): ``A ⪰ A₀`` always, so the covariance is bounded by ``A₀⁻¹``
and an unexcited coefficient relaxes toward the prior mean, never explodes.
``forget_prior=True`` gives textbook exponentially weighted RLS, identical to River's
``BayesianLinearRegression(smoothing=λ)`` (tests check agreement to 1e-8).

Why buffered updates. Rows are appended to a small buffer and folded into ``(A, b)`` by
one matrix product every ``refresh_every`` rows (or when a prediction needs them). The
robust weights of those rows use ``θ_w``, the estimate refreshed at the previous fold
boundary, so ``learn_one`` in a loop and ``learn_many`` give the same statistics, and
the per-update cost is a row copy (see ``bench/rls.py``).

Weights. ``weighting="relative"`` weights a row by ``1/ŷ²`` (ŷ from ``θ_w``): latencies
carry multiplicative noise, so this is the efficient (feasible GLS) estimator and the
one that minimises relative error. ``huber=c`` down-weights rows whose standardised
residual exceeds ``c`` by ``c/|z|`` (scale: exponentially weighted mean absolute
residual, itself clipped at ``c``), so a stalled step cannot drag the fit. With relative
weights the information is in relative-error units, so the prior precision must be too
(:func:`learners.prior.prior_precision`).

Drift. An optional :class:`learners.drift.DriftMonitor` sees the standardised residuals of
every folded row; on an alarm the data information is scaled down with θ held in place
(:meth:`RLSRegressor.inflate`) and a short spell of faster forgetting follows.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from river import base

from coeffd.learners import native as _native
from coeffd.learners.linalg import spd_solve
from coeffd.learners.nnls import nnls_fast

if TYPE_CHECKING:
    from coeffd.learners.drift import DriftMonitor

__all__ = ["RLSRegressor"]

FloatArray = npt.NDArray[np.float64]
Weighting = Literal["none", "relative"]

_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)  # E|e| = σ·√(2/π) for Gaussian e
_RENORMALISE_BELOW = 1e-150  # keep the running scale inside float range


#: The row of a one-feature learner's intercept (learn_intercept), shared.
_ONE_ROW = [1.0]

#: Below this many learned rows, predictions fold pending rows first (see prediction_coef).
_YOUNG_ROWS = 128

#: The most rows the compiled fold takes at once (it copies them; larger folds, only from
#: ``learn_many`` with a large ``refresh_every``, take the pure path).
_NATIVE_MAX_ROWS = 4096
#: ... and the most features (its stack buffer; coeffd's learners have at most 21)
_NATIVE_MAX_FEATURES = 64


class RLSRegressor(base.Regressor):
    """Exponentially forgetting recursive least squares with a prior, River style.

    Parameters
    ----------
    features
        Feature names; fixes the coefficient order (dict inputs are read by name, array
        inputs must use this column order).
    forgetting
        λ in (0, 1]: an observation ``k`` steps old carries weight ``λᵏ``.
    prior_mean
        θ₀ (default zeros).
    prior_precision
        Prior information ``A₀``: a scalar (``c·I``), a diagonal, or a full matrix.
    forget_prior
        If true the prior decays with λ too (textbook RLS; covariance can wind up).
    weighting
        ``"none"`` (ordinary LS) or ``"relative"`` (weights ``1/ŷ²``).
    huber
        Huber threshold on standardised residuals; ``None`` disables down-weighting.
    scale_memory
        Observations of memory of the residual-scale estimate.
    refresh_every
        Rows per fold; ``θ_w`` (used for the weights) refreshes at each fold boundary.
    drift
        Optional :class:`learners.drift.DriftMonitor`; on a detection the learner applies
        the monitor's policy (covariance inflation + a spell of faster forgetting).

    Examples
    --------
    >>> model = RLSRegressor(features=["a", "b"], forgetting=1.0, prior_precision=1e-9)
    >>> for i in range(20):
    ...     x = {"a": float(i % 5), "b": 1.0}
    ...     model.learn_one(x, 3.0 * x["a"] + 2.0)
    >>> round(model.predict_one({"a": 10.0, "b": 1.0}), 6)
    32.0
    >>> model.coef.round(6).tolist()
    [3.0, 2.0]

    Non-finite inputs are counted and never learned:

    >>> model.learn_one({"a": float("nan"), "b": 1.0}, 1.0)
    >>> model.n_rejected
    1

    The published vector is the best non-negative fit, not a clipped one:

    >>> m = RLSRegressor(features=["a", "b"], forgetting=1.0, prior_precision=1e-9)
    >>> for a in (1.0, 2.0, 3.0, 4.0):
    ...     m.learn_one({"a": a, "b": 1.0}, -1.0 * a + 10.0)
    >>> m.nonnegative_coef().round(4).tolist()
    [0.0, 7.5]
    """

    #: Fold with the compiled fold when it is available (:mod:`learners.native`); False
    #: on an instance keeps it on the pure-Python/numpy reference (tests compare them).
    use_native: bool = True

    def __init__(
        self,
        features: Sequence[str],
        forgetting: float = 0.999,
        prior_mean: Sequence[float] | FloatArray | None = None,
        prior_precision: float | Sequence[float] | FloatArray = 1e-6,
        forget_prior: bool = False,
        weighting: Weighting = "none",
        huber: float | None = None,
        scale_memory: float = 50.0,
        refresh_every: int = 16,
        drift: DriftMonitor | None = None,
    ) -> None:
        self.features = list(features)
        self.forgetting = float(forgetting)
        self.prior_mean = None if prior_mean is None else [float(v) for v in prior_mean]
        self.prior_precision = prior_precision
        self.forget_prior = forget_prior
        self.weighting = weighting
        self.huber = huber
        self.scale_memory = scale_memory
        self.refresh_every = int(refresh_every)
        self.drift = drift
        if not 0.0 < self.forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        if self.refresh_every < 1:
            raise ValueError("refresh_every must be >= 1")
        d = len(self.features)
        self._d = d
        self._index = {f: i for i, f in enumerate(self.features)}
        self._theta0 = np.zeros(d) if self.prior_mean is None else np.array(self.prior_mean)
        if self._theta0.shape != (d,):
            raise ValueError("prior_mean must have one value per feature")
        self._a0 = _as_matrix(prior_precision, d)
        self._b0 = self._a0 @ self._theta0
        # Data statistics: true data information = _scale · _a (same for _b).
        self._a = np.zeros((d, d))
        self._b = np.zeros(d)
        self._scale = 1.0
        self._decay = 1.0  # Π λ since creation: how much the prior has decayed if forgotten
        self._n_eff = 0.0  # λ-decayed count of learned rows
        self.n_learned = 0
        self._folded = 0  # rows folded so far (index of the next row for drift history)
        self._generation = 0  # bumped when the statistics change other than by folding
        self._pred: FloatArray | None = None
        self._pred_free: FloatArray | None = None
        self._pred_key = (-1, -1)
        #: predict_prequential's coefficients as floats: ((folded, generation, nonneg), list)
        self._coef_list: tuple[tuple[int, int, bool], list[float]] = ((-1, -1, True), [])
        #: intercept_prequential's last answer: ((folded, generation, nonnegative), value)
        self._intercept: tuple[tuple[int, int, bool], float] = ((-1, -1, True), 0.0)
        self._theta_at: tuple[int, int] = (-1, -1)
        self._theta_last: FloatArray | None = None
        self._theta_ab: tuple[FloatArray, FloatArray] = (np.zeros((d, d)), np.zeros(d))
        self._pred_ab: tuple[FloatArray, FloatArray] = (np.zeros((d, d)), np.zeros(d))
        self.n_rejected = 0
        self.n_downweighted = 0
        # Rows not yet folded (plain lists: appending is far cheaper than numpy writes).
        self._zeros = [0.0] * d
        # a row (list) per learn_one, a block (2-D array copy) per run of array rows
        self._pend_x: list[list[float] | FloatArray] = []
        self._pend_blocks = False
        self._pend_y: list[float] = []
        self._pend_w: list[float] = []
        self._since_refresh = 0
        # Weights estimate θ_w and residual scale (frozen between refreshes).
        self._theta_w = self._theta0.copy()
        self._sigma_w: float | None = None
        self._sigma_ew: float | None = None
        self._fast_left = 0
        self._fast_forgetting = self.forgetting
        self._theta: FloatArray | None = None
        self._valid: FloatArray | None = None
        self._positive: npt.NDArray[np.bool_] | None = None  # NNLS warm start

    # ------------------------------------------------------------------ River API

    def learn_one(self, x: Mapping[str, float], y: float, w: float = 1.0) -> None:  # type: ignore[override]
        """Learn one row (missing features read as 0). Non-finite rows are rejected."""
        # Hot path (see bench/rls.py): a list copy and one finiteness test per row; the
        # numpy work happens once per fold.
        row = list(map(x.get, self.features, self._zeros))
        try:
            # One sum catches any NaN/inf (inf − inf is NaN); an overflowing sum rejects too.
            ok = math.isfinite(sum(row) + y + w) and w >= 0.0
        except TypeError:
            ok = False
        if not ok:
            self.n_rejected += 1
            return
        self._pend_x.append(row)
        self._pend_y.append(y)
        self._pend_w.append(w)
        self.n_learned += 1
        self._since_refresh += 1
        # No cache invalidation here: every estimate folds pending rows first, and the fold
        # invalidates the caches.
        if self._since_refresh >= self.refresh_every:
            self._fold()
            self._refresh()

    def learn_intercept(self, y: float) -> None:
        """:meth:`learn_one` of the row ``{feature: 1.0}`` (weight 1) of a one-feature
        learner — an α intercept, a row per finished request — without the dict."""
        if not math.isfinite(y):  # learn_one's test for this row: 1 + y + 1 finite
            self.n_rejected += 1
            return
        self._pend_x.append(_ONE_ROW)  # read, never written
        self._pend_y.append(y)
        self._pend_w.append(1.0)
        self.n_learned += 1
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_every:
            self._fold()
            self._refresh()

    def intercept_prequential(self, nonnegative: bool = True) -> float:
        """:meth:`predict_prequential` of the row ``{feature: 1.0}`` of a one-feature
        learner: its coefficient as of the last fold (kept as a float until the next
        fold: a finished request asks two learners per α target)."""
        if self._pend_y and self.n_learned < _YOUNG_ROWS:
            self._fold()  # as prediction_coef would
        key = (self._folded, self._generation, nonnegative)
        hit = self._intercept
        if hit[0] == key:
            return hit[1]
        value = float(self.prediction_coef(nonnegative)[0])
        self._intercept = (key, value)
        return value

    def learn_many(self, X: Any, y: Any, w: npt.ArrayLike | None = None) -> None:
        """Learn rows of a 2-D array (columns in ``features`` order) or a DataFrame.

        Identical (up to round-off) to calling :meth:`learn_one` row by row.
        """
        xa, ya = self._as_arrays(X, y)
        wa = np.ones(len(ya)) if w is None else np.asarray(w, dtype=float).reshape(-1)
        ok = np.isfinite(xa).all(axis=1) & np.isfinite(ya) & np.isfinite(wa) & (wa >= 0)
        self.n_rejected += int((~ok).sum())
        if not ok.all():
            xa, ya, wa = xa[ok], ya[ok], wa[ok]
        i, n = 0, len(ya)
        k = self.refresh_every
        while i < n:
            take = min(k - self._since_refresh, n - i)
            if self._pend_x or take < k:
                self._pend_x.append(xa[i : i + take].copy())
                self._pend_blocks = True
                self._pend_y.extend(ya[i : i + take].tolist())
                self._pend_w.extend(wa[i : i + take].tolist())
            else:  # a whole aligned chunk: fold it straight from the arrays
                seg = slice(i, i + take)
                self._fold_rows(xa[seg], ya[seg].tolist(), wa[seg].tolist())
            self._since_refresh += take
            self.n_learned += take
            i += take
            if self._since_refresh >= k:
                self._fold()
                self._refresh()
        self._theta = None
        self._valid = None

    def predict_one(self, x: Mapping[str, float]) -> float:  # type: ignore[override]
        theta = self.coef
        return float(sum(theta[i] * float(x.get(f, 0.0)) for i, f in enumerate(self.features)))

    def predict_many(self, X: Any) -> FloatArray:
        """Predictions for the rows of a 2-D array (``features`` column order) or DataFrame."""
        xa, _ = self._as_arrays(X, None)
        return xa @ self.coef  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ estimates

    @property
    def coef(self) -> FloatArray:
        """Unconstrained posterior mean θ = A⁻¹ b (a copy)."""
        return self._current_theta().copy()

    def _current_theta(self) -> FloatArray:
        """:attr:`coef` itself, not a copy (callers only read it)."""
        if self._pend_y:
            self._fold()
        if self._theta is None:
            a, b, self._theta = self._solve_folded()
            # kept for prediction_coef: the same solve for the same statistics
            self._theta_at, self._theta_last = (self._folded, self._generation), self._theta
            self._theta_ab = (a, b)
        return self._theta

    def nonnegative_coef(self) -> FloatArray:
        """The best non-negative fit to the current (forgetting) statistics."""
        if self._pend_y:
            self._fold()
        if self._valid is None:
            theta = self.coef
            if (theta >= 0).all():  # the method: np.all adds a Python wrapper
                # The problem is strictly convex: a feasible unconstrained optimum is the NNLS one.
                self._valid = theta
            else:
                a, b = self.information()
                self._valid = nnls_fast(a, b, self._positive, self.use_native)
                self._positive = self._valid > 0
        return self._valid.copy()

    def prediction_coef(self, nonnegative: bool = True) -> FloatArray:
        """Coefficients as of the last fold, for predicting each observation before it is
        learned (prequential evaluation).

        Once the learner has seen a few hundred rows, up to ``refresh_every - 1`` learned
        rows stale, by design: :attr:`coef` and
        :meth:`nonnegative_coef` fold pending rows first, so calling them before every
        row would fold rows one at a time and pay a solve per observation. Do not modify
        the returned array.

        >>> m = RLSRegressor(["a"], refresh_every=4)
        >>> for _ in range(300):
        ...     m.learn_one({"a": 1.0}, 2.0)
        >>> m.learn_one({"a": 1.0}, 10.0)   # pending in the next chunk
        >>> round(float(m.prediction_coef()[0]), 3)   # as of the last fold
        2.0
        >>> float(m.nonnegative_coef()[0]) > 2.0   # folds the pending row
        True
        """
        if self._pend_y and self.n_learned < _YOUNG_ROWS:
            # A young learner's estimate moves fast, so staleness costs accuracy there;
            # folding early is exact (weights use the frozen θ_w until the chunk refreshes).
            self._fold()
        key = (self._folded, self._generation)
        if self._pred_key != key:
            if self._theta_at == key and self._theta_last is not None:
                self._pred_free = self._theta_last  # θ_w refresh solved this very system
                a, b = self._theta_ab
            else:
                a, b, self._pred_free = self._solve_folded()
            self._pred = None  # the non-negative fit only when asked for (an NNLS solve)
            self._pred_key = key
            self._pred_ab = (a, b)
        if not nonnegative:
            assert self._pred_free is not None
            return self._pred_free
        if self._pred is None:
            theta = self._pred_free
            assert theta is not None
            # floats, not (theta >= 0).all(): numpy's all() costs ~3 µs a call, once a
            # fold of every learner (θ is finite: _solve falls back otherwise)
            if not min(theta.tolist()) >= 0.0:
                a, b = self._pred_ab
                theta = nnls_fast(a, b, self._positive, self.use_native)
                self._positive = theta > 0  # the next fold rarely changes the active set
            self._pred = theta
        return self._pred

    def predict_prequential(self, x: Mapping[str, float], nonnegative: bool = True) -> float:
        """Predict one row (missing features read as 0) with :meth:`prediction_coef`: the
        predict-before-learn of one observation, without folding pending rows.

        >>> m = RLSRegressor(["a", "b"])
        >>> m.predict_prequential({"a": 1.0})
        0.0
        """
        theta = self.prediction_coef(nonnegative)
        if self._d == 1:  # the sum of one product, without the list
            return float(theta[0]) * float(x.get(self.features[0], 0.0))
        key = (self._folded, self._generation, nonnegative)
        if self._coef_list[0] != key:  # the coefficients as floats, once a fold
            self._coef_list = (key, theta.tolist())
        coef = self._coef_list[1]
        return float(sum(map(operator.mul, coef, map(x.get, self.features, self._zeros))))

    def learn_many_prequential(
        self, X: FloatArray, y: FloatArray, *, nonnegative: bool = True
    ) -> FloatArray:
        """Predict each row with :meth:`prediction_coef`, then learn it; returns the
        predictions. Same result as alternating ``prediction_coef`` and a one-row
        ``learn_many`` row by row, at vectorised cost: rows up to the next fold share
        their coefficients anyway (a young learner takes them one at a time).

        >>> import numpy as np
        >>> a, b = RLSRegressor(["x"], refresh_every=4), RLSRegressor(["x"], refresh_every=4)
        >>> X, y = np.ones((300, 1)), np.linspace(1.0, 2.0, 300)
        >>> p = a.learn_many_prequential(X, y)
        >>> q = []
        >>> for i in range(300):
        ...     q.append(float(X[i] @ b.prediction_coef()))
        ...     b.learn_many(X[i : i + 1], y[i : i + 1])
        >>> bool(np.allclose(p, q, rtol=1e-12, atol=0))
        True
        """
        xa, ya = self._as_arrays(X, y)
        if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
            return self._prequential_checked(xa, ya, nonnegative)  # rejects row by row
        return self.prequential_finite(xa, ya.tolist(), nonnegative=nonnegative)

    def rows_to_fold(self) -> int:
        """Rows :meth:`prequential_finite` takes in its next run: up to the next fold
        (one at a time while the learner is young)."""
        if self.n_learned < _YOUNG_ROWS:
            return 1
        return max(1, self.refresh_every - self._since_refresh)

    def prequential_finite(
        self,
        X: FloatArray,
        y: list[float],
        *,
        nonnegative: bool = True,
        out: FloatArray | None = None,
    ) -> FloatArray:
        """:meth:`learn_many_prequential` of rows known to be finite (``X`` a float array in
        ``features`` order, ``y`` plain floats): no validation, each run of rows up to the
        next fold folded straight from ``X``. The predictions go to ``out`` when given (a
        float64 array of ``len(y)``, e.g. a slice of a larger one) and are returned."""
        n = len(y)
        if out is None:
            out = np.empty(n)
        i = 0
        k = self.refresh_every
        whole = X.flags.c_contiguous
        while i < n:
            take = 1 if self.n_learned < _YOUNG_ROWS else max(1, k - self._since_refresh)
            j = min(n, i + take)
            if j - i == k and whole and not self._pend_y and self._native_ok(k):
                # a whole fold straight from X (what the steady pair's pieces are): its
                # predictions made by the compiled fold, no pending rows, no copies
                self._fold_native(X[i:j], y[i:j], None, self.prediction_coef(nonnegative), out[i:j])
                self._since_refresh += k
                self.n_learned += k
                self._refresh()
                i = j
                continue
            x = X[i:j]
            out[i:j] = x @ self.prediction_coef(nonnegative)
            m = j - i
            # learn_many's bookkeeping, for finite rows of weight 1
            if (
                self._pend_blocks
                and self._since_refresh + m >= k
                and all(type(r) is np.ndarray for r in self._pend_x)
            ):
                # this run completes a fold begun by an earlier run (a steady pair's
                # pieces are not aligned with its learners' folds): what _fold would
                # fold, the waiting blocks and this run in one array, without copying
                # the run first
                xs = np.concatenate([*self._pend_x, x])
                ys = [float(v) for v in self._pend_y] + [float(v) for v in y[i:j]]
                ws = [float(v) for v in self._pend_w] + [1.0] * m
                self._pend_x, self._pend_y, self._pend_w = [], [], []
                self._pend_blocks = False
                self._since_refresh += m
                self.n_learned += m
                self._fold_rows(xs, ys, ws)
                self._refresh()
                self._theta = None
                self._valid = None
                i = j
                continue
            if self._pend_y or m < k:
                self._pend_x.append(x.copy())
                self._pend_blocks = True
                self._pend_y.extend(y[i:j])
                self._pend_w.extend([1.0] * m)
            else:
                self._fold_rows(x, y[i:j], [1.0] * m)
            self._since_refresh += m
            self.n_learned += m
            if self._since_refresh >= k:
                self._fold()
                self._refresh()
            self._theta = None
            self._valid = None
            i = j
        return out

    def _prequential_checked(self, X: FloatArray, y: FloatArray, nonnegative: bool) -> FloatArray:
        n = len(y)
        out = np.empty(n)
        i = 0
        while i < n:
            if self.n_learned < _YOUNG_ROWS:
                k = 1
            else:
                k = max(1, self.refresh_every - self._since_refresh)
            seg = slice(i, min(n, i + k))
            out[seg] = X[seg] @ self.prediction_coef(nonnegative)
            self.learn_many(X[seg], y[seg])
            i = seg.stop
        return out

    def information(self) -> tuple[FloatArray, FloatArray]:
        """Total information ``(A, b)``: decayed data plus prior."""
        if self._pend_y:
            self._fold()
        return self._folded_information()

    def _folded_information(self) -> tuple[FloatArray, FloatArray]:
        """``(A, b)`` of the rows folded so far (pending rows left out), plus the prior."""
        w = self._prior_weight()
        if w == 1.0:  # the prior is not forgotten (the default): no product to make
            return self._scale * self._a + self._a0, self._scale * self._b + self._b0
        return self._scale * self._a + w * self._a0, self._scale * self._b + w * self._b0

    def _solve_folded(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(A, b) of the rows folded so far plus the prior, and θ = A⁻¹b: in one call of
        the compiled fold when it is there (a Cholesky of its own: ~1 µs against ~10 for
        numpy's calls around LAPACK's), else :meth:`_folded_information` and
        :func:`_solve`. A system the compiled solve declines (not positive definite, a
        non-finite θ) is solved by the pure path, fallbacks and all."""
        fn = _native.solve
        if fn is not None and self.use_native and self._d <= _NATIVE_MAX_FEATURES:
            d = self._d
            a, b, theta = np.empty((d, d)), np.empty(d), np.empty(d)
            if fn(
                self._a, self._b, self._scale, self._a0, self._b0, self._prior_weight(), a, b, theta
            ):
                return a, b, theta
            return a, b, _solve(a, b, self._theta0)
        a, b = self._folded_information()
        return a, b, _solve(a, b, self._theta0)

    def _prior_weight(self) -> float:
        return self._decay if self.forget_prior else 1.0

    def data_information(self) -> tuple[FloatArray, FloatArray]:
        """The decayed data statistics alone (what two learners add when merged)."""
        if self._pend_y:
            self._fold()
        return self._scale * self._a, self._scale * self._b

    def variance_ratio(self) -> FloatArray:
        """Posterior / prior variance per coefficient: ≈1 means the data told us nothing."""
        a, _ = self.information()
        try:
            post = np.diag(np.linalg.inv(a))
            prior = np.diag(np.linalg.inv(self._a0))
        except np.linalg.LinAlgError:
            return np.ones(self._d)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(prior > 0, post / prior, 1.0)
        return np.clip(np.nan_to_num(ratio, nan=1.0), 0.0, 1.0)  # type: ignore[no-any-return]

    def coef_std(self) -> FloatArray:
        """Posterior standard deviation of each coefficient: ``σ̂ · √diag(A⁻¹)``.

        ``σ̂`` is the robust residual scale (relative when ``weighting='relative'``, which is
        also the unit the information is in), so this is the sampling error of θ over the
        learner's effective (forgetting) window. Infinite before any scale is known.
        """
        sigma = self._sigma_ew
        if sigma is None:
            return np.full(self._d, np.inf)
        a, _ = self.information()
        try:
            var = np.diag(np.linalg.inv(a))
        except np.linalg.LinAlgError:
            return np.full(self._d, np.inf)
        return sigma * np.sqrt(np.maximum(var, 0.0))  # type: ignore[no-any-return]

    def identified(
        self, threshold: float = 0.5, max_rel_std: float | None = None
    ) -> npt.NDArray[np.bool_]:
        """Which coefficients the data pins down.

        A term is identified when its column has been excited, the data explains more than
        ``1 − threshold`` of its prior variance and, if ``max_rel_std`` is given, its
        posterior standard deviation is at most that fraction of its value. All-zero
        columns are never identified; collinear groups (e.g. terms constant within one
        configuration: weights, layers, per-step) are identified only as a sum, so each
        member keeps a large posterior variance and is reported unidentified.
        """
        a_data, _ = self.data_information()
        ok = (np.diag(a_data) > 0) & (self.variance_ratio() < threshold)
        if max_rel_std is not None:
            theta = np.abs(self.coef)
            ok &= self.coef_std() <= max_rel_std * np.maximum(theta, 1e-300)
        return ok  # type: ignore[no-any-return]

    @property
    def n_effective(self) -> float:
        """λ-decayed count of learned rows (the learner's effective window)."""
        if self._pend_y:
            self._fold()
        return self._n_eff

    @property
    def residual_scale(self) -> float | None:
        """Current robust residual scale (relative if ``weighting='relative'``)."""
        return self._sigma_ew

    # ------------------------------------------------------------------ drift policy

    def inflate(self, keep: float, fast_forgetting: float | None = None, fast_for: int = 0) -> None:
        """Drop confidence in the past without moving the estimate (covariance inflation).

        Data information is scaled by ``keep`` and ``b`` re-centred so θ is unchanged at
        this instant; the next observations therefore move θ quickly. Optionally forget
        faster (``fast_forgetting``) for the next ``fast_for`` rows.
        """
        theta = self.coef
        prior_weight = self._prior_weight()
        self._a *= keep
        self._n_eff *= keep
        a_total = self._scale * self._a + prior_weight * self._a0
        self._b = (a_total @ theta - prior_weight * self._b0) / self._scale
        if fast_forgetting is not None and fast_for > 0:
            self._fast_forgetting = fast_forgetting
            self._fast_left = fast_for
        self._theta = None
        self._valid = None
        self._generation += 1

    # ------------------------------------------------------------------ merge / state

    def merge(self, other: RLSRegressor) -> RLSRegressor:
        """Combine with a learner that saw the *later* part of the stream, exactly.

        ``self`` learned stream S₁, ``other`` (same features and prior, fresh start)
        learned S₂; the result equals one learner that learned S₁ then S₂: self's data is
        decayed by other's total forgetting and the statistics add. With λ = 1 the order
        does not matter.
        """
        if other.features != self.features:
            raise ValueError("cannot merge learners with different features")
        if not (
            np.array_equal(other._a0, self._a0) and np.array_equal(other._theta0, self._theta0)
        ):
            raise ValueError("cannot merge learners with different priors")
        a1, b1 = self.data_information()
        a2, b2 = other.data_information()
        out = self.clone()
        d2 = other._decay
        out._a = d2 * a1 + a2
        out._b = d2 * b1 + b2
        out._scale = 1.0
        out._decay = self._decay * d2
        out._n_eff = d2 * self._n_eff + other.n_effective
        out.n_learned = self.n_learned + other.n_learned
        out._folded = out.n_learned
        out.n_rejected = self.n_rejected + other.n_rejected
        out.n_downweighted = self.n_downweighted + other.n_downweighted
        out._sigma_ew = other._sigma_ew if other._sigma_ew is not None else self._sigma_ew
        out._sigma_w = out._sigma_ew
        out._theta_w = out.coef
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly, as plain JSON-able values."""
        if self._pend_y:
            self._fold()
        return {
            "version": 1,
            "params": {
                "features": list(self.features),
                "forgetting": self.forgetting,
                "prior_mean": self._theta0.tolist(),
                "prior_precision": self._a0.tolist(),
                "forget_prior": self.forget_prior,
                "weighting": self.weighting,
                "huber": self.huber,
                "scale_memory": self.scale_memory,
                "refresh_every": self.refresh_every,
            },
            "a": (self._scale * self._a).tolist(),
            "b": (self._scale * self._b).tolist(),
            "decay": self._decay,
            "n_eff": self._n_eff,
            "n_learned": self.n_learned,
            "n_rejected": self.n_rejected,
            "n_downweighted": self.n_downweighted,
            "since_refresh": self._since_refresh,
            "theta_w": self._theta_w.tolist(),
            "sigma_w": self._sigma_w,
            "sigma_ew": self._sigma_ew,
            "fast_left": self._fast_left,
            "fast_forgetting": self._fast_forgetting,
            "drift": None if self.drift is None else self.drift.state_dict(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume exactly where :meth:`state_dict` left off.

        The state carries the learner's parameters and its drift monitor (or that it had
        none), which replace those it was constructed with: any learner can be loaded
        into, e.g. ``RLSRegressor([])``.

        >>> m = RLSRegressor(["a"], forgetting=0.99)
        >>> m.learn_one({"a": 2.0}, 4.0)
        >>> back = RLSRegressor([])
        >>> back.load_state(m.state_dict())
        >>> back.features, back.forgetting, back.n_learned, back.coef.round(3).tolist()
        (['a'], 0.99, 1, [2.0])
        """
        p = state["params"]
        drift = None
        if state.get("drift") is not None:
            from coeffd.learners.drift import DriftMonitor

            drift = DriftMonitor()
            drift.load_state(state["drift"])
        RLSRegressor.__init__(
            self,
            features=p["features"],
            forgetting=p["forgetting"],
            prior_mean=p["prior_mean"],
            prior_precision=np.array(p["prior_precision"]),
            forget_prior=p["forget_prior"],
            weighting=p["weighting"],
            huber=p["huber"],
            scale_memory=p["scale_memory"],
            refresh_every=p["refresh_every"],
            drift=drift,
        )
        self._a = np.array(state["a"], dtype=float)
        self._b = np.array(state["b"], dtype=float)
        self._decay = float(state["decay"])
        self._n_eff = float(state["n_eff"])
        self.n_learned = int(state["n_learned"])
        self._folded = self.n_learned
        self.n_rejected = int(state["n_rejected"])
        self.n_downweighted = int(state["n_downweighted"])
        self._since_refresh = int(state["since_refresh"])
        self._theta_w = np.array(state["theta_w"], dtype=float)
        self._sigma_w = state["sigma_w"]
        self._sigma_ew = state["sigma_ew"]
        self._fast_left = int(state["fast_left"])
        self._fast_forgetting = float(state["fast_forgetting"])

    def clone(
        self, new_params: dict[str, Any] | None = None, include_attributes: bool = False
    ) -> RLSRegressor:  # type: ignore[override]
        """A fresh learner with the same parameters (and a fresh drift monitor)."""
        params: dict[str, Any] = {
            "features": self.features,
            "forgetting": self.forgetting,
            "prior_mean": self.prior_mean,
            "prior_precision": self.prior_precision,
            "forget_prior": self.forget_prior,
            "weighting": self.weighting,
            "huber": self.huber,
            "scale_memory": self.scale_memory,
            "refresh_every": self.refresh_every,
            "drift": None if self.drift is None else self.drift.clone(),
        }
        params.update(new_params or {})
        return RLSRegressor(**params)

    @classmethod
    def _unit_test_params(cls) -> Any:
        yield {"features": ["x"]}

    # ------------------------------------------------------------------ internals

    def _as_arrays(self, X: Any, y: Any) -> tuple[FloatArray, FloatArray]:
        if hasattr(X, "columns"):  # pandas / polars DataFrame: pick columns by name
            cols = list(X.columns)
            xa = np.zeros((len(X), self._d))
            for c in cols:
                j = self._index.get(c)
                if j is not None:
                    xa[:, j] = np.asarray(X[c], dtype=float)
        else:
            xa = np.asarray(X, dtype=float)
            if xa.ndim != 2 or xa.shape[1] != self._d:
                raise ValueError(f"expected an (n, {self._d}) array")
        ya = np.zeros(len(xa)) if y is None else np.asarray(y, dtype=float).reshape(-1)
        return xa, ya

    def _fold(self) -> None:
        """Fold buffered rows into (A, b), weights computed with the frozen θ_w and σ_w."""
        if not self._pend_y:
            return
        if self._d == 1 and not self._pend_blocks and self._native_ok(len(self._pend_y)):
            # the α intercepts: the compiled fold reads the rows (lists) as they are and
            # sums as _fold_scalar does
            rows, y, w = self._pend_x, self._pend_y, self._pend_w
            self._pend_x, self._pend_y, self._pend_w = [], [], []
            self._fold_native(rows, [float(v) for v in y], [float(v) for v in w])  # type: ignore[arg-type]
            return
        if self._d == 1 and not self._pend_blocks:
            # one feature (the α intercepts, a row per finished request): plain floats
            xs = [r[0] for r in self._pend_x]  # type: ignore[index]
            y, w = self._pend_y, self._pend_w
            self._pend_x, self._pend_y, self._pend_w = [], [], []
            self._fold_scalar(xs, [float(v) for v in y], [float(v) for v in w])
            return
        if self._pend_blocks:
            d = self._d
            x = np.concatenate([np.asarray(r, dtype=float).reshape(-1, d) for r in self._pend_x])
            self._pend_blocks = False
        else:
            x = np.array(self._pend_x, dtype=float)
        y, w = self._pend_y, self._pend_w
        self._pend_x, self._pend_y, self._pend_w = [], [], []
        self._fold_rows(x, [float(v) for v in y], [float(v) for v in w])

    def _native_ok(self, m: int) -> bool:
        """Whether the compiled fold takes a fold of ``m`` rows (:mod:`learners.native`):
        not the first robust chunk (its residual scale starts from a median), nor a zero
        scale (the pure path raises there), nor more rows than it buffers."""
        if (
            _native.fold is None
            or not self.use_native
            or m > _NATIVE_MAX_ROWS
            or self._d > _NATIVE_MAX_FEATURES
        ):
            return False
        if self.weighting == "relative" or self.huber is not None or self.drift is not None:
            return bool(self._sigma_w)  # None (first chunk) or 0.0: the pure path
        return True

    def _fold_rows(self, x: FloatArray, ys: list[float], ws: list[float]) -> None:
        """Fold rows ``x`` (finite) with targets ``ys`` and weights ``ws`` (``ws`` is
        overwritten). The per-row scalars are plain floats: at a fold's 16 rows the
        arithmetic is the same as numpy's, element by element, without ~30 array calls."""
        if self._native_ok(len(ys)) and x.flags.c_contiguous:
            # (another layout makes numpy call BLAS differently: the pure path keeps it)
            self._fold_native(x, ys, ws)
            return
        first_index = self._folded
        detected_at = -1
        if self.weighting == "relative" or self.huber is not None or self.drift is not None:
            yhat = (x @ self._theta_w).tolist()
            detected_at = self._robust_weights(yhat, ys, ws, first_index)
        c = self._fold_weights(ws)
        self._accumulate(x, c, ys)
        if detected_at >= 0 and self.drift is not None:
            pol = self.drift
            self.inflate(pol.keep, pol.fast_forgetting, pol.fast_for)

    def _fold_native(
        self,
        x: FloatArray | list[list[float]],
        ys: list[float],
        ws: list[float] | None,
        coef: FloatArray | None = None,
        pred: FloatArray | None = None,
    ) -> None:
        """:meth:`_fold_rows` (``x`` an array) or :meth:`_fold_scalar` (``x`` a list of
        one-value rows) by the compiled fold (``_fold.c``): the per-row scalars are the
        same float operations in the same order, the predictions ``x θ_w`` and the two
        products are summed there in row order (BLAS sums in its own: the results agree
        with the pure path at round-off, 1e-9 relative being the contract). The state is
        advanced in the pure path's order, but for the drift monitor, which sees the
        residuals after the statistics took the rows (they do not depend on it; an alarm
        inflates after the fold either way). ``ws`` None: weights 1; ``coef`` and
        ``pred``: the rows' predictions ``x coef`` are written to ``pred`` first."""
        first_index = self._folded
        robust = self.weighting == "relative" or self.huber is not None or self.drift is not None
        mode = 0 if not robust else 2 if self.weighting == "relative" else 1
        sigma_w = self._sigma_w if robust else 1.0
        s_ew = self._sigma_ew if self._sigma_ew is not None else sigma_w
        huber = self.huber
        m = len(ys)
        after, scale = self._advance(m)
        done, s_ew, n_down, clipped, c = _native.fold(
            x,
            ys,
            ws,
            after,
            scale,
            self._a,
            self._b,
            self._theta_w,
            mode,
            huber,
            sigma_w,
            0.0 if s_ew is None else s_ew,
            1.0 / max(self.scale_memory, 1.0),
            3.0 if huber is None else huber,
            _SQRT_HALF_PI,
            None,
            None,
            None,
            *(() if coef is None else (coef, pred)),
        )
        if robust:
            self._sigma_ew = s_ew
            self.n_downweighted += n_down
        if not done:  # a row too large to square: the array path filters it out
            self._accumulate(np.asarray(x, dtype=float).reshape(m, self._d), c, ys)
        else:
            self._theta = None
            self._valid = None
        if robust and self.drift is not None and self.drift.update_many(clipped, first_index) >= 0:
            pol = self.drift
            self.inflate(pol.keep, pol.fast_forgetting, pol.fast_for)

    def _fold_scalar(self, xs: list[float], ys: list[float], ws: list[float]) -> None:
        """:meth:`_fold_rows` of a one-feature learner in plain floats: numpy's fixed cost
        per call (~1 µs, ~15 calls a fold) is most of a 16-row fold at d = 1. The same
        arithmetic row by row; only the two sums (``A``, ``b``) are added up in row order
        rather than by BLAS, so results agree with the array path to round-off (~1e-15
        relative per fold; ``tests/learners/test_fast_paths.py``)."""
        first_index = self._folded
        detected_at = -1
        if self.weighting == "relative" or self.huber is not None or self.drift is not None:
            t = float(self._theta_w[0])
            detected_at = self._robust_weights([xi * t for xi in xs], ys, ws, first_index)
        c = self._fold_weights(ws)
        sa = sb = 0.0
        big = 0.0
        for xi, ci, yi in zip(xs, c, ys, strict=True):
            xci = xi * math.sqrt(ci)
            cyi = ci * yi
            sa += xci * xci
            sb += xi * cyi
            axc = abs(xci)
            if axc > big:
                big = axc
        if big < 1e150 and math.isfinite(sa) and math.isfinite(sb):
            self._a[0, 0] += sa
            self._b[0] += sb
            self._theta = None
            self._valid = None
        else:  # a row too large to square: the array path rejects it
            self._accumulate(np.array(xs)[:, None], c, ys)
        if detected_at >= 0 and self.drift is not None:
            pol = self.drift
            self.inflate(pol.keep, pol.fast_forgetting, pol.fast_for)

    def _fold_weights(self, ws: list[float]) -> list[float]:
        """Advance the decay by a fold of ``len(ws)`` rows; returns each row's weight in
        the scaled statistics (``w · λ-decay after it / scale``)."""
        after, scale = self._advance(len(ws))
        return [wi * ai / scale for wi, ai in zip(ws, after, strict=True)]

    def _advance(self, m: int) -> tuple[list[float], float]:
        """Advance the decay by a fold of ``m`` rows: (each row's decay after it, the
        statistics' scale now)."""
        self._folded += m
        after, after_sum, total = self._decays(m)
        self._scale *= total
        self._decay *= total
        self._n_eff = self._n_eff * total + after_sum
        if self._scale < _RENORMALISE_BELOW:
            self._a *= self._scale
            self._b *= self._scale
            self._scale = 1.0
        return after, self._scale

    def _accumulate(self, x: FloatArray, c: list[float], ys: list[float]) -> None:
        """Add rows ``x`` with weights ``c`` and targets ``ys`` to ``(A, b)``."""
        xc = x * np.array([math.sqrt(ci) for ci in c])[:, None]
        cys = [ci * yi for ci, yi in zip(c, ys, strict=True)]
        cy = np.array(cys)
        # A finite row can still overflow once squared (|x| ~ 1e200): reject it here rather
        # than let one inf poison the statistics for good.
        if not (float(np.abs(xc).max(initial=0.0)) < 1e150 and math.isfinite(sum(cys))):
            fine = np.isfinite(xc).all(axis=1) & np.isfinite(cy) & (np.abs(xc).max(axis=1) < 1e150)
            bad = int((~fine).sum())
            self.n_rejected += bad
            self.n_learned -= bad
            xc, x, cy = xc[fine], x[fine], cy[fine]
        self._a += xc.T @ xc  # symmetric by construction
        self._b += x.T @ cy
        self._theta = None
        self._valid = None

    def _robust_weights(
        self, yhat: list[float], ys: list[float], ws: list[float], first: int
    ) -> int:
        """Relative and Huber weights of a fold's rows (into ``ws``; ``yhat``: the rows'
        predictions by ``θ_w``), the residual scale, and the drift monitor's look at them;
        returns the index of the row that set off an alarm, or −1."""
        huber = self.huber
        relative = self.weighting == "relative"
        es: list[float] = []
        for i, (yi, pi) in enumerate(zip(ys, yhat, strict=True)):
            if relative:
                # Guard: a θ_w far below the data (prior of zeros, just after drift) would
                # give those rows huge weights; weight them by the measurement instead.
                ay = abs(yi)
                den = pi if pi >= 0.5 * ay else ay
                if den < 1e-12:
                    den = 1e-12
                es.append((yi - pi) / den)
                ws[i] *= 1.0 / (den * den)
            else:
                es.append(yi - pi)
        sigma_w = self._sigma_w
        if sigma_w is None:
            # First chunk: start the scale from a robust estimate (MAD).
            sigma_w = float(np.median(np.abs(es))) * 1.4826 or 1.0
            self._sigma_w = sigma_w
        clip = 3.0 if huber is None else huber
        # EW mean absolute residual, with clipped contributions (stalls don't inflate it).
        g = 1.0 / max(self.scale_memory, 1.0)
        cap = clip * sigma_w
        s_ew = self._sigma_ew if self._sigma_ew is not None else sigma_w
        clipped: list[float] = []
        for i, e in enumerate(es):
            z = e / sigma_w
            if huber is not None:
                az = abs(z)
                if az > huber:
                    self.n_downweighted += 1
                    ws[i] *= huber / (az if az > 1e-300 else 1e-300)
            ae = abs(e)
            s_ew += g * ((ae if ae < cap else cap) * _SQRT_HALF_PI - s_ew)
            clipped.append(clip if z > clip else -clip if z < -clip else z)
        self._sigma_ew = s_ew
        if self.drift is None:
            return -1
        return self.drift.update_many(clipped, first)

    def _decays(self, m: int) -> tuple[list[float], float, float]:
        """(weight of each of ``m`` rows folded now, their sum, total decay): row ``i``
        carries ``Π_{j>i} λ_j``, with the fast spell's λ for the first rows after an alarm.
        Without a spell the result depends on (λ, m) alone and is computed once."""
        if self._fast_left <= 0:
            key = (self.forgetting, m)
            hit = _DECAYS.get(key)
            if hit is None:
                hit = _DECAYS[key] = _decays(np.full(m, self.forgetting))
            return hit
        lam = np.full(m, self.forgetting)
        k = min(self._fast_left, m)
        lam[:k] = self._fast_forgetting
        self._fast_left -= k
        return _decays(lam)

    def _refresh(self) -> None:
        self._since_refresh = 0
        if self.weighting != "none" or self.huber is not None or self.drift is not None:
            # only robust/relative weights and drift need θ_w (not a copy: θ_w is only
            # ever replaced, never written into)
            self._theta_w = self._current_theta()
        self._sigma_w = self._sigma_ew


#: (λ, rows) → _decays of a fold without a fast spell (a few distinct keys per process)
_DECAYS: dict[tuple[float, int], tuple[list[float], float, float]] = {}


def _decays(lam: FloatArray) -> tuple[list[float], float, float]:
    m = len(lam)
    after = np.ones(m)
    if m > 1:
        after[:-1] = np.cumprod(lam[::-1])[::-1][1:]
    return after.tolist(), float(after.sum()), float(np.prod(lam))


def _as_matrix(p: float | Sequence[float] | FloatArray, d: int) -> FloatArray:
    arr = np.asarray(p, dtype=float)
    if arr.ndim == 0:
        out = np.eye(d) * float(arr)
    elif arr.ndim == 1:
        if arr.shape != (d,):
            raise ValueError("prior_precision diagonal must have one value per feature")
        out = np.diag(arr)
    else:
        if arr.shape != (d, d):
            raise ValueError("prior_precision matrix must be d×d")
        out = 0.5 * (arr + arr.T)
    if not np.all(np.isfinite(out)) or np.any(np.diag(out) < 0):
        raise ValueError("prior_precision must be finite and non-negative")
    return out


def _solve(a: FloatArray, b: FloatArray, fallback: FloatArray) -> FloatArray:
    if len(a) == 1:
        a00 = float(a[0, 0])
        if a00 > 0.0:
            # Cholesky of 1×1 in floats: c = √a, then the two triangular solves (b/c)/c —
            # LAPACK's operations on one element, without numpy's cost per call
            c = math.sqrt(a00)
            t = float(b[0]) / c / c
            return np.array([t]) if math.isfinite(t) else fallback.copy()
    theta = spd_solve(a, b)
    if theta is None:
        # Singular (only possible with forget_prior and no excitation): minimum-norm
        # solution around the prior mean.
        theta = fallback + np.linalg.lstsq(a, b - a @ fallback, rcond=None)[0]
    if not np.isfinite(theta).all():
        return fallback.copy()
    return theta
