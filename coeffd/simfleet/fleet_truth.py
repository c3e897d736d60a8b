"""A fleet whose true coefficients generalise: shared structure + a small idiosyncrasy.

In the ``fleet`` scenario each configuration's true β is an independent random
perturbation of BLIS's, so nothing carries over from one configuration to another by
construction and a model of the fleet cannot be judged there. Real fleets are not like
that: one vLLM build and one set of kernels run everywhere, so what differs between
configurations is mostly *structured*. Here the true vector of configuration ``c`` is

    β_c[i] = base[i] · gpu[g(c)][i] · family[f(c)][i] · tp[tp(c)][i] · exp(ε_c,i)
    α_c[j] = alpha_base[j] · gpu_alpha[g(c)][j] · exp(ε'_c,j)

* ``base``: this fleet's software relative to BLIS's shipped (iteration-29) vector
  (:data:`BASE_SCALE`): a newer build with faster weight streaming, slower prefill
  kernels, costlier TP all-reduce and scheduling, and non-zero decode-compute and
  prefill-KV terms where BLIS ships 0 (so both have something to learn; inside one
  configuration decode compute is collinear with the per-request and decode-KV terms, so
  only contrasts between configurations pin it, and weakly: ``bench fleet``, table 4).
  BLIS's defaults are therefore off by a similar amount on every configuration — what a
  fleet model learns once for all of them.
* ``gpu``: per-GPU efficiency (:data:`GPU_SCALE`): A100s reach a different share of their
  peak FLOPs and bandwidth than H100s, and their hosts add per-step time.
* ``family``: per-model-family overheads (:data:`FAMILY_SCALE`) on the per-layer,
  per-request and per-step terms (kernel launch counts differ by architecture).
* ``tp``: TP communication efficiency (:data:`TP_SCALE`): the all-reduce (β₄) and MoE
  dispatch (β_EP) coefficients grow with the ring size.
* ``ε``: the idiosyncrasy, uniform in ±:data:`IDIOSYNCRASY` (log scale), deterministic
  per configuration key — what no fleet model can know about a configuration it has not
  seen.

Every factor is written into the truth file (``structure`` of each configuration), so a
benchmark can say how much of a held-out configuration's deviation was predictable.
"""

from __future__ import annotations

import math
import random
from typing import Any

from coeffd.simfleet.config import BLIS_ALPHA, BLIS_BETA, Coefficients

__all__ = [
    "BASE_SCALE",
    "FAMILY_SCALE",
    "GPU_SCALE",
    "IDIOSYNCRASY",
    "TP_SCALE",
    "family_of",
    "structured_truth",
]

#: Multipliers of BLIS's β (index → factor) for this fleet's software; β₂ and β₉, which
#: BLIS ships as 0, are set absolutely (:data:`BASE_SET`).
BASE_SCALE: dict[int, float] = {
    0: 1.30,  # prefill compute
    2: 0.80,  # weight streaming
    3: 1.40,  # TP all-reduce
    4: 0.60,  # per layer
    5: 1.80,  # per request
    6: 1.50,  # per step
    7: 0.60,  # per interleaved-MoE layer
    9: 0.85,  # decode KV
    10: 1.20,  # MoE dispatch
}
BASE_SET: dict[int, float] = {1: 0.35, 8: 0.6}
ALPHA_BASE_SCALE: tuple[float, float, float] = (0.80, 1.20, 1.30)

#: Per-GPU efficiency (β index → factor); H100 is the reference.
GPU_SCALE: dict[str, dict[int, float]] = {
    "H100": {},
    "A100-80": {0: 1.06, 1: 1.06, 2: 0.96, 8: 0.96, 9: 0.96, 6: 1.10, 4: 1.05},
}
GPU_ALPHA_SCALE: dict[str, tuple[float, float, float]] = {
    "H100": (1.0, 1.0, 1.0),
    "A100-80": (1.05, 1.05, 1.05),
}
#: Per-model-family overheads (per layer, per request, per step).
FAMILY_SCALE: dict[str, dict[int, float]] = {
    "llama": {},
    "qwen": {4: 1.08, 5: 1.10, 6: 1.05},
    "mixtral": {4: 1.10, 6: 1.08},
    "deepseek": {4: 1.12, 5: 1.05},
}
#: TP communication efficiency: all-reduce and dispatch per byte grow with the ring.
TP_SCALE: dict[int, dict[int, float]] = {
    1: {},
    2: {},
    4: {3: 1.12, 10: 1.12},
}
IDIOSYNCRASY = 0.03


def family_of(model: str) -> str:
    """Model family by name prefix (``llama``, ``qwen``, ``mixtral``, ``deepseek``).

    >>> family_of("qwen3-30b-a3b"), family_of("llama-3.1-70b-instruct")
    ('qwen', 'llama')
    """
    low = model.lower()
    for fam in FAMILY_SCALE:
        if low.startswith(fam):
            return fam
    return low.split("-", 1)[0]


def _factor(table: dict[Any, dict[int, float]], key: Any, i: int) -> float:
    return table.get(key, {}).get(i, 1.0)


def structured_truth(
    key: str, model: str, gpu: str, tp: int, t_s: float = 0.0
) -> tuple[Coefficients, dict[str, Any]]:
    """True coefficients of one configuration and the factors they were built from.

    >>> c, s = structured_truth("k", "llama-3.1-8b-instruct", "H100", 1)
    >>> round(c.beta[2] / (s["base_beta"][2] * math.exp(s["idiosyncrasy"][2])), 5)
    1.0
    >>> all(v >= 0 for v in c.beta), s["family"]
    (True, 'llama')
    """
    rng = random.Random(f"fleet-shared/{key}")
    fam = family_of(model)
    base = [BLIS_BETA[i] * BASE_SCALE.get(i, 1.0) for i in range(len(BLIS_BETA))]
    for i, v in BASE_SET.items():
        base[i] = v
    eps = [rng.uniform(-IDIOSYNCRASY, IDIOSYNCRASY) for _ in base]
    beta = tuple(
        round(
            base[i]
            * _factor(GPU_SCALE, gpu, i)
            * _factor(FAMILY_SCALE, fam, i)
            * _factor(TP_SCALE, tp, i)
            * math.exp(eps[i]),
            6,
        )
        for i in range(len(base))
    )
    alpha_base = [a * s for a, s in zip(BLIS_ALPHA, ALPHA_BASE_SCALE, strict=True)]
    eps_a = [rng.uniform(-IDIOSYNCRASY, IDIOSYNCRASY) for _ in alpha_base]
    ga = GPU_ALPHA_SCALE.get(gpu, (1.0, 1.0, 1.0))
    alpha = tuple(
        round(alpha_base[j] * ga[j] * math.exp(eps_a[j]), 3) for j in range(len(alpha_base))
    )
    coeffs = Coefficients(
        t_s,
        (alpha[0], alpha[1], alpha[2]),
        beta,
        (round(rng.uniform(40, 90), 3), round(rng.uniform(50, 110), 3)),
        (round(rng.uniform(18_000, 26_000), 1), round(rng.uniform(18_000, 26_000), 1)),
    )
    structure = {
        "formula": "beta[i] = base_beta[i]*gpu[i]*family[i]*tp[i]*exp(idiosyncrasy[i]); "
        "alpha[j] = base_alpha[j]*gpu_alpha[j]*exp(alpha_idiosyncrasy[j])",
        "base_beta": base,
        "base_alpha": alpha_base,
        "gpu": gpu,
        "gpu_factors": [_factor(GPU_SCALE, gpu, i) for i in range(len(base))],
        "gpu_alpha_factors": list(ga),
        "family": fam,
        "family_factors": [_factor(FAMILY_SCALE, fam, i) for i in range(len(base))],
        "tp": tp,
        "tp_factors": [_factor(TP_SCALE, tp, i) for i in range(len(base))],
        "idiosyncrasy": eps,
        "alpha_idiosyncrasy": eps_a,
        "idiosyncrasy_bound": IDIOSYNCRASY,
    }
    return coeffs, structure
