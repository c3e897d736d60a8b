"""True step-time physics: the project's BLIS basis behind a tiny interface.

The simulator must not carry its own copy of the BLIS formulas (the point of simfleet is
that the learner recovers the coefficients the *project's* basis defines), so the true
period of a batch is ``BlisBasis.step_time(beta_true, batch)`` from ``learners.features``.
``StepPhysics`` is the seam: the engine only sees ``step_time_us(beta, batch)`` and
``kv_bytes_per_block``. A provisional stand-in is kept for the window where the features
package is not importable (it is never used once ``learners.features.BlisBasis`` exists),
so the engine and telemetry can be exercised independently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from receivers.observations import BatchRequest


class StepPhysics(Protocol):
    """What the engine needs from a latency model."""

    def step_time_us(self, beta: Sequence[float], batch: Sequence[BatchRequest]) -> float:
        """True (noise-free) busy-loop period of one batch, µs."""
        ...

    @property
    def kv_bytes_per_block(self) -> float:
        """Bytes of KV cache in one block of 16 tokens, per GPU (TP shard)."""
        ...


class BlisPhysics:
    """Adapter over ``learners.features.BlisBasis`` (spec blis §5.2–§5.4, bit-exact)."""

    def __init__(
        self,
        model: str,
        gpu: str,
        tp: int,
        dp: int = 1,
        moe_comm_backend: str = "",
        block_size: int = 16,
    ) -> None:
        from learners import features as F  # deferred: keeps simfleet importable alone

        spec = F.MODELS[model]
        hw = F.load_hardware(gpu)
        self._basis = F.BlisBasis(spec, hw, tp, dp, moe_comm_backend)
        self.model_spec = spec
        # per GPU: each TP worker moves its shard of the KV heads in parallel
        self._kv_block = float(spec.kv_bytes_per_token_blis) * block_size / max(1, tp)

    def step_time_us(self, beta: Sequence[float], batch: Sequence[BatchRequest]) -> float:
        return float(self._basis.step_time(list(beta), list(batch)))

    def terms(self, batch: Sequence[BatchRequest]) -> Any:
        """The 11 basis terms (spec blis §5.3), for tests and the truth file."""
        return self._basis.terms(list(batch))

    @property
    def kv_bytes_per_block(self) -> float:
        return self._kv_block


class ProvisionalPhysics:
    """Stand-in with the BLIS shape (weights + per-token + per-request + per-step terms).

    Used only when ``learners.features`` cannot build a basis; coarse dense-model roofline
    from a parameter count so the engine sees realistic magnitudes.
    """

    def __init__(self, params_b: float = 8.0, layers: int = 32, tp: int = 1) -> None:
        self._w_us = params_b * 2e9 / 3.35e6 / tp  # bytes / (bytes/µs) at H100 bandwidth
        self._flop_us = 989e6
        self._params = params_b * 1e9 / tp
        self._layers = layers
        self._kv_block = 2 * layers * 1024 * 2 * 16 / tp

    def step_time_us(self, beta: Sequence[float], batch: Sequence[BatchRequest]) -> float:
        if not batch:
            return 1.0
        pf = sum(r.new_tokens for r in batch if r.progress < r.input_len)
        dc = sum(1 for r in batch if r.progress >= r.input_len)
        ctx = sum(r.progress for r in batch if r.progress >= r.input_len)
        s = (
            beta[0] * 2 * self._params * pf / self._flop_us
            + beta[1] * 2 * self._params * dc / self._flop_us
            + beta[2] * self._w_us
            + beta[4] * self._layers
            + beta[5] * len(batch)
            + beta[6]
            + beta[9] * ctx * self._kv_block / 16 / 3.35e6
        )
        return float(max(1, math.trunc(s)))

    @property
    def kv_bytes_per_block(self) -> float:
        return self._kv_block


def make_physics(
    model: str, gpu: str, tp: int, dp: int = 1, moe_comm_backend: str = ""
) -> StepPhysics:
    """The project's basis when available, else the provisional stand-in."""
    try:
        return BlisPhysics(model, gpu, tp, dp, moe_comm_backend)
    except ImportError:
        return ProvisionalPhysics(tp=tp)
