"""Synthetic step observations with known true coefficients (tests and ``bench/learning.py``).

Why here and not in ``simfleet``: the learners need a stream whose *only* unknowns are
the coefficients and the noise, generated fast enough for 10⁵-row benchmarks. Batches are
drawn as BLIS batch statistics ``(T_pf, A_pf, T_dc, C, B, 1)`` in three regimes (decode,
mixed chunked-prefill + decode, prefill), mapped through the real
:meth:`learners.features.BlisBasis.terms_many`, and the step time is
``βᵀx · ε`` with log-normal ε of mean 1 plus rare stalls (×2–6), optionally with the true
β changing mid-stream.

>>> from coeffd.learners.features import BlisBasis, load_hardware, load_model
>>> basis = BlisBasis(load_model("llama-3.1-8b-instruct"), load_hardware("H100"), tp=1)
>>> s = synth_steps(basis, TRUE_BETA, 1000, seed=1)
>>> s.x.shape, bool((s.y > 0).all()), sorted(set(s.regime.tolist()))
((1000, 11), True, ['decode', 'kv', 'mixed', 'prefill'])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from coeffd.learners.features import BlisBasis

__all__ = ["TRUE_BETA", "SyntheticSteps", "random_stats", "synth_steps"]

FloatArray = npt.NDArray[np.float64]

#: A plausible "true" β for the synthetic world: every physically meaningful term non-zero
#: (unlike BLIS's defaults, which are themselves a fit and zero two terms).
TRUE_BETA: tuple[float, ...] = (0.45, 0.7, 1.15, 0.8, 28.0, 6.0, 150.0, 420.0, 0.9, 1.6, 0.9)


@dataclass(frozen=True)
class SyntheticSteps:
    """A synthetic stream: terms ``x`` (n×11), periods ``y`` (µs), the noiseless mean
    ``mean`` (what the true coefficients predict), regime labels, KV usage, and the true
    β of every row (n×11)."""

    x: FloatArray
    y: FloatArray
    mean: FloatArray
    regime: npt.NDArray[np.str_]
    kv_usage: FloatArray
    beta: FloatArray
    stats: FloatArray


def random_stats(
    rng: np.random.Generator, n: int, max_tokens: int = 8192, max_seqs: int = 256
) -> tuple[FloatArray, npt.NDArray[np.str_], FloatArray]:
    """``n`` random batches as statistics, with their regime and a KV usage ratio."""
    kind = rng.choice(np.array(["decode", "mixed", "prefill"]), size=n, p=[0.55, 0.3, 0.15])
    stats = np.zeros((n, 6))
    stats[:, 5] = 1.0
    # Decode part (decode and mixed): requests, each with its own context length.
    has_dc = kind != "prefill"
    n_dc = np.where(has_dc, rng.integers(1, max_seqs + 1, size=n), 0).astype(float)
    n_dc = np.where(kind == "mixed", np.ceil(n_dc / 2), n_dc)
    mean_ctx = rng.uniform(150, 4000, size=n)
    stats[:, 2] = n_dc
    stats[:, 3] = n_dc * mean_ctx
    # Prefill part: 1–4 whole prompts (prefill) or one chunk of a longer prompt (mixed).
    n_pf = np.where(kind == "prefill", rng.integers(1, 5, size=n), np.where(kind == "mixed", 1, 0))
    t_pf = np.zeros(n)
    a_pf = np.zeros(n)
    for j in range(4):
        active = n_pf > j
        t = rng.uniform(32, max_tokens / 4, size=n)
        prompt = np.where(kind == "mixed", t + rng.uniform(0, max_tokens, size=n), t)
        t_pf += np.where(active, t, 0.0)
        a_pf += np.where(active, t * (prompt + t / 2), 0.0)
    stats[:, 0] = np.round(t_pf)
    stats[:, 1] = a_pf
    stats[:, 4] = n_dc + n_pf
    kv = np.clip(rng.beta(2, 3, size=n) + 0.15 * (stats[:, 3] / (max_seqs * 4000)), 0, 1)
    saturated = rng.random(n) < 0.08
    kv = np.where(saturated, rng.uniform(0.92, 1.0, size=n), kv)
    regime = np.where(saturated, "kv", kind)
    return stats, regime, kv


def synth_steps(
    basis: BlisBasis,
    beta: npt.ArrayLike,
    n: int,
    *,
    seed: int = 0,
    sigma: float = 0.05,
    stall_rate: float = 0.003,
    change_at: int | None = None,
    beta_after: npt.ArrayLike | None = None,
) -> SyntheticSteps:
    """``n`` steps of one configuration; the true β switches to ``beta_after`` at ``change_at``."""
    rng = np.random.default_rng(seed)
    stats, regime, kv = random_stats(rng, n)
    x = basis.terms_many(stats)
    b = np.tile(np.asarray(beta, dtype=float), (n, 1))
    if change_at is not None and beta_after is not None:
        b[change_at:] = np.asarray(beta_after, dtype=float)
    mean = np.einsum("ij,ij->i", x, b)
    noise = np.exp(rng.normal(-0.5 * sigma * sigma, sigma, size=n))  # E[noise] = 1
    stall = np.where(rng.random(n) < stall_rate, rng.uniform(2, 6, size=n), 1.0)
    y = mean * noise * stall
    return SyntheticSteps(x=x, y=y, mean=mean, regime=regime, kv_usage=kv, beta=b, stats=stats)
