"""Factor model of a fleet: one shared vector plus per-level offsets of a few factors.

Why. The fleet vector (:mod:`learners.fleet.model`) is one β for every configuration; the
similarity-weighted variants lean on the configurations most like a target. Neither can
say "A100s are x % slower on the compute terms, TP-4 rings cost y % more per all-reduce,
this model family has z % more per-layer overhead" *separately* and add the three up for
a combination nobody has deployed (Llama-70B on A100 at TP 4 when only Llama-70B on H100
at TP 4 and Mixtral on A100 at TP 4 are known). Real fleets are largely like that: one
vLLM build and one set of kernels everywhere, the hardware, the model's architecture and
the ring size each shifting some terms.

Model. Configuration ``c`` with levels ``g(c)``, ``f(c)``, ``t(c)`` of the factors
(:data:`FACTORS`: GPU, model family, TP degree) has

    θ_c = θ_shared + δ_gpu[g(c)] + δ_family[f(c)] + δ_tp[t(c)]

(additive offsets: linear, so the joint least-squares fit over every member's
information is one solve; the truth of ``simfleet``'s ``fleet-shared`` is a product of
factors, which additive offsets match to first order). Member ``c``'s information
``(A_c, b_c)`` constrains ``S_c φ`` where ``φ`` stacks the shared vector and every offset
and ``S_c`` adds the blocks of its levels, so the normal equations are

    (Σ_c S_cᵀ A_c S_c + P) φ = Σ_c S_cᵀ b_c + p

with ``P`` block-diagonal: the weak BLIS prior on the shared block (as the fleet fit) and
a **ridge on every offset** toward 0, ``strength · n_ref · prior_precision(θ₀, 1, floor)``
— :func:`learners.prior.prior_precision`'s relative units (an offset is measured against
the coefficient's scale ``max(|θ₀ᵢ|, floor)``, θ₀ BLIS's shipped vector and ``floor`` the
learners' ``prior_scale_floor``, as every prior of coeffd), times ``n_ref``, the effective sample
size of a typical member (the fleet's weights cap every member there). Why that scale:
one member's information about a relative offset ``u`` of a term carrying share ``c`` of
the step time is ≈ ``n_ref · c²``, so ``strength`` compares directly with ``c²`` — an
offset seen by ``m`` members keeps the share ``m c² / (m c² + strength)`` of what their
data say. Without the ridge a level seen once (the only DeepSeek in the fleet) would
absorb that configuration's whole idiosyncrasy into "the DeepSeek offset"; with it, terms
the level's few members barely excite stay at the shared value. ``strength`` is not
tuned on any outcome: :class:`FactorCandidate` scores a few values (:data:`STRENGTHS`, a
decade apart) by leave-one-configuration-out error and keeps the best (the fleet result's
``factor_strengths``). Picking the best of four makes its LOCO error slightly optimistic;
a decade apart, the four are not fine enough to fit noise.

A description's levels that the fit has not seen contribute 0 (the shared vector and the
known levels' offsets only): an H200 prediction is the fleet's H100/A100-average GPU
plus the family and TP offsets.

Leave one out without refitting: member ``k``'s contribution is ``S_kᵀ A_k S_k`` (rank ≤
d), so with ``H = G⁻¹`` of the full system, ``Q = S_k H S_kᵀ`` and ``v = S_k φ − Q b_k``
the push-through identity gives the left-out prediction
``θ₋ₖ = v + Q (I − A_k Q)⁻¹ A_k v`` — d×d algebra per member after one inverse.

The fleet's candidate (:class:`FactorCandidate`, ``fleet_factors`` of a
:class:`~learners.fleet.model.FleetModel`): :class:`FactorFit` on β and on each α target
over the fleet model's weighted statistics and priors, each at its own strength by LOCO;
an α target (an intercept per request, with no basis to carry the physics) comes from the
similarity-weighted joint fit instead where that has the lower LOCO error.

>>> import numpy as np
>>> rng = np.random.default_rng(1)
>>> true = {"H100": 1.0, "A100": 1.3}  # one coefficient, the GPU scales it
>>> descs = [{"model": "m", "gpu": g, "tp": 1} for g in ("H100", "A100", "H100", "A100")]
>>> a, b = [], []
>>> for d in descs:
...     x = rng.uniform(1.0, 2.0, size=(50, 1)); y = x[:, 0] * true[d["gpu"]]
...     a.append(x.T @ x); b.append(x.T @ y)
>>> fit = FactorFit(np.array(a), np.array(b), descs, prior_a=np.eye(1) * 1e-3,
...                 prior_b=np.array([1e-3]), scale=np.ones(1), n_ref=50.0)
>>> phi = fit.solve(0.001)
>>> [round(float(fit.predict(phi, {"gpu": g, "model": "m2", "tp": 1})[0]), 2) for g in true]
[1.0, 1.3]
>>> round(float(fit.loco(0.001)[1][0]), 2)  # A100 left out: the other A100 still says 1.3
1.3

References
----------
Hoerl, A. E. and Kennard, R. W. (1970). Ridge regression: biased estimation for
nonorthogonal problems. *Technometrics* 12(1), 55–67.

Henderson, H. V. and Searle, S. R. (1981). On deriving the inverse of a sum of matrices.
*SIAM Review* 23(1), 53–60 (the push-through and Woodbury identities).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from coeffd.learners.nnls import nnls_information
from coeffd.learners.prior import prior_precision
from coeffd.learners.targets import ALPHA_TARGETS

if TYPE_CHECKING:
    from coeffd.learners.fleet.model import FleetModel

__all__ = ["FACTORS", "STRENGTHS", "FactorCandidate", "FactorFit", "family_of", "levels_of"]

FloatArray = npt.NDArray[np.float64]

#: The factors whose levels get their own offsets, and how a description names its level.
#: MoE vs dense is not one: the basis already separates the MoE terms (zero for a dense
#: model), and model families do not mix architectures much (Qwen does: its offsets then
#: average the two).
FACTORS: tuple[str, ...] = ("gpu", "family", "tp")
#: Ridge strengths :class:`FactorCandidate` scores by leave-one-configuration-out error: from
#: "offsets nearly free" to "offsets only where several members agree strongly".
STRENGTHS: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0)

_ALPHA = re.compile(r"[a-z]+")


def family_of(model: str) -> str:
    """Model family: the alphabetic prefix of the model's name (after any ``org/``).

    Model names start with the family (``llama-3.1-8b``, ``qwen2.5-7b``, ``qwen3-30b-a3b``,
    ``mixtral-8x7b``, ``deepseek-v2-lite``); Hugging Face ids carry an organisation first.

    >>> family_of("qwen2.5-7b-instruct"), family_of("meta-llama/Llama-3.1-70B-Instruct")
    ('qwen', 'llama')
    >>> family_of("3b-model")
    ''
    """
    m = _ALPHA.match(model.rsplit("/", 1)[-1].lower())
    return m.group(0) if m else ""


def levels_of(description: Mapping[str, Any]) -> tuple[str, ...]:
    """The factor levels a configuration description names (``factor=level``).

    >>> levels_of({"model": "mixtral-8x7b-v0.1", "gpu": "A100-80", "tp": 4})
    ('gpu=A100-80', 'family=mixtral', 'tp=4')
    >>> levels_of({"gpu": "H100"})  # no model: no family offset; TP 1 by default
    ('gpu=H100', 'tp=1')
    """
    out = []
    gpu = description.get("gpu")
    if gpu:
        out.append(f"gpu={gpu}")
    fam = family_of(str(description.get("model") or ""))
    if fam:
        out.append(f"family={fam}")
    out.append(f"tp={description.get('tp') or 1}")
    return tuple(out)


class FactorFit:
    """Shared vector + ridge-shrunk per-level offsets over weighted member statistics.

    Parameters
    ----------
    a, b
        Per-member information ``(K, d, d)`` and ``(K, d)``, already weighted.
    descriptions
        Per-member configuration descriptions (their levels: :func:`levels_of`).
    prior_a, prior_b
        Prior information of the shared block (``d×d``, ``d``).
    scale
        Offset precision per unit strength and per ``n_ref`` (``prior_precision(θ₀, 1,
        floor)``).
    n_ref
        Effective sample size of a typical member.
    """

    def __init__(
        self,
        a: FloatArray,
        b: FloatArray,
        descriptions: Sequence[Mapping[str, Any]],
        *,
        prior_a: FloatArray,
        prior_b: FloatArray,
        scale: FloatArray,
        n_ref: float,
    ) -> None:
        self.d = int(prior_b.shape[0])
        self._a, self._b = a, b
        self._member_levels = [levels_of(x) for x in descriptions]
        names = sorted({lv for lvs in self._member_levels for lv in lvs})
        #: block index of each level seen (block 0 is the shared vector)
        self.levels = {lv: i + 1 for i, lv in enumerate(names)}
        self._blocks = [[0, *(self.levels[lv] for lv in lvs)] for lvs in self._member_levels]
        self._prior_a, self._prior_b = prior_a, prior_b
        self._scale = scale
        self.n_ref = n_ref
        n = self.d * (1 + len(self.levels))
        data = np.zeros((n, n))
        rhs = np.zeros(n)
        d = self.d
        for k, blocks in enumerate(self._blocks):
            for i in blocks:
                rhs[i * d : (i + 1) * d] += b[k]
                for j in blocks:
                    data[i * d : (i + 1) * d, j * d : (j + 1) * d] += a[k]
        rhs[:d] += prior_b
        data[:d, :d] += prior_a
        self._data, self._rhs = data, rhs
        self._cache: dict[float, tuple[FloatArray, FloatArray, FloatArray]] = {}

    def _system(self, strength: float) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``G``, ``H = G⁻¹`` and ``φ = H h`` at one ridge strength (cached)."""
        if strength not in self._cache:
            g = self._data.copy()
            ridge = np.tile(strength * self.n_ref * self._scale, len(self.levels))
            idx = np.arange(self.d, g.shape[0])
            g[idx, idx] += ridge
            h = np.linalg.inv(g).astype(np.float64, copy=False)
            self._cache[strength] = (g, h, h @ self._rhs)
        return self._cache[strength]

    def solve(self, strength: float) -> FloatArray:
        """The stacked solution ``φ`` (shared, then each level's offset)."""
        return self._system(strength)[2]

    def predict(self, phi: FloatArray, description: Mapping[str, Any]) -> FloatArray:
        """Shared vector + the offsets of the description's known levels."""
        d = self.d
        out = phi[:d].copy()
        for lv in levels_of(description):
            i = self.levels.get(lv)
            if i is not None:
                out += phi[i * d : (i + 1) * d]
        return out

    def loco(self, strength: float) -> FloatArray:
        """``(K, d)``: each member's vector predicted with that member left out."""
        _, h, phi = self._system(strength)
        d = self.d
        out = np.empty((len(self._blocks), d))
        eye = np.eye(d)
        for k, blocks in enumerate(self._blocks):
            q = np.zeros((d, d))
            s_phi = np.zeros(d)
            for i in blocks:
                s_phi += phi[i * d : (i + 1) * d]
                for j in blocks:
                    q += h[i * d : (i + 1) * d, j * d : (j + 1) * d]
            v = s_phi - q @ self._b[k]
            ak = self._a[k]
            out[k] = v + q @ np.linalg.solve(eye - ak @ q, ak @ v)
        return out

    def _system_without(self, k: int, strength: float) -> tuple[FloatArray, FloatArray]:
        """``G`` and ``h`` with member ``k``'s statistics taken out."""
        g = self._system(strength)[0].copy()
        rhs = self._rhs.copy()
        d = self.d
        for i in self._blocks[k]:
            rhs[i * d : (i + 1) * d] -= self._b[k]
            for j in self._blocks[k]:
                g[i * d : (i + 1) * d, j * d : (j + 1) * d] -= self._a[k]
        return g, rhs

    def without(self, k: int, strength: float) -> FloatArray:
        """``φ`` refitted without member ``k`` (a direct solve; for other targets)."""
        g, rhs = self._system_without(k, strength)
        phi = np.linalg.solve(g, rhs).astype(np.float64, copy=False)
        return phi

    def unseen_variance(
        self, description: Mapping[str, Any], strength: float, without: int | None = None
    ) -> FloatArray:
        """Per term, the variance of the offsets the description's *unseen* levels may
        have: for each kind (``gpu``, ``family``, ``tp``) whose level no member ran, the
        spread of the fitted offsets of that kind's known levels (sample variance, × (1 +
        1/L) for a new draw beside L known; 0 with fewer than two). A GPU or a model
        family nobody has deployed is as far from the fleet as the known ones are from
        each other — which no fit of the fleet can narrow.

        >>> fit = FactorFit(np.eye(1)[None].repeat(2, 0), np.array([[1.0], [3.0]]),
        ...                 [{"gpu": "H100"}, {"gpu": "A100"}], prior_a=np.eye(1),
        ...                 prior_b=np.ones(1), scale=np.ones(1), n_ref=1.0)
        >>> float(fit.unseen_variance({"gpu": "H100"}, 0.01)[0])  # every level known
        0.0
        >>> round(float(fit.unseen_variance({"gpu": "B200"}, 0.01)[0]), 2)  # offsets ≈ ∓1: 2 × 1.5
        2.94
        """
        phi = self.solve(strength) if without is None else self.without(without, strength)
        d = self.d
        out = np.zeros(d)
        for lv in levels_of(description):
            if lv in self.levels:
                continue
            kind = lv.split("=", 1)[0] + "="
            known = [phi[i * d : (i + 1) * d] for n, i in self.levels.items() if n.startswith(kind)]
            if len(known) >= 2:
                out += np.var(np.array(known), axis=0, ddof=1) * (1.0 + 1.0 / len(known))
        return out

    def covariance(
        self, description: Mapping[str, Any], strength: float, without: int | None = None
    ) -> FloatArray:
        """``d×d`` covariance, per unit of noise variance, of :meth:`predict`'s vector for
        ``description``: the blocks of ``H = G⁻¹`` of the shared vector and of the
        description's known levels, summed (``without``: member ``k`` left out). A level
        seen in one member only is as uncertain as the ridge lets it be; one nobody has
        seen adds nothing here (its offset is 0 by construction; its doubt:
        :meth:`unseen_variance`).

        >>> fit = FactorFit(np.eye(1)[None].repeat(2, 0), np.ones((2, 1)),
        ...                 [{"gpu": "H100"}, {"gpu": "A100"}], prior_a=np.eye(1),
        ...                 prior_b=np.ones(1), scale=np.ones(1), n_ref=1.0)
        >>> seen = float(fit.covariance({"gpu": "H100"}, 1.0)[0, 0])
        >>> shared = float(fit.covariance({"gpu": "B200"}, 1.0)[0, 0])
        >>> 0 < shared < seen, float(fit.covariance({"gpu": "H100"}, 1.0, without=0)[0, 0]) > seen
        (True, True)
        """
        if without is None:
            h = self._system(strength)[1]
        else:
            h = np.linalg.inv(self._system_without(without, strength)[0]).astype(np.float64)
        d = self.d
        blocks = [0, *(self.levels[lv] for lv in levels_of(description) if lv in self.levels)]
        out = np.zeros((d, d))
        for i in blocks:
            for j in blocks:
                out += h[i * d : (i + 1) * d, j * d : (j + 1) * d]
        return out


class FactorCandidate:
    """The ``fleet_factors`` candidate of a :class:`~learners.fleet.model.FleetModel`:
    :class:`FactorFit` on β and on each α target over the model's weighted statistics and
    priors, each ridge strength the one of :data:`STRENGTHS` with the lowest
    leave-one-configuration-out error (β: step-time MAPE on the members' rows, as the other
    candidates are scored; α: relative error against each member's own estimate)."""

    def __init__(self, fm: FleetModel) -> None:
        self._fm = fm
        self._row = {k: i for i, k in enumerate(fm.members)}
        members = list(fm.members.values())
        # the metric of the non-negative projection
        self._info = fm.prior_a + fm.weighted_a.sum(axis=0)
        self.beta_fit = FactorFit(
            fm.weighted_a,
            fm.weighted_b,
            fm.descriptions,
            prior_a=fm.prior_a,
            prior_b=fm.prior_b,
            scale=prior_precision(fm.default_beta, 1.0, fm.floor),
            n_ref=_median_positive([m.beta_n for m in members]),
        )
        self.strengths: dict[str, float] = {}
        self._loco: dict[str, FloatArray] = {}
        best = math.inf
        for lam in STRENGTHS:
            loco = self.beta_fit.loco(lam)
            preds, errs = {}, []
            for k, m in fm.members.items():
                preds[k] = self._project(loco[self._row[k]], k)
                if m.rows_x is not None and m.rows_y is not None and len(m.rows_y) >= fm.min_rows:
                    errs.append(float(np.mean(np.abs(m.rows_x @ preds[k] - m.rows_y) / m.rows_y)))
            err = float(np.mean(errs)) if errs else math.inf
            if err < best or "beta" not in self.strengths:
                best, self.strengths["beta"], self._loco = err, lam, preds
        self.alpha_fits = []
        # Each α target comes from the factors or, where its LOCO error is lower, from the
        # similarity-weighted joint fit (``fleet_local``'s α): an intercept per request has
        # no basis to carry the physics, and the relatives may know it better than the
        # additive levels.
        kernel_alpha = {
            k: fm.fit_alpha(fm.kernel(m.description, exclude=k)) for k, m in fm.members.items()
        }
        #: per α target: ``factors`` or ``kernel``
        self.alpha_from: dict[str, str] = {}
        for j, target in enumerate(ALPHA_TARGETS):
            w = fm.alpha_weights[j]
            a = np.array([[[w[m.key] * m.alpha_a[j]]] for m in members]).reshape(-1, 1, 1)
            b = np.array([[w[m.key] * m.alpha_b[j]] for m in members]).reshape(-1, 1)
            p = fm.alpha_prior[j : j + 1]
            fit = FactorFit(
                a,
                b,
                fm.descriptions,
                prior_a=np.diag(p),
                prior_b=p * fm.default_alpha[j : j + 1],
                scale=prior_precision(fm.default_alpha[j : j + 1], 1.0, fm.floor),
                n_ref=_median_positive([m.alpha_n[j] for m in members]),
            )
            own = [
                (i, m.alpha_b[j] / m.alpha_a[j])
                for i, m in enumerate(members)
                if m.alpha_n[j] >= fm.min_rows and m.alpha_a[j] > 0 and m.alpha_b[j] > 0
            ]
            errs_by = {}
            for lam in STRENGTHS if own else ():
                loco = fit.loco(lam)[:, 0]
                errs_by[lam] = float(np.mean([abs(loco[i] / v - 1.0) for i, v in own]))
            self.strengths[target] = min(errs_by, key=lambda v: errs_by[v]) if errs_by else 0.1
            self.alpha_fits.append(fit)
            kernel_err = (
                float(np.mean([abs(kernel_alpha[members[i].key][j] / v - 1.0) for i, v in own]))
                if own
                else math.inf
            )
            best = errs_by.get(self.strengths[target], math.inf)
            self.alpha_from[target] = "kernel" if kernel_err < best else "factors"

    def left_out(self, exclude: str | None) -> int | None:
        """The fit's row of the member ``exclude`` names (None: none left out)."""
        return self._row.get(exclude) if exclude is not None else None

    def _project(self, theta: FloatArray, exclude: str | None) -> FloatArray:
        """``theta`` if non-negative, else the nearest non-negative vector in the fleet's
        information metric (the step times of the fleet's batches change least)."""
        if not np.all(np.isfinite(theta)):
            return self._fm.default_beta.copy()
        if np.all(theta >= 0):
            return theta
        info = self._info
        i = self.left_out(exclude)
        if i is not None:
            info = info - self._fm.weighted_a[i]
        try:
            out = nnls_information(info, info @ theta)
        except (ValueError, np.linalg.LinAlgError):
            return self._fm.default_beta.copy()
        return self._fm.or_default(out)

    def _phi(self, fit: FactorFit, strength: float, exclude: str | None) -> FloatArray:
        i = self.left_out(exclude)
        return fit.solve(strength) if i is None else fit.without(i, strength)

    def beta(self, description: Mapping[str, Any], exclude: str | None = None) -> FloatArray:
        """β for ``description`` (``exclude``: a member left out of the fit)."""
        if exclude in self._loco and self._fm.member_row(description) == self._row[exclude]:
            return self._loco[exclude].copy()  # a member left out and scored: precomputed
        lam = self.strengths["beta"]
        theta = self.beta_fit.predict(self._phi(self.beta_fit, lam, exclude), description)
        return self._project(theta, exclude)

    def alpha(self, description: Mapping[str, Any], exclude: str | None = None) -> FloatArray:
        """α for ``description``: each target from its factors at their own strength, or
        from the similarity-weighted joint fit where that has the lower LOCO error."""
        out = np.empty(len(ALPHA_TARGETS))
        kernel: FloatArray | None = None
        for j, (fit, target) in enumerate(zip(self.alpha_fits, ALPHA_TARGETS, strict=True)):
            if self.alpha_from.get(target) == "kernel":
                if kernel is None:
                    kernel = self._fm.fit_alpha(self._fm.kernel(description, exclude=exclude))
                out[j] = kernel[j]
                continue
            v = float(fit.predict(self._phi(fit, self.strengths[target], exclude), description)[0])
            out[j] = max(v, 0.0) if math.isfinite(v) else self._fm.default_alpha[j]
        return out


def _median_positive(values: Sequence[float]) -> float:
    pos = [v for v in values if v > 0]
    return statistics.median(pos) if pos else 1.0
