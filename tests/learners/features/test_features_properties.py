"""Property tests of the basis (hypothesis) and the behavioural laws of spec §10.1."""

from __future__ import annotations

import numpy as np
import pytest
from features_support import (
    D10,
    D11,
    DENSE_TEST,
    DSV2L,
    H100,
    LLAMA8B,
    MIXTRAL,
    MOE_TEST,
    QWEN3MOE,
    SCOUT,
    TEST_HW,
    basis,
    rep,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from coeffd.learners.features.basis import TERM_INDEX, BlisBasis, batch_stats
from coeffd.learners.features.model import ModelSpec
from coeffd.records.observations import BatchRequest

IX = TERM_INDEX


@st.composite
def requests(draw: st.DrawFn) -> BatchRequest:
    kind = draw(st.sampled_from(["prefill", "chunk", "decode", "other"]))
    i = draw(st.integers(1, 32768))
    o = draw(st.integers(0, 4096))
    if kind == "prefill":
        return BatchRequest(i, 0, draw(st.integers(1, i)), o)
    if kind == "chunk":
        p = draw(st.integers(0, i - 1))
        return BatchRequest(i, p, draw(st.integers(1, max(1, i - p))), o)
    if kind == "decode":
        return BatchRequest(i, i + draw(st.integers(0, 4096)), 1, max(o, 1))
    return BatchRequest(i, i + draw(st.integers(0, 10)), draw(st.integers(0, 2)), 0)


batches = st.lists(requests(), min_size=1, max_size=64)

CONFIGS: list[BlisBasis] = [
    basis(LLAMA8B),
    basis(LLAMA8B, H100, 8),
    basis(MIXTRAL, H100, 2),
    basis(MIXTRAL, H100, 2, 2, "deepep_low_latency"),
    basis(MIXTRAL, H100, 1, 4),
    basis(SCOUT, H100, 4),
    basis(DSV2L, H100, 2, 2, "pplx"),
    basis(QWEN3MOE, H100, 4),
]
configs = st.sampled_from(CONFIGS)


@settings(max_examples=150, deadline=None)
@given(configs, batches)
def test_terms_nonnegative_and_zero_where_spec_says(
    b: BlisBasis, batch: list[BatchRequest]
) -> None:
    x = b.terms(batch)
    assert (x >= 0).all() and np.isfinite(x).all()
    t_pf, _, t_dc, _, n, _ = batch_stats(batch)
    assert x[IX["B"]] == n == len(batch)
    assert (x[IX["T_pf_compute"]] > 0) == (x[IX["T_pf_kv"]] > 0) == (t_pf > 0)
    assert (x[IX["T_dc_compute"]] > 0) == (t_dc > 0)
    assert (x[IX["T_dc_kv"]] > 0) == (t_dc > 0)
    assert (x[IX["T_tp_comm"]] > 0) == (b.tp > 1 and t_pf + t_dc > 0)
    assert (x[IX["T_moe_dispatch"]] > 0) == (b.is_moe and b.dp > 1 and t_pf + t_dc > 0)
    assert (x[IX["chi_L_moe"]] > 0) == b.model.interleaved
    assert x[IX["T_weight"]] > 0 and x[IX["one"]] == 1 and x[IX["L"]] == b.model.num_layers


@settings(max_examples=150, deadline=None)
@given(configs, batches)
def test_fast_path_agrees_with_exact(b: BlisBasis, batch: list[BatchRequest]) -> None:
    exact = b.terms(batch)
    fast = b.fast_terms(batch)
    np.testing.assert_allclose(fast, exact, rtol=1e-12, atol=0)
    many = b.terms_many(np.stack([batch_stats(batch), batch_stats(batch[:1])]))
    np.testing.assert_allclose(many[0], exact, rtol=1e-12, atol=0)
    np.testing.assert_allclose(many[1], b.terms(batch[:1]), rtol=1e-12, atol=0)
    # The learner's view: S is linear in β with n = 11.
    assert float(np.dot(D11, exact)) == pytest.approx(b.step_s(D11, batch), rel=1e-12)


def test_terms_many_empty_rows() -> None:
    b = basis(LLAMA8B)
    out = b.terms_many(np.zeros((3, 6)))
    assert out.shape == (3, 11) and not out.any()


@settings(max_examples=80, deadline=None)
@given(batches)
def test_dense_tp_scaling(batch: list[BatchRequest]) -> None:
    x1 = basis(LLAMA8B, H100, 1).terms(batch)
    for tp in (2, 4, 8):
        xt = basis(LLAMA8B, H100, tp).terms(batch)
        for name in ("T_pf_compute", "T_pf_kv", "T_dc_compute", "T_dc_kv", "T_weight"):
            assert xt[IX[name]] == pytest.approx(x1[IX[name]] / tp, rel=1e-12, abs=1e-300)
        t_tot = batch_stats(batch)[0] + batch_stats(batch)[2]
        # Dense: two all-reduces per layer, ring factor (tp-1)/tp.
        v = 2 * 32 * t_tot * 4096 * 2 * 2 * ((tp - 1) / tp) / 3.35e6
        assert xt[IX["T_tp_comm"]] == pytest.approx(v, rel=1e-12, abs=1e-300)


@settings(max_examples=80, deadline=None)
@given(batches, st.sampled_from([1, 2]))
def test_moe_dp_scaling(batch: list[BatchRequest], tp: int) -> None:
    x1 = basis(MIXTRAL, H100, tp, 1).terms(batch)
    x2 = basis(MIXTRAL, H100, tp, 2).terms(batch)
    for name in ("T_pf_compute", "T_pf_kv", "T_dc_compute", "T_dc_kv"):
        assert x2[IX[name]] == pytest.approx(x1[IX[name]] / 2, rel=1e-12, abs=1e-300)
    assert x2[IX["T_weight"]] < x1[IX["T_weight"]]  # only routed experts shrink with dp
    if tp > 1:  # T_moe_reduce only at dp = 1
        t_tot = batch_stats(batch)[0] + batch_stats(batch)[2]
        assert (
            x2[IX["T_tp_comm"]] == pytest.approx(x1[IX["T_tp_comm"]] / 4, rel=1e-12, abs=1e-300)
            or t_tot == 0
        )


@settings(max_examples=80, deadline=None)
@given(configs, batches, requests())
def test_adding_a_request_never_decreases_terms_or_step(
    b: BlisBasis, batch: list[BatchRequest], extra: BatchRequest
) -> None:
    x0 = b.terms(batch)
    x1 = b.terms([*batch, extra])
    assert (x1 >= x0 - 1e-9 * np.abs(x0)).all()
    assert b.step_time(D11, [*batch, extra]) >= b.step_time(D11, batch)


# --------------------------------------------------------------------------- §10.1 laws

D = basis(DENSE_TEST, TEST_HW, 1)


def test_law_more_prefill_tokens_increase() -> None:
    assert D.step_time(D10, [BatchRequest(512, 0, 512, 0)]) > D.step_time(
        D10, [BatchRequest(512, 0, 256, 0)]
    )


def test_law_more_decode_requests_increase() -> None:
    assert D.step_time(D10, rep(8, 256, 300, 1, 10)) > D.step_time(D10, rep(4, 256, 300, 1, 10))


def test_law_longer_context_increases() -> None:
    assert D.step_time(D10, rep(4, 256, 4000, 1, 10)) > D.step_time(D10, rep(4, 256, 300, 1, 10))


def test_law_tp2_faster_than_tp1() -> None:
    batch = rep(1, 128, 0, 128, 0) + rep(4, 256, 266, 1, 10)
    assert basis(DENSE_TEST, TEST_HW, 2).step_time(D10, batch) < D.step_time(D10, batch)


def test_law_gqa_faster_than_mha() -> None:
    mha = ModelSpec.from_config({**DENSE_TEST.raw, "num_key_value_heads": 32})
    batch = rep(8, 512, 522, 1, 10)
    assert D.step_time(D10, batch) < basis(mha, TEST_HW).step_time(D10, batch)


def test_law_head_dim_does_not_matter() -> None:
    hd = ModelSpec.from_config({**DENSE_TEST.raw, "head_dim": 256})
    batch = rep(8, 512, 522, 1, 10)
    assert basis(hd, TEST_HW).step_time(D10, batch) == D.step_time(D10, batch)


def test_law_dispatch_families() -> None:
    batch = rep(64, 512, 0, 512, 0)
    ag = basis(MOE_TEST, TEST_HW, 2, 2, "allgather_reducescatter").step_time(D10, batch)
    ll = basis(MOE_TEST, TEST_HW, 2, 2, "deepep_low_latency").step_time(D10, batch)
    assert ll > ag
    k1 = ModelSpec.from_config({**MOE_TEST.raw, "num_experts_per_tok": 1})
    assert basis(k1, TEST_HW, 2, 2, "allgather_reducescatter").step_time(D10, batch) == basis(
        k1, TEST_HW, 2, 2, "deepep_low_latency"
    ).step_time(D10, batch)
    # At dp = 1 the backend has no effect.
    assert basis(MOE_TEST, TEST_HW, 2, 1, "pplx").step_time(D10, batch) == basis(
        MOE_TEST, TEST_HW, 2
    ).step_time(D10, batch)


def test_law_doubling_dp_compute_only() -> None:
    batch = rep(64, 512, 0, 512, 0)
    beta = [1.0] + [0.0] * 10
    one = basis(MOE_TEST, TEST_HW, 2, 1).step_time(beta, batch)
    two = basis(MOE_TEST, TEST_HW, 2, 2).step_time(beta, batch)
    assert two < 0.55 * one
