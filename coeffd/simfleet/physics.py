"""True step-time physics: the project's BLIS basis behind a tiny interface.

The simulator must not carry its own copy of the BLIS formulas (the point of simfleet is
that the learner recovers the coefficients the *project's* basis defines), so the true
period of a batch is ``BlisBasis.step_time(beta_true, batch)`` from ``learners.features``.
``StepPhysics`` is the seam: the engine only sees ``step_time_us(beta, batch)`` and
``kv_bytes_per_block``, so another latency model (e.g. an extended basis) can be plugged in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from coeffd.records.observations import BatchRequest


class StepPhysics(Protocol):
    """What the engine needs from a latency model."""

    def step_time_us(self, beta: Sequence[float], batch: Sequence[BatchRequest]) -> float:
        """True (noise-free) busy-loop period of one batch, µs."""
        ...

    @property
    def kv_bytes_per_block(self) -> float:
        """Bytes of KV cache in one block (all layers and KV heads, vLLM layout)."""
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
        from coeffd.learners import features as F  # deferred: keeps simfleet importable alone

        spec = F.MODELS[model]
        hw = F.load_hardware(gpu)
        self._basis = F.BlisBasis(spec, hw, tp, dp, moe_comm_backend)
        self.model_spec = spec
        # the logical block (all KV heads, vLLM layout), as the learners count transfer
        # bytes, so a learned bytes/µs compares directly with the truth
        from coeffd.learners.features.observe import kv_bytes_per_block

        self._kv_block = kv_bytes_per_block(spec, block_size)

    def step_time_us(self, beta: Sequence[float], batch: Sequence[BatchRequest]) -> float:
        return float(self._basis.step_time(list(beta), list(batch)))

    def terms(self, batch: Sequence[BatchRequest]) -> Any:
        """The 11 basis terms (spec blis §5.3), for tests and the truth file."""
        return self._basis.terms(list(batch))

    @property
    def kv_bytes_per_block(self) -> float:
        return self._kv_block


def make_physics(
    model: str, gpu: str, tp: int, dp: int = 1, moe_comm_backend: str = ""
) -> StepPhysics:
    """The project's basis for a configuration (the only physics simfleet uses)."""
    return BlisPhysics(model, gpu, tp, dp, moe_comm_backend)
