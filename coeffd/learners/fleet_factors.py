"""Factor model of a fleet: one shared vector plus per-level offsets of a few factors.

Why. The fleet vector (:mod:`learners.fleet`) is one β for every configuration; the
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
tuned on any outcome: :class:`FactorFit` scores a few values (:data:`STRENGTHS`, a decade
apart) by leave-one-configuration-out error and keeps the best (``bench fleet``: 0.1 for
β; LOCO step-time MAPE 2.36 % there against 2.47 % at 0.01 and 2.44 % at 1). Picking the
best of four makes its LOCO error slightly optimistic; a decade apart, the four are not
fine enough to fit noise.

A description's levels that the fit has not seen contribute 0 (the shared vector and the
known levels' offsets only): an H200 prediction is the fleet's H100/A100-average GPU
plus the family and TP offsets.

Leave one out without refitting: member ``k``'s contribution is ``S_kᵀ A_k S_k`` (rank ≤
d), so with ``H = G⁻¹`` of the full system, ``Q = S_k H S_kᵀ`` and ``v = S_k φ − Q b_k``
the push-through identity gives the left-out prediction
``θ₋ₖ = v + Q (I − A_k Q)⁻¹ A_k v`` — d×d algebra per member after one inverse.

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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FACTORS", "STRENGTHS", "FactorFit", "family_of", "levels_of"]

FloatArray = npt.NDArray[np.float64]

#: The factors whose levels get their own offsets, and how a description names its level.
#: MoE vs dense is not one: the basis already separates the MoE terms (zero for a dense
#: model), and model families do not mix architectures much (Qwen does: its offsets then
#: average the two).
FACTORS: tuple[str, ...] = ("gpu", "family", "tp")
#: Ridge strengths scored by leave-one-configuration-out error (module docs): from
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
