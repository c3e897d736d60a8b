"""Shared fixtures of the features tests: the spec §10 batches, models and hardware."""

from __future__ import annotations

from coeffd.learners.features.basis import BLIS_DEFAULT_BETA, BlisBasis
from coeffd.learners.features.catalog import load_model
from coeffd.learners.features.hardware import HardwareSpec, load_hardware, spec_from_mapping
from coeffd.learners.features.model import ModelSpec
from coeffd.records.observations import BatchRequest


def rep(n: int, i: int, p: int, t: int, o: int) -> list[BatchRequest]:
    """``n×(I, p, t, O)`` in the spec's batch notation."""
    return [BatchRequest(i, p, t, o) for _ in range(n)]


GB = rep(3, 128, 0, 128, 0) + rep(5, 256, 266, 1, 10)
DEC4 = [
    BatchRequest(256, 300, 1, 50),
    BatchRequest(400, 500, 1, 50),
    BatchRequest(600, 700, 1, 50),
    BatchRequest(900, 1000, 1, 50),
]
MIXB = [
    BatchRequest(1000, 0, 1000, 100),
    BatchRequest(3000, 2048, 952, 100),
    BatchRequest(150, 200, 1, 50),
    BatchRequest(250, 300, 1, 50),
    BatchRequest(350, 400, 1, 50),
]
MIXC = rep(1, 512, 0, 512, 100) + rep(8, 1000, 1024, 1, 50)

D11 = list(BLIS_DEFAULT_BETA)
D10 = D11[:10]
Q = [1.0, 1.0, 1.0, 0.5, 10, 5, 100, 200, 0.25, 2.0, 0.9]

# The repository's test hardware (989.0, not the bundled 989.5: notes item 41).
TEST_HW: HardwareSpec = spec_from_mapping(
    "test-h100", {"TFlopsPeak": 989.0, "TFlopsFP8": 0.0, "BwPeakTBs": 3.35}
)
H100 = load_hardware("H100")
A100_80 = load_hardware("A100-80")

LLAMA8B: ModelSpec = load_model("llama-3.1-8b-instruct")
MIXTRAL: ModelSpec = load_model("mixtral-8x7b-v0.1")
SCOUT: ModelSpec = load_model("llama-4-scout-17b-16e-instruct-fp8-dynamic")
DSV2L: ModelSpec = load_model("deepseek-v2-lite")
QWEN3MOE: ModelSpec = load_model("qwen3-30b-a3b")

# The repository's dense test model (= Llama-3.1-8B's numbers) and uniform MoE fixture.
DENSE_TEST = ModelSpec.from_config(
    {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "torch_dtype": "bfloat16",
    },
    name="dense-test",
)
MOE_TEST = ModelSpec.from_config(
    {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "torch_dtype": "bfloat16",
    },
    name="moe-test",
)


def basis(
    model: ModelSpec, hw: HardwareSpec = H100, tp: int = 1, dp: int = 1, be: str = ""
) -> BlisBasis:
    """Shorthand constructor."""
    return BlisBasis(model, hw, tp, dp, be)


def rel(a: float, b: float) -> float:
    """Relative difference (absolute when the reference is 0)."""
    return abs(a - b) / abs(b) if b != 0 else abs(a)
