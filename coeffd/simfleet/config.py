"""Static description of one simulated engine: serving configuration, truth, workload.

Everything a scenario chooses lives here, as plain frozen dataclasses, so a scenario is
data and the truth file is a dump of these objects.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coeffd.learners.features.basis import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA

# BLIS's shipped defaults, from the project's basis module (single source of truth)
BLIS_BETA: tuple[float, ...] = tuple(BLIS_DEFAULT_BETA)
BLIS_ALPHA: tuple[float, ...] = tuple(BLIS_DEFAULT_ALPHA)


@dataclass(frozen=True, slots=True)
class Coefficients:
    """True coefficients in force from ``t_s`` (simulated seconds since start)."""

    t_s: float
    alpha: tuple[float, float, float]
    beta: tuple[float, ...]
    kv_base_us: tuple[float, float] = (60.0, 80.0)  # (store GPU->CPU, load CPU->GPU)
    kv_bytes_per_us: tuple[float, float] = (20_000.0, 22_000.0)  # ~20 GB/s PCIe per direction


@dataclass(frozen=True, slots=True)
class CoefficientSchedule:
    """Piecewise coefficients; ``gradual=True`` interpolates linearly between points.

    Abrupt drift is a step at each point; gradual drift ramps from point i to i+1.
    """

    points: tuple[Coefficients, ...]
    gradual: bool = False

    def at(self, t_s: float) -> Coefficients:
        """Coefficients in force at simulated time ``t_s``."""
        pts = self.points
        if len(pts) == 1:
            return pts[0]
        i = bisect.bisect_right([p.t_s for p in pts], t_s) - 1
        i = max(0, i)
        if not self.gradual or i + 1 >= len(pts):
            return pts[i]
        a, b = pts[i], pts[i + 1]
        w = (t_s - a.t_s) / (b.t_s - a.t_s) if b.t_s > a.t_s else 1.0
        w = min(1.0, max(0.0, w))

        def lerp(x: Sequence[float], y: Sequence[float]) -> tuple[float, ...]:
            return tuple(xi + (yi - xi) * w for xi, yi in zip(x, y, strict=True))

        al = lerp(a.alpha, b.alpha)
        return Coefficients(
            t_s,
            (al[0], al[1], al[2]),
            lerp(a.beta, b.beta),
            (
                a.kv_base_us[0] + (b.kv_base_us[0] - a.kv_base_us[0]) * w,
                a.kv_base_us[1] + (b.kv_base_us[1] - a.kv_base_us[1]) * w,
            ),
            (
                a.kv_bytes_per_us[0] + (b.kv_bytes_per_us[0] - a.kv_bytes_per_us[0]) * w,
                a.kv_bytes_per_us[1] + (b.kv_bytes_per_us[1] - a.kv_bytes_per_us[1]) * w,
            ),
        )


@dataclass(frozen=True, slots=True)
class Noise:
    """Multiplicative log-normal noise (median-preserving) and rare heavy-tail stalls.

    The period of a step is ``S_true · exp(σ·z)`` (+ a stall of ``stall_us · Pareto(1.5)``
    with probability ``stall_rate``); API delays use ``alpha_sigma`` the same way.
    """

    sigma: float = 0.03
    stall_rate: float = 5e-4
    stall_us: float = 20_000.0
    alpha_sigma: float = 0.05
    kv_sigma: float = 0.05


@dataclass(frozen=True, slots=True)
class Workload:
    """Request arrivals and lengths.

    ``profile``: ``mixed`` | ``prefill-heavy`` | ``decode-heavy``; ``process``:
    ``poisson`` | ``bursty`` (on/off modulated Poisson, ``burst_factor`` × rate when on).
    ``rate_schedule``: (t_s, rate multiplier) steps, for load changes within a run.
    """

    rate_per_s: float = 4.0
    profile: str = "mixed"
    process: str = "poisson"
    burst_factor: float = 4.0
    burst_on_s: float = 5.0
    burst_off_s: float = 15.0
    prefix_share: float = 0.5  # fraction of requests starting with a shared system prompt
    num_prefixes: int = 8
    chat_fraction: float = 0.8  # rest are /v1/completions
    stream_fraction: float = 0.9  # of chat requests
    length_finish_fraction: float = 0.3  # requests that stop at max_tokens
    max_model_len: int = 8192
    abort_fraction: float = 0.0  # requests whose client disconnects if not done in time
    abort_patience_s: float = 20.0  # mean patience (exponential, + 1 s) of those clients
    no_terminal_fraction: float = 0.0  # llm_request spans ended by cleanup only (spec §2.2)
    rate_schedule: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ServingSetup:
    """How one simulated engine is set up: model, GPU, parallelism, scheduler knobs (what its
    configuration id is derived from; ``learners.features.config.ServingConfig`` is that id)."""

    model: str = "llama-3.1-8b-instruct"
    gpu: str = "H100"
    tp: int = 1
    dp: int = 1
    ep: bool = False
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    block_size: int = 16
    num_gpu_blocks: int = 8193  # includes vLLM's null block
    cpu_offload_gib: float = 0.0
    async_scheduling: bool = True
    prefix_caching: bool = True
    moe_comm_backend: str = ""
    dp_rank: int = 0


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One simulated EngineCore (+ its API server)."""

    name: str
    serving: ServingSetup
    truth: CoefficientSchedule
    workload: Workload = field(default_factory=Workload)
    noise: Noise = field(default_factory=Noise)
    #: How the truth was built, when it has structure (``simfleet.fleet_truth``); copied
    #: into the truth file.
    structure: dict[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class SampleRates:
    """vLLM's tracing sample rates (spec §3). vLLM defaults: 1.0 / 0.01 / 0.001 / 100."""

    journey: float = 1.0
    step: float = 0.01
    rich: float = 0.001
    closure_interval: int = 100

    @classmethod
    def parse(cls, text: str) -> SampleRates:
        """``"journey,step,rich[,closure]"`` as on the command line."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if len(parts) not in (3, 4):
            raise ValueError("expected journey,step,rich[,closure_interval]")
        k = int(parts[3]) if len(parts) == 4 else 100
        return cls(float(parts[0]), float(parts[1]), float(parts[2]), k)
