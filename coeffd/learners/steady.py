"""The published step-time estimate: long memory in steady state, fast only after a change.

Why two learners. The fast tracker (λ = 0.989, ~90 observations of memory) is what makes
drift recovery quick, but published straight it wobbles: consecutive versions of a
steady engine differed by several percent in a BLIS run (issue 15). A long-memory
learner (``steady_forgetting``, ~10,000 observations) averages that wobble away and
pins down weakly separated terms, but alone it would lag every change. So both learn
every row, and the *published* estimate is

* the long-memory one in steady state;
* the fast one while the physics is changing — from a drift alarm of either learner
  (the long-memory one's residuals shift when it lags a gradual change), or when the long-memory estimate's recent error exceeds the fast one's by
  ``margin`` (a gradual change the detector does not flag) — during which the
  long-memory learner forgets fast itself (covariance inflation + the drift policy's
  fast spell) so that it only holds post-change data;
* the long-memory one again once it has been re-learning for ``hold`` rows and is
  at least as accurate as the fast one on the recent rows (during a gradual change it
  never is: the fast tracker stays published until the change is over).

Identification. Some of the 11 BLIS terms cannot be separated by one configuration's
batches (constants such as ``T_weight``, ``L`` and ``one`` move together; zero columns
such as TP communication at TP 1) and some only weakly (``T_pf_kv`` against the token
part of ``T_pf_compute``). :func:`identified_fit` estimates only the directions of
coefficient space the long-memory data pin down to ``max_rel_std`` and keeps the pooled
prior in the others, so an unidentified term is published at its prior rather than
driven to 0 by noise in a collinear pair, and :func:`term_sources` says which.

>>> import numpy as np
>>> from coeffd.learners.rls import RLSRegressor
>>> mk = lambda lam: RLSRegressor(["a", "b"], forgetting=lam, prior_mean=[1.0, 1.0],
...                               prior_precision=1e-6, weighting="relative")
>>> est = SteadyEstimator(mk(0.98), mk(0.9995))
>>> rng = np.random.default_rng(0)
>>> X = np.column_stack([rng.uniform(1, 10, 3000), np.ones(3000)])
>>> p = est.learn_many_prequential(X, X @ [2.0, 5.0] * np.exp(rng.normal(0, 0.03, 3000)))
>>> est.mode, est.published.nonnegative_coef().round(1).tolist()
('steady', [2.0, 5.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from coeffd.learners import native as _native
from coeffd.learners.rls import RLSRegressor

__all__ = ["SteadyEstimator", "identified_fit", "term_sources"]

FloatArray = npt.NDArray[np.float64]

STEADY = "steady"
TRACKING = "tracking"
_ERR_CLIP = 0.3  # a stalled step's relative error counts as 0.3 in the comparison


class SteadyEstimator:
    """Fast tracker + long-memory learner of one target; see the module docstring.

    Parameters
    ----------
    fast
        The fast tracker; carries the drift detector.
    slow
        The long-memory learner; may carry a detector of its own (it reacts to its own
        alarms by the drift policy, and is inflated when the fast one alarms or when the
        comparison says it lags).
    memory
        Rows of the exponentially weighted error comparison.
    margin
        How much worse (relative) the long-memory estimate may be before it is taken to
        lag.
    hold
        Rows of re-learning before the long-memory estimate is published again.
    bias_z
        How many standard errors its mean signed residual may be off zero.
    keep, fast_forgetting, fast_for
        The long-memory learner's reaction (the drift policy's values).

    Examples
    --------
    One observation at a time (River dicts), the way the α targets learn:

    >>> mk = lambda lam: RLSRegressor(["one"], forgetting=lam, prior_mean=[1.0],
    ...                               prior_precision=1e-6, weighting="relative")
    >>> est = SteadyEstimator(mk(0.98), mk(0.9995))
    >>> for _ in range(500):
    ...     _ = est.learn_one_prequential({"one": 1.0}, 40.0)
    >>> est.mode, round(est.learn_one_prequential({"one": 1.0}, 40.0), 2)
    ('steady', 40.0)

    Its state (the learners checkpoint themselves) loads into an estimator of the same
    learners:

    >>> back = SteadyEstimator(est.fast, est.slow)
    >>> back.load_state(est.state_dict())
    >>> back.state_dict() == est.state_dict()
    True
    """

    def __init__(
        self,
        fast: RLSRegressor,
        slow: RLSRegressor,
        *,
        memory: int = 64,
        margin: float = 0.25,
        hold: int = 1000,
        bias_z: float = 3.5,
        keep: float = 0.01,
        fast_forgetting: float = 0.97,
        fast_for: int = 60,
    ) -> None:
        self.fast = fast
        self.slow = slow
        self.memory = memory
        self.margin = margin
        self.hold = hold
        self.bias_z = bias_z
        self.keep = keep
        self.fast_forgetting = fast_forgetting
        self.fast_for = fast_for
        self.mode = STEADY
        self.switches = 0  # entries into tracking
        self._err_fast = math.nan  # EW mean |relative error| of each learner's predictions
        self._err_slow = math.nan
        self._bias_slow = 0.0  # EW mean signed relative residual of each learner
        self._bias_fast = 0.0
        self._rows = 0  # rows since the last mode change
        self._alarms = self._fast_alarms()
        self._slow_seen = self._slow_alarms()

    @property
    def published(self) -> RLSRegressor:
        """The learner whose coefficients are published now."""
        return self.slow if self.mode == STEADY else self.fast

    def _fast_alarms(self) -> int:
        return 0 if self.fast.drift is None else self.fast.drift.detections

    def _slow_alarms(self) -> int:
        return 0 if self.slow.drift is None else self.slow.drift.detections

    def learn_many_prequential(
        self, X: FloatArray, y: FloatArray, *, nonnegative: bool = True
    ) -> FloatArray:
        """Predict each row with the published estimate, then learn it in both learners.

        Rows are taken in pieces that end where the learners fold (at most
        ``refresh_every`` rows), so a mode change (an alarm folds at chunk boundaries)
        takes effect at the next piece, as it would row by row; a piece is then one run
        of each learner's prequential fold (one prediction, one fold straight from the
        array), not the tail of one fold and the head of the next.
        """
        xa = np.asarray(X, dtype=float)
        ya = np.asarray(y, dtype=float)
        finite = bool(np.isfinite(xa).all() and np.isfinite(ya).all())
        ys = ya.tolist()
        n = len(ys)
        # each learner's predictions straight into one array (a slice a piece); the
        # published ones are the long-memory learner's but for the pieces predicted
        # while tracking
        pf_all, ps_all = np.empty(n), np.empty(n)
        tracking: list[slice] = []
        fast, slow = self.fast, self.slow
        i = 0
        while i < n:
            # both learn every row, so their folds coincide (min: in case they do not)
            j = min(n, i + min(fast.rows_to_fold(), slow.rows_to_fold()))
            xs, yl = xa[i:j], ys[i:j]
            pf, ps = pf_all[i:j], ps_all[i:j]
            if finite:  # validated once for the whole batch
                fast.prequential_finite(xs, yl, nonnegative=nonnegative, out=pf)
                slow.prequential_finite(xs, yl, nonnegative=nonnegative, out=ps)
            else:
                pf[:] = fast.learn_many_prequential(xs, ya[i:j], nonnegative=nonnegative)
                ps[:] = slow.learn_many_prequential(xs, ya[i:j], nonnegative=nonnegative)
            if self.mode != STEADY:  # the mode before this piece's comparison
                tracking.append(slice(i, j))
            self._compare_rows(yl, pf, ps)
            i = j
        for seg in tracking:
            ps_all[seg] = pf_all[seg]
        return ps_all

    def learn_one_prequential(self, x: Mapping[str, float], y: float) -> float:
        """Predict one row (a River dict) with the published estimate as of each
        learner's last fold (:meth:`RLSRegressor.predict_prequential`), then learn it by
        each learner's hot path (:meth:`RLSRegressor.learn_one`); returns the prediction.
        For learners fed one observation at a time (the α targets, one row per request)."""
        pf = self.fast.predict_prequential(x)
        ps = self.slow.predict_prequential(x)
        out = ps if self.mode == STEADY else pf
        self.fast.learn_one(x, y)
        self.slow.learn_one(x, y)
        self._compare_one(y, pf, ps)
        return out

    def learn_intercept_prequential(self, y: float) -> float:
        """:meth:`learn_one_prequential` of the row ``{feature: 1.0}`` of one-feature
        learners (the α intercepts): the same predictions and updates, without the dicts."""
        pf = self.fast.intercept_prequential()
        ps = self.slow.intercept_prequential()
        out = ps if self.mode == STEADY else pf  # the mode before this row's comparison
        self.fast.learn_intercept(y)
        self.slow.learn_intercept(y)
        self._compare_one(y, pf, ps)
        return out

    def learn_row_scored(self, x: FloatArray, y: float) -> float:
        """One row as a 1-D array (``features`` order), predicted with each
        learner's current (freshly folded) non-negative coefficients rather than those of
        its last fold: slower, the way ``bench learning`` scores a learner. Returns the
        published estimate's prediction."""
        pf = float(x @ self.fast.nonnegative_coef())
        ps = float(x @ self.slow.nonnegative_coef())
        out = ps if self.mode == STEADY else pf
        xa, ya = x[None, :], np.array([y])
        self.fast.learn_many(xa, ya)
        self.slow.learn_many(xa, ya)
        self._compare(ya, np.array([pf]), np.array([ps]))
        return out

    def _compare(self, y: FloatArray, pf: FloatArray, ps: FloatArray) -> None:
        self._compare_rows(y.tolist(), pf.tolist(), ps.tolist())

    def _compare_rows(
        self, ys: list[float], pfs: list[float] | FloatArray, pss: list[float] | FloatArray
    ) -> None:
        g = 1.0 / max(self.memory, 1)
        f, s, b, bf = self._err_fast, self._err_slow, self._bias_slow, self._bias_fast
        if _native.compare is not None:
            # the loop below in C (learners.native), the same float operations
            f, s, b, bf = _native.compare(ys, pfs, pss, g, f, s, b, bf, _ERR_CLIP)
            self._err_fast, self._err_slow, self._bias_slow, self._bias_fast = f, s, b, bf
            self._judge(len(ys), g)
            return
        if isinstance(pfs, np.ndarray):
            pfs = pfs.tolist()
        if isinstance(pss, np.ndarray):
            pss = pss.tolist()
        for y, pf, ps in zip(ys, pfs, pss, strict=True):
            ay = max(abs(y), 1e-12)
            a = min(max((y - pf) / ay, -_ERR_CLIP), _ERR_CLIP)
            r = min(max((y - ps) / ay, -_ERR_CLIP), _ERR_CLIP)
            f = abs(a) if f != f else f + g * (abs(a) - f)  # f != f: NaN, nothing seen yet
            s = abs(r) if s != s else s + g * (abs(r) - s)
            b += g * (r - b)
            bf += g * (a - bf)
        self._err_fast, self._err_slow, self._bias_slow, self._bias_fast = f, s, b, bf
        self._judge(len(ys), g)

    def _compare_one(self, y: float, pf: float, ps: float) -> None:
        """:meth:`_compare_rows` of one row (a finished request's α), the same arithmetic
        without the lists; the builtins min and max as the comparisons they make (a
        finished request compares ~3 times: the calls were most of it)."""
        m = self.memory
        g = 1.0 / (1 if m < 1 else m)  # max(m, 1): max keeps its first unless one is greater
        f, s = self._err_fast, self._err_slow
        ay = abs(y)
        if ay < 1e-12:
            ay = 1e-12
        clip = _ERR_CLIP
        a = (y - pf) / ay
        if a < -clip:
            a = -clip
        if a > clip:  # min keeps its first unless one is less
            a = clip
        r = (y - ps) / ay
        if r < -clip:
            r = -clip
        if r > clip:
            r = clip
        self._err_fast = abs(a) if f != f else f + g * (abs(a) - f)  # f != f: nothing yet
        self._err_slow = abs(r) if s != s else s + g * (abs(r) - s)
        self._bias_slow += g * (r - self._bias_slow)
        self._bias_fast += g * (a - self._bias_fast)
        self._judge(1, g)

    def _judge(self, rows: int, g: float) -> None:
        """After ``rows`` compared rows: switch modes when the comparison says so."""
        self._rows += rows
        # the detectors' counts (_fast_alarms, _slow_alarms) inline: a finished request
        # judges ~3 times, and the lag test below is only worked out where it is read
        drift = self.fast.drift
        alarms = 0 if drift is None else drift.detections
        drift = self.slow.drift
        slow_alarms = 0 if drift is None else drift.detections
        if slow_alarms > self._slow_seen:
            # its own detector saw its residuals shift (a lag in a gradual change); its
            # monitor has already applied the drift policy to it
            self._slow_seen = slow_alarms
            self._alarms = alarms
            self._track(inflate=False)
        elif alarms > self._alarms:
            self._alarms = alarms
            self._track()
        elif self.mode == STEADY:
            # not while both still converge from the prior (their errors differ by design)
            if self._rows >= self.memory and self.slow.n_learned >= 2 * self.memory:
                s, b = self._err_slow, self._bias_slow
                # Lag: the long-memory residuals are biased (an EW mean of residuals has
                # sd ≈ σ·√(g/2), σ ≈ 1.25·E|e|) while the fast ones are not (both are
                # while they converge from the prior).
                if s > self._err_fast * (1.0 + self.margin) or (
                    abs(b) > self.bias_z * (1.25 * s * math.sqrt(g / 2.0))
                    and abs(self._bias_fast) < abs(b) / 2
                ):
                    self._track()
        elif self._rows >= self.hold:
            s, b = self._err_slow, self._bias_slow
            if s <= self._err_fast and abs(b) <= 1.25 * s * math.sqrt(g / 2.0):
                self.mode = STEADY
                self._rows = 0

    def _track(self, inflate: bool = True) -> None:
        """The physics changed: publish the fast tracker; the long-memory learner forgets
        what it knew (estimate held, information scaled down, a fast spell)."""
        if inflate:
            self.slow.inflate(self.keep, self.fast_forgetting, self.fast_for)
        self.mode = TRACKING
        self.switches += 1
        self._rows = 0
        self._err_slow = self._err_fast  # restart the comparison from parity
        self._bias_slow = self._bias_fast = 0.0

    def state_dict(self) -> dict[str, Any]:
        """The mode and comparison state (the learners checkpoint themselves)."""
        return {
            "mode": self.mode,
            "switches": self.switches,
            "err_fast": None if math.isnan(self._err_fast) else self._err_fast,
            "err_slow": None if math.isnan(self._err_slow) else self._err_slow,
            "rows": self._rows,
            "bias_slow": self._bias_slow,
            "bias_fast": self._bias_fast,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume the mode and comparison from :meth:`state_dict` output (into an
        estimator built on the restored learners)."""
        self.mode = str(state.get("mode", STEADY))
        self.switches = int(state.get("switches", 0))
        ef, es = state.get("err_fast"), state.get("err_slow")
        self._err_fast = math.nan if ef is None else float(ef)
        self._err_slow = math.nan if es is None else float(es)
        self._rows = int(state.get("rows", 0))
        self._bias_slow = float(state.get("bias_slow", 0.0))
        self._bias_fast = float(state.get("bias_fast", 0.0))
        self._alarms = self._fast_alarms()
        self._slow_seen = self._slow_alarms()


def _identified_directions(
    m: RLSRegressor, max_rel_std: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(scale, identified eigenvectors, all eigenvalues) of the data information in
    relative coordinates ``u = (θ − θ₀) / scale`` (scale = |prior|, or the prior floor)."""
    a_data, _ = m.data_information()
    prior = np.asarray(m.prior_mean if m.prior_mean is not None else np.zeros(len(m.features)))
    # a term's scale: the larger of its prior and its estimate (a zero prior, as BLIS ships
    # for two terms, has no scale of its own), so "relative" means relative to its size
    tiny = 1e-9 * max(float(np.max(np.abs(prior))), 1.0)
    scale = np.maximum(np.maximum(np.abs(prior), np.abs(m.coef)), tiny)
    at = a_data * np.outer(scale, scale)
    w, v = np.linalg.eigh(0.5 * (at + at.T))
    sigma = m.residual_scale if m.residual_scale is not None else math.inf
    # relative standard deviation of the coefficient combination along each eigenvector
    with np.errstate(divide="ignore"):
        rel_std = sigma / np.sqrt(np.maximum(w, 0.0))
    keep = rel_std <= max_rel_std
    return scale, v[:, keep], w


def identified_fit(m: RLSRegressor, max_rel_std: float) -> tuple[FloatArray, FloatArray]:
    """Non-negative coefficients that follow the data only where it identifies them.

    Directions of coefficient space whose standard deviation (relative to the terms'
    size) exceeds ``max_rel_std`` stay at the prior mean (the pooled prior); along the
    others the learner's own fit is taken: ``θ = θ₀ + D V c`` with ``V`` the identified
    eigenvectors of the scaled data information, ``c`` the least-squares optimum, and
    terms that would go negative held at 0 (equality constraints, added one round at a
    time). Returns ``(coefficients, share)``: ``share[i]`` ∈ [0, 1] is how much of term
    ``i`` lies in the identified directions (1: its own data; 0: the prior; between:
    only a combination with other terms is identified).
    """
    a, b = m.information()
    prior = np.asarray(m.prior_mean if m.prior_mean is not None else np.zeros(len(m.features)))
    scale, v, _ = _identified_directions(m, max_rel_std)
    d = len(prior)
    if not v.size:
        return np.maximum(prior, 0.0), np.zeros(d)
    share = np.clip((v * v).sum(axis=1), 0.0, 1.0)
    basis = scale[:, None] * v  # θ = prior + basis @ c
    h = basis.T @ a @ basis
    g = basis.T @ (b - a @ prior)
    pinned: list[int] = []
    theta = prior.copy()
    for _ in range(d):
        k = len(pinned)
        if k:
            c_rows = basis[pinned]
            kkt = np.block([[h, c_rows.T], [c_rows, np.zeros((k, k))]])
            rhs = np.concatenate([g, -prior[pinned]])
            sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
            c = sol[: basis.shape[1]]
        else:
            c = np.linalg.lstsq(h, g, rcond=None)[0]
        theta = prior + basis @ c
        neg = [int(i) for i in np.flatnonzero(theta < -1e-12 * scale) if i not in pinned]
        if not neg:
            break
        pinned.extend(neg)
    return np.maximum(theta, 0.0), share


#: What would identify each BLIS term (spec §5.3), for the snapshot's identification.
TERM_HINTS: dict[str, str] = {
    "T_pf_compute": "prefill steps of varied prompt lengths (attention grows with the prompt)",
    "T_dc_compute": "decode steps mixed with prefill requests and varied contexts "
    "(decode compute moves with the request count and the context together)",
    "T_weight": "constant within a configuration: configurations of other models/GPUs "
    "(the pooled prior) separate it from L and the per-step constant",
    "T_tp_comm": "TP > 1 configurations (zero at TP 1)",
    "L": "constant within a configuration: other models (the pooled prior)",
    "B": "steps with the same tokens in different numbers of requests (prefill chunks "
    "next to decodes)",
    "one": "constant within a configuration: other configurations (the pooled prior)",
    "chi_L_moe": "interleaved MoE models (zero otherwise)",
    "T_pf_kv": "long and short prefills at equal token counts (it moves with prefill "
    "tokens like the token part of T_pf_compute)",
    "T_dc_kv": "decode steps of varied context lengths",
    "T_moe_dispatch": "MoE deployments with DP > 1 (zero otherwise)",
}


def term_sources(
    names: Sequence[str], share: FloatArray, excited: npt.NDArray[np.bool_]
) -> dict[str, str]:
    """``data`` (share ≥ 0.9), ``data+prior`` (a combination with other terms is
    identified, the split is the prior's), ``prior`` (nothing identified; never excited
    or lost in noise) for each term."""
    out = {}
    for i, n in enumerate(names):
        if not excited[i] or share[i] < 0.1:
            out[n] = "prior"
        elif share[i] >= 0.9:
            out[n] = "data"
        else:
            out[n] = "data+prior"
    return out
