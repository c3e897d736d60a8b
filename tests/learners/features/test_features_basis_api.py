"""BlisBasis validation (§7.1), β handling (§5.1), aggregates approximation, observation glue."""

from __future__ import annotations

import math
import random

import msgspec
import numpy as np
import pytest
from features_support import (
    D11,
    DENSE_TEST,
    H100,
    LLAMA8B,
    MIXB,
    MIXTRAL,
    QWEN3MOE,
    TEST_HW,
    basis,
    rep,
)

from coeffd.learners.features.basis import (
    TERM_INDEX,
    BasisConfigError,
    BlisBasis,
    normalize_beta,
    step_time_from_s,
)
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.features.extended import EXTENDED_INDEX, EXTENDED_NAMES, extended_terms
from coeffd.learners.features.hardware import spec_from_mapping
from coeffd.learners.features.model import ModelSpec
from coeffd.learners.features.observe import (
    aggregates_from_requests,
    fill_transfer_bytes,
    kv_bytes_per_block,
    step_features,
)
from coeffd.records.events import Source
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    KVTransferObservation,
    PeriodMethod,
    StepObservation,
)

# --------------------------------------------------------------------------- validation


def test_heads_not_divisible_by_tp_names_key_and_file() -> None:
    with pytest.raises(
        BasisConfigError, match=r"num_attention_heads \(32\) is not divisible by tp \(3\)"
    ):
        basis(LLAMA8B, H100, 3)
    with pytest.raises(BasisConfigError, match=r"num_key_value_heads \(8\).*tp \(16\)"):
        basis(LLAMA8B, H100, 16)
    try:
        basis(LLAMA8B, H100, 3)
    except BasisConfigError as exc:
        assert "llama-3.1-8b-instruct" in str(exc)


def test_dp_rules() -> None:
    with pytest.raises(BasisConfigError, match="only for MoE"):
        basis(LLAMA8B, H100, 1, 2)
    with pytest.raises(BasisConfigError, match="dp must be >= 1"):
        basis(MIXTRAL, H100, 1, 0)
    with pytest.raises(BasisConfigError, match="tp must be a positive integer"):
        basis(LLAMA8B, H100, 0)


def test_backend_names() -> None:
    for be in (
        "naive",
        "allgather_reducescatter",
        "pplx",
        "deepep_high_throughput",
        "deepep_low_latency",
        "mori",
        "flashinfer_all2allv",
    ):
        assert BlisBasis(MIXTRAL, H100, 2, 2, be).moe_comm_backend == be
    assert BlisBasis(MIXTRAL, H100, 2).moe_comm_backend == "allgather_reducescatter"
    with pytest.raises(BasisConfigError, match="unknown MoE comm backend 'DeepEP'"):
        BlisBasis(MIXTRAL, H100, 2, 2, "DeepEP")


def test_model_and_hardware_rejections() -> None:
    raw = ModelSpec.from_config({**DENSE_TEST.raw, "torch_dtype": "bf16"}, strict=False)
    with pytest.raises(BasisConfigError, match="0 bytes per parameter"):
        basis(raw, TEST_HW)
    no_ff = ModelSpec.from_config({**DENSE_TEST.raw, "intermediate_size": 0}, strict=False)
    with pytest.raises(BasisConfigError, match="intermediate_size must be > 0"):
        basis(no_ff, TEST_HW)
    no_k = ModelSpec.from_config({**DENSE_TEST.raw, "num_local_experts": 4}, strict=False)
    with pytest.raises(BasisConfigError, match="NumExpertsPerTok"):
        basis(no_k, TEST_HW)
    slow = spec_from_mapping("zero", {"TFlopsPeak": 0.0, "BwPeakTBs": 1.0})
    with pytest.raises(BasisConfigError, match="TFlopsPeak"):
        basis(DENSE_TEST, slow)


@pytest.mark.parametrize(
    ("beta", "match"),
    [
        ([1.0] * 6, "at least 7"),
        ([1.0] * 6 + [math.nan], r"beta\[6\] is NaN"),
        ([1.0] * 6 + [math.inf], r"beta\[6\] is Inf"),
        ([1.0] * 6 + [-1.0], "non-negative"),
        ([1.0] * 11 + [-1.0], r"beta\[11\]"),  # past index 10: still validated
    ],
)
def test_beta_validation(beta: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        basis(LLAMA8B).step_time(beta, MIXB)


def test_beta_normalisation() -> None:
    b, n = normalize_beta([1, 2, 3, 4, 5, 6, 7])
    assert n == 7 and b[7] == 0 and b[10] == 4
    b, n = normalize_beta([*range(11), 99])
    assert n == 12 and b[10] == 10 and len(b) == 11


def test_step_time_clamps() -> None:
    assert step_time_from_s(0.3) == 1
    assert step_time_from_s(math.nan) == 2**63 - 1
    assert step_time_from_s(1e30) == 2**63 - 1
    assert step_time_from_s(7797.99) == 7797


# --------------------------------------------------------------------------- aggregates


def _realistic(rng: random.Random, kind: str) -> list[BatchRequest]:
    """Decode-heavy / mixed / prefill batches like vLLM's with a 2048-token budget."""
    reqs = []
    nd = rng.randint(1, 128) if kind != "prefill" else 0
    for _ in range(nd):
        i, g = rng.randint(50, 4000), rng.randint(1, 1000)
        reqs.append(BatchRequest(i, i + g - 1, 1, g + rng.randint(1, 200)))
    budget = 2048 - nd
    while kind != "decode" and budget > 0:
        i = rng.randint(50, 8000)
        p = rng.choice([0, 0, 0, rng.randint(0, i - 1)])
        t = min(i - p, budget)
        reqs.append(BatchRequest(i, p, t, 100))
        budget -= t
        if rng.random() < 0.5:
            break
    return reqs


@pytest.mark.parametrize(("kind", "bound"), [("decode", 0.002), ("mixed", 0.10), ("prefill", 0.12)])
def test_aggregate_approximation_error(kind: str, bound: float) -> None:
    rng = random.Random(7)
    b = basis(LLAMA8B)
    errors = []
    for _ in range(200):
        batch = _realistic(rng, kind)
        exact = float(np.dot(D11, b.terms(batch)))
        approx = float(np.dot(D11, b.terms_from_aggregates(aggregates_from_requests(batch))))
        errors.append(abs(approx - exact) / exact)
    assert max(errors) < bound


def test_aggregate_exact_cases() -> None:
    b = basis(QWEN3MOE, H100, 2)
    # Whole equal prompts, decode context given: the approximation is exact.
    batch = rep(4, 300, 0, 300, 10) + rep(3, 100, 500, 1, 10)
    agg = aggregates_from_requests(batch)
    np.testing.assert_allclose(
        b.terms_from_aggregates(agg, context_tokens=1500), b.terms(batch), rtol=1e-12
    )
    # Prompt-length hint for chunks.
    chunked = rep(2, 4000, 0, 1000, 10)
    approx = b.terms_from_aggregates(aggregates_from_requests(chunked), mean_prompt_len=4000)
    np.testing.assert_allclose(approx, b.terms(chunked), rtol=1e-12)
    empty = aggregates_from_requests([])
    assert not b.terms_from_aggregates(empty).any()


# --------------------------------------------------------------------------- observations

SRC = Source(
    id="e1", attributes=(("coeffd.model", "llama-3.1-8b-instruct"), ("coeffd.gpu", "H100"))
)


def _obs(batch: list[BatchRequest], composition: Composition, **kw: object) -> StepObservation:
    agg = aggregates_from_requests(batch, kv_blocks_total=1000)
    return StepObservation(
        source=SRC,
        step=1,
        start_mono_ns=0,
        period_us=1000.0,
        period_method=PeriodMethod.CONSECUTIVE_SUMMARIES,
        period_uncertainty_us=1.0,
        scheduler_duration_us=50,
        composition=composition,
        requests=tuple(batch) if composition is not Composition.AGGREGATES else (),
        aggregates=agg,
        async_scheduling=False,
        **kw,  # type: ignore[arg-type]
    )


def test_step_features_picks_composition() -> None:
    b = basis(LLAMA8B)
    snap = _obs(MIXB, Composition.SNAPSHOTS)
    np.testing.assert_allclose(step_features(snap, b), b.terms(MIXB), rtol=1e-12)
    np.testing.assert_allclose(
        step_features(_obs(MIXB, Composition.JOURNEYS), b), b.terms(MIXB), rtol=1e-12
    )
    agg = _obs(MIXB, Composition.AGGREGATES)
    np.testing.assert_allclose(
        step_features(agg, b), b.terms_from_aggregates(agg.aggregates), rtol=1e-15
    )


def test_kv_bytes_per_block_and_fill() -> None:
    assert kv_bytes_per_block(LLAMA8B, 16) == 16 * 131072
    assert kv_bytes_per_block(LLAMA8B, 16, kv_cache_dtype="fp8") == 16 * 65536
    assert kv_bytes_per_block(LLAMA8B, 16, tp=16, per_rank=True) == 16 * 131072 / 8  # replicated
    tr = KVTransferObservation(
        source=SRC, dp_rank=0, transfer_id=1, store=True, block_count=10, duration_us=5.0, step=1
    )
    filled = fill_transfer_bytes(tr, LLAMA8B, 16)
    assert filled.bytes == 10 * 16 * 131072
    assert fill_transfer_bytes(filled, LLAMA8B, 32) is filled


def test_extended_terms() -> None:
    cfg = ServingConfig(
        model="llama-3.1-8b-instruct", gpu="H100", tp=2, max_num_batched_tokens=4096
    )
    b = basis(LLAMA8B, H100, 2)
    tr = [
        KVTransferObservation(
            source=SRC,
            dp_rank=0,
            transfer_id=i,
            store=i == 0,
            block_count=100,
            duration_us=1.0,
            step=1,
        )
        for i in range(2)
    ]
    obs = _obs(MIXB, Composition.SNAPSHOTS, kv_transfers=tuple(tr))
    x = extended_terms(obs, b, cfg)
    assert x.shape == (len(EXTENDED_NAMES),) and (x >= 0).all()
    agg = obs.aggregates
    assert x[EXTENDED_INDEX["kv_usage"]] == agg.kv_usage_gpu_ratio
    assert x[EXTENDED_INDEX["budget_fill"]] == agg.scheduled_tokens / 4096
    assert x[EXTENDED_INDEX["prefill_chunks"]] == 1  # the (3000, 2048, 952) chunk
    per_rank = 16 * 131072 / 2
    assert x[EXTENDED_INDEX["offload_store_us"]] == pytest.approx(100 * per_rank / 64e3)
    assert x[EXTENDED_INDEX["offload_load_us"]] == pytest.approx(100 * per_rank / 64e3)
    tokens = 1952 + 3
    assert x[EXTENDED_INDEX["tp_comm_us"]] == pytest.approx(64 * tokens * 4096 * 2 * 1.0 / 450e3)
    assert x[EXTENDED_INDEX["ep_comm_us"]] == 0
    # MoE with DP: expert dispatch over NVLink.
    moe_cfg = ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2, dp=2, ep=True)
    xm = extended_terms(obs, basis(MIXTRAL, H100, 2, 2), moe_cfg)
    assert xm[EXTENDED_INDEX["ep_comm_us"]] > 0
    # Aggregates only: no chunk information, no crash.
    xa = extended_terms(_obs(MIXB, Composition.AGGREGATES), b, cfg)
    assert xa[EXTENDED_INDEX["prefill_chunks"]] == 0 and xa[EXTENDED_INDEX["tp_comm_us"]] > 0


def test_observation_roundtrip_is_msgspec() -> None:
    obs = _obs(MIXB, Composition.SNAPSHOTS)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(obs), type=StepObservation)
    np.testing.assert_array_equal(
        step_features(again, basis(LLAMA8B)), step_features(obs, basis(LLAMA8B))
    )
    assert TERM_INDEX["T_weight"] == 2
