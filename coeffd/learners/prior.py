"""Pooled priors: a new configuration starts from what similar configurations learned.

Why. A fresh configuration has no data, and several of its β terms are not identifiable
from its own data at all (``T_weight``, ``L`` and the per-step constant are all constant
within one configuration, so only their sum is learned; TP/MoE terms are zero at TP 1 /
for dense models). Configurations that share the model, GPU or TP *do* separate them.
So the prior mean of a new configuration is a similarity-weighted average of the
(non-negative, published) coefficients of known configurations, each coefficient
averaged only over the configurations that identified it, shrunk toward BLIS's shipped
defaults when nothing similar is known.

Prior strength is an information matrix ``diag(s / max(|θ₀ᵢ|, floor)²)`` in the learners'
relative-error units: a coefficient carrying share ``c`` of the step time gets a prior
worth ≈ ``s/c²`` observations. A pooled prior is trusted more than the bare defaults:
``s = strength · (1 + pooled_boost · best similarity²)``; the default boost is 0 because
``bench/learning.py`` showed that a tighter pooled prior slows the learner down on the
held-out configuration's own deviations (boost 10: 1.08× floor after 50 observations vs
1.03× at boost 0), while the pooled *mean* alone already halves the error of the first
50 observations.

>>> from coeffd.learners.features import BLIS_DEFAULT_BETA
>>> pool = PooledPrior(BLIS_DEFAULT_BETA)
>>> pool.prior_for({"model": "m", "gpu": "H100", "tp": 1}).sources
()
>>> pool.add({"model": "m", "gpu": "H100", "tp": 2}, [1.0] * 11, n_effective=500)
>>> est = pool.prior_for({"model": "m", "gpu": "H100", "tp": 1})
>>> est.sources, round(float(est.mean[0]), 3) > 0.152128
(('tp=2',), True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_SIMILARITY_WEIGHTS", "PooledPrior", "PriorEstimate", "prior_precision"]

FloatArray = npt.NDArray[np.float64]

#: How much each description field matters for "is this configuration's physics alike".
DEFAULT_SIMILARITY_WEIGHTS: dict[str, float] = {
    "model": 3.0,
    "gpu": 2.0,
    "tp": 1.0,
    "dp": 0.5,
    "ep": 0.25,
    "moe_comm_backend": 0.25,
    "vllm_version": 0.5,
    "max_num_batched_tokens": 0.25,
    "chunked_prefill": 0.25,
    "prefix_caching": 0.25,
    "cpu_offload_gib": 0.25,
    "kv_cache_dtype": 0.25,
    "async_scheduling": 0.25,
}


def prior_precision(
    mean: Sequence[float] | FloatArray, strength: float, floor: float = 1.0
) -> FloatArray:
    """Diagonal prior information ``s / max(|θ₀|, floor)²`` (relative-error units).

    >>> prior_precision([0.5, 200.0], 1.0).tolist()
    [1.0, 2.5e-05]
    """
    m = np.abs(np.asarray(mean, dtype=float))
    return strength / np.maximum(m, floor) ** 2  # type: ignore[no-any-return]


@dataclass(frozen=True)
class PriorEstimate:
    """A prior for one configuration: mean, diagonal precision, and where it came from."""

    mean: FloatArray
    precision: FloatArray
    sources: tuple[str, ...] = ()
    similarity: float = 0.0


@dataclass
class _Known:
    description: dict[str, Any]
    coef: FloatArray
    identified: npt.NDArray[np.bool_]
    n_effective: float
    label: str = field(default="")


def _describe(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise TypeError(f"cannot describe configuration {config!r}")


class PooledPrior:
    """Similarity-weighted pool of learned coefficient vectors (one vector kind, e.g. β).

    Parameters
    ----------
    default
        Fallback mean (BLIS's shipped coefficients).
    strength, floor
        Base prior strength and scale floor (see module docs).
    pooled_boost
        How much more a pooled prior is trusted than the defaults, at similarity 1.
    sharpness
        Kernel exponent: weight = similarity^sharpness × confidence.
    weights
        Per-field similarity weights (default :data:`DEFAULT_SIMILARITY_WEIGHTS`).
    default_weight
        Pseudo-weight of the defaults in the average (shrinkage when little is known).
    """

    def __init__(
        self,
        default: Sequence[float],
        strength: float = 0.01,
        floor: float = 1.0,
        pooled_boost: float = 0.0,
        sharpness: float = 4.0,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 0.02,
    ) -> None:
        self.default = np.asarray(default, dtype=float)
        self.strength = strength
        self.floor = floor
        self.pooled_boost = pooled_boost
        self.sharpness = sharpness
        self.weights = dict(weights or DEFAULT_SIMILARITY_WEIGHTS)
        self.default_weight = default_weight
        self._known: dict[str, _Known] = {}

    def __len__(self) -> int:
        return len(self._known)

    def similarity(self, a: Any, b: Any) -> float:
        """Weighted fraction of matching description fields, in [0, 1]."""
        da, db = _describe(a), _describe(b)
        total = hit = 0.0
        for key, w in self.weights.items():
            if key not in da and key not in db:
                continue
            total += w
            if da.get(key) == db.get(key):
                hit += w
        return hit / total if total > 0 else 0.0

    def add(
        self,
        config: Any,
        coef: npt.ArrayLike,
        identified: npt.ArrayLike | None = None,
        n_effective: float = 1.0,
        key: str | None = None,
    ) -> None:
        """Add or replace a configuration's learned (valid) vector."""
        c = np.asarray(coef, dtype=float)
        if c.shape != self.default.shape or not np.all(np.isfinite(c)) or np.any(c < 0):
            return  # never pool a vector we would not publish
        desc = _describe(config)
        ident = (
            np.ones(c.shape, dtype=bool)
            if identified is None
            else np.asarray(identified, dtype=bool)
        )
        k = key or _key(desc)
        self._known[k] = _Known(desc, c, ident, float(n_effective))

    def remove(self, key: str) -> None:
        self._known.pop(key, None)

    def prior_for(self, config: Any, exclude: str | None = None) -> PriorEstimate:
        """The pooled prior for ``config`` (itself excluded when already known)."""
        desc = _describe(config)
        own = exclude or _key(desc)
        num = self.default * self.default_weight
        den = np.full(self.default.shape, self.default_weight)
        sources: list[str] = []
        best = 0.0
        for k, known in self._known.items():
            if k == own:
                continue
            sim = self.similarity(desc, known.description)
            if sim <= 0:
                continue
            # Confidence saturates: a vector fitted on 50 rows is not 10× worse than on 500.
            conf = 1.0 - math.exp(-known.n_effective / 100.0)
            w = sim**self.sharpness * conf
            if w <= 1e-6:
                continue
            wi = np.where(known.identified, w, 0.05 * w)
            num = num + wi * known.coef
            den = den + wi
            best = max(best, sim)
            sources.append(_diff_label(desc, known.description))
        mean = num / den if sources else self.default.copy()  # exact defaults when alone
        strength = (
            self.strength * (1.0 + self.pooled_boost * best * best) if sources else self.strength
        )
        return PriorEstimate(
            mean=mean,
            precision=prior_precision(mean, strength, self.floor),
            sources=tuple(sources),
            similarity=best,
        )

    def state_dict(self) -> dict[str, Any]:
        """The known configurations' vectors (and the defaults), as plain JSON-able values."""
        return {
            "default": self.default.tolist(),
            "known": {
                k: {
                    "description": v.description,
                    "coef": v.coef.tolist(),
                    "identified": v.identified.tolist(),
                    "n_effective": v.n_effective,
                }
                for k, v in self._known.items()
            },
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Add the known configurations of :meth:`state_dict` output (replacing entries of
        the same key). The pool's parameters, its defaults included, are the
        constructor's; a vector it would not pool (another length) is left out.

        >>> from coeffd.learners.features import BLIS_DEFAULT_BETA
        >>> pool = PooledPrior(BLIS_DEFAULT_BETA)
        >>> pool.add({"model": "m", "gpu": "H100"}, [1.0] * 11, n_effective=500)
        >>> back = PooledPrior(BLIS_DEFAULT_BETA)
        >>> back.load_state(pool.state_dict())
        >>> len(back), back.state_dict() == pool.state_dict()
        (1, True)
        """
        for k, v in state.get("known", {}).items():
            self.add(v["description"], v["coef"], v["identified"], v["n_effective"], key=k)


def _key(desc: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={desc[k]}" for k in sorted(desc) if desc[k] not in (None, ""))


def _diff_label(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """How a source differs from the target (``same`` when only ignored fields differ)."""
    diffs = [f"{k}={b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ",".join(diffs) or "same"
