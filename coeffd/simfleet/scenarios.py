"""Named, seeded scenarios: which engines run, with which true coefficients and load.

True β per configuration are BLIS's shipped defaults scaled by configuration-specific
factors (so configurations are distinguishable), with the two zero defaults (decode
compute β₂ and prefill KV β₉) given small positive values so every term that a
configuration's basis exercises is identifiable. Every value stays non-negative.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from coeffd.simfleet.config import (
    BLIS_ALPHA,
    BLIS_BETA,
    Coefficients,
    CoefficientSchedule,
    EngineSpec,
    Noise,
    ServingSetup,
    Workload,
)
from coeffd.simfleet.fleet_truth import structured_truth


def true_coefficients(key: str, t_s: float = 0.0) -> Coefficients:
    """Plausible true coefficients near BLIS's defaults, deterministic per ``key``."""
    rng = random.Random(key)
    beta = list(BLIS_BETA)
    beta[1] = 0.35  # decode compute: BLIS ships 0, make it identifiable
    beta[8] = 0.6  # prefill KV write: likewise
    beta = [round(b * rng.uniform(0.8, 1.25), 6) for b in beta]
    alpha = tuple(round(a * rng.uniform(0.7, 1.4), 3) for a in BLIS_ALPHA)
    return Coefficients(
        t_s,
        (alpha[0], alpha[1], alpha[2]),
        tuple(beta),
        (round(rng.uniform(40, 90), 3), round(rng.uniform(50, 110), 3)),
        (round(rng.uniform(18_000, 26_000), 1), round(rng.uniform(18_000, 26_000), 1)),
    )


def drifted(
    c: Coefficients, t_s: float, beta_scale: dict[int, float], alpha_scale: float
) -> Coefficients:
    """``c`` with some β terms and all α scaled (a software upgrade, a thermal change…)."""
    beta = tuple(round(b * beta_scale.get(i, 1.0), 6) for i, b in enumerate(c.beta))
    a = c.alpha
    return replace(
        c,
        t_s=t_s,
        beta=beta,
        alpha=(
            round(a[0] * alpha_scale, 3),
            round(a[1] * alpha_scale, 3),
            round(a[2] * alpha_scale, 3),
        ),
    )


def _engine(
    name: str,
    serving: ServingSetup,
    workload: Workload,
    schedule: CoefficientSchedule | None = None,
    noise: Noise | None = None,
) -> EngineSpec:
    key = f"{serving.model}/{serving.gpu}/tp{serving.tp}/dp{serving.dp}/{serving.max_num_batched_tokens}/{serving.cpu_offload_gib}"
    sched = schedule or CoefficientSchedule((true_coefficients(key),))
    return EngineSpec(name, serving, sched, workload, noise or Noise())


def steady(duration_s: float) -> list[EngineSpec]:
    """One Llama-3.1-8B engine on H100, TP 1, steady mixed Poisson load."""
    return [
        _engine(
            "steady-0",
            ServingSetup(model="llama-3.1-8b-instruct", gpu="H100", tp=1),
            Workload(rate_per_s=6.0, profile="mixed"),
        )
    ]


_DRIFT = {0: 1.3, 2: 1.2, 5: 1.6, 6: 1.4, 9: 1.25}


def abrupt_drift(duration_s: float) -> list[EngineSpec]:
    """As ``steady``, but true β (compute, weights, per-request, per-step, decode KV) and α
    jump at half time."""
    sc = ServingSetup(model="llama-3.1-8b-instruct", gpu="H100", tp=1)
    base = true_coefficients("abrupt/llama-3.1-8b/H100")
    sched = CoefficientSchedule((base, drifted(base, duration_s / 2, _DRIFT, 1.5)))
    return [_engine("drift-0", sc, Workload(rate_per_s=6.0), sched)]


def gradual_drift(duration_s: float) -> list[EngineSpec]:
    """As ``abrupt-drift`` but ramping linearly from 25 % to 75 % of the run."""
    sc = ServingSetup(model="llama-3.1-8b-instruct", gpu="H100", tp=1)
    base = true_coefficients("gradual/llama-3.1-8b/H100")
    a = replace(base, t_s=duration_s * 0.25)
    b = drifted(base, duration_s * 0.75, _DRIFT, 1.5)
    sched = CoefficientSchedule((replace(base, t_s=0.0), a, b), gradual=True)
    return [_engine("gdrift-0", sc, Workload(rate_per_s=6.0), sched)]


def fleet(duration_s: float) -> list[EngineSpec]:
    """Dense and MoE models, H100 and A100, TP 1/2/4, DP/EP, offload on/off, two chunk sizes."""
    specs = [
        _engine(
            "fleet-llama8b-h100",
            ServingSetup(
                model="llama-3.1-8b-instruct", gpu="H100", tp=1, max_num_batched_tokens=2048
            ),
            Workload(rate_per_s=5.0, profile="mixed"),
        ),
        _engine(
            "fleet-llama8b-a100-offload",
            ServingSetup(
                model="llama-3.1-8b-instruct",
                gpu="A100-80",
                tp=1,
                max_num_batched_tokens=512,
                num_gpu_blocks=4000,
                cpu_offload_gib=8.0,
            ),
            Workload(rate_per_s=3.0, profile="prefill-heavy", prefix_share=0.8, process="bursty"),
        ),
        _engine(
            "fleet-llama70b-h100-tp4",
            ServingSetup(
                model="llama-3.1-70b-instruct", gpu="H100", tp=4, max_num_batched_tokens=2048
            ),
            Workload(rate_per_s=3.0, profile="decode-heavy"),
        ),
        _engine(
            "fleet-qwen7b-a100-tp2-sync",
            ServingSetup(
                model="qwen2.5-7b-instruct",
                gpu="A100-80",
                tp=2,
                max_num_batched_tokens=512,
                async_scheduling=False,
            ),
            Workload(rate_per_s=4.0, profile="mixed"),
        ),
        _engine(
            "fleet-mixtral-h100-tp2",
            ServingSetup(model="mixtral-8x7b-v0.1", gpu="H100", tp=2, max_num_batched_tokens=2048),
            Workload(rate_per_s=3.0, profile="mixed", process="bursty"),
        ),
        _engine(
            "fleet-dsv2lite-a100-offload",
            ServingSetup(
                model="deepseek-v2-lite",
                gpu="A100-80",
                tp=1,
                max_num_batched_tokens=512,
                cpu_offload_gib=4.0,
                num_gpu_blocks=3000,
            ),
            Workload(rate_per_s=3.0, profile="prefill-heavy", prefix_share=0.7),
        ),
        _engine(
            "fleet-scout-h100-tp2",
            ServingSetup(model="llama-4-scout-17b-16e-instruct-fp8-dynamic", gpu="H100", tp=2),
            Workload(rate_per_s=3.0, profile="decode-heavy"),
        ),
    ]
    # DP=2 + EP MoE deployment: two EngineCores (DP ranks) sharing one configuration
    moe = ServingSetup(
        model="qwen3-30b-a3b", gpu="H100", tp=1, dp=2, ep=True, max_num_batched_tokens=2048
    )
    key_eng = _engine("fleet-qwen3moe-h100-dp2ep-r0", moe, Workload(rate_per_s=3.0))
    specs.append(key_eng)
    specs.append(
        replace(
            key_eng,
            name="fleet-qwen3moe-h100-dp2ep-r1",
            serving=replace(moe, dp_rank=1),
        )
    )
    return specs


#: ``fleet-shared``: (name, model, GPU, TP, request rate, workload profile). Dense and MoE,
#: H100 and A100, TP 1-4; every model family on both GPUs somewhere, so a held-out
#: configuration always has relatives (same GPU, same family, same TP) among the rest.
FLEET_SHARED: tuple[tuple[str, str, str, int, float, str], ...] = (
    ("llama8b-h100-tp1", "llama-3.1-8b-instruct", "H100", 1, 5.0, "mixed"),
    ("llama8b-a100-tp1", "llama-3.1-8b-instruct", "A100-80", 1, 3.0, "mixed"),
    ("llama8b-h100-tp2", "llama-3.1-8b-instruct", "H100", 2, 5.0, "decode-heavy"),
    ("llama70b-h100-tp4", "llama-3.1-70b-instruct", "H100", 4, 3.0, "mixed"),
    ("llama70b-a100-tp4", "llama-3.1-70b-instruct", "A100-80", 4, 1.5, "decode-heavy"),
    ("qwen7b-a100-tp2", "qwen2.5-7b-instruct", "A100-80", 2, 3.0, "prefill-heavy"),
    ("qwen14b-h100-tp2", "qwen3-14b", "H100", 2, 4.0, "mixed"),
    ("mixtral-h100-tp2", "mixtral-8x7b-v0.1", "H100", 2, 3.0, "mixed"),
    ("mixtral-a100-tp4", "mixtral-8x7b-v0.1", "A100-80", 4, 2.0, "mixed"),
    ("qwen3moe-h100-tp1", "qwen3-30b-a3b", "H100", 1, 4.0, "decode-heavy"),
    ("qwen3moe-a100-tp2", "qwen3-30b-a3b", "A100-80", 2, 3.0, "mixed"),
    ("dsv2lite-a100-tp1", "deepseek-v2-lite", "A100-80", 1, 3.0, "prefill-heavy"),
)


def fleet_shared_engine(
    name: str, model: str, gpu: str, tp: int, rate: float = 3.0, profile: str = "mixed"
) -> EngineSpec:
    """One engine of ``fleet-shared``: structured truth (``simfleet.fleet_truth``)."""
    sc = ServingSetup(model=model, gpu=gpu, tp=tp, max_num_batched_tokens=2048)
    coeffs, structure = structured_truth(f"{model}/{gpu}/tp{tp}", model, gpu, tp)
    return EngineSpec(
        f"shared-{name}",
        sc,
        CoefficientSchedule((coeffs,)),
        Workload(rate_per_s=rate, profile=profile),
        Noise(),
        structure=structure,
    )


def fleet_shared(duration_s: float) -> list[EngineSpec]:
    """12 configurations whose true coefficients share structure (per-GPU efficiency,
    per-family overheads, TP communication efficiency) plus a ±3 % idiosyncrasy: the
    scenario on which a fleet model and predictions for unseen configurations are judged
    (``bench fleet``). See :mod:`simfleet.fleet_truth`."""
    return [fleet_shared_engine(*row) for row in FLEET_SHARED]


def overload(duration_s: float) -> list[EngineSpec]:
    """Arrivals well above capacity into a small KV pool: long queues, preemptions."""
    return [
        _engine(
            "overload-0",
            ServingSetup(
                model="llama-3.1-8b-instruct",
                gpu="H100",
                tp=1,
                num_gpu_blocks=1200,
                max_num_batched_tokens=2048,
            ),
            Workload(
                rate_per_s=14.0,
                profile="decode-heavy",
                prefix_share=0.3,
                abort_fraction=0.15,  # impatient clients give up on long queues
                abort_patience_s=8.0,
                no_terminal_fraction=0.05,
            ),
        )
    ]


SCENARIOS: dict[str, Callable[[float], list[EngineSpec]]] = {
    "steady": steady,
    "abrupt-drift": abrupt_drift,
    "gradual-drift": gradual_drift,
    "fleet": fleet,
    "fleet-shared": fleet_shared,
    "overload": overload,
}


def build(name: str, duration_s: float) -> list[EngineSpec]:
    """Engines of a named scenario."""
    try:
        return SCENARIOS[name](duration_s)
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
