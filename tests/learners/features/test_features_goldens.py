"""Every worked example and literal golden of spec blis-trained-physics.md §10 and §6.

Printed values with 16+ significant digits are the repr of BLIS's double: asserted exactly.
Shorter ones (10 decimals) are asserted to half a unit of the last printed digit, which is
tighter than 1e-12 relative for every value above 50.
"""

from __future__ import annotations

import pytest
from features_support import (
    A100_80,
    D10,
    D11,
    DEC4,
    DENSE_TEST,
    DSV2L,
    GB,
    H100,
    LLAMA8B,
    MIXB,
    MIXC,
    MIXTRAL,
    MOE_TEST,
    QWEN3MOE,
    SCOUT,
    TEST_HW,
    Q,
    basis,
    rep,
)

from coeffd.learners.features.alpha import single_request_timeline
from coeffd.learners.features.basis import BLIS_DEFAULT_ALPHA, TERM_INDEX, BlisBasis
from coeffd.records.observations import BatchRequest


def check(actual: float, printed: str) -> None:
    """Compare with a value printed in the spec (exact when printed in full)."""
    digits = sum(c.isdigit() for c in printed.lstrip("0."))
    expected = float(printed)
    if digits >= 16:
        assert actual == expected, (actual, printed)
        return
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    tol = max(0.5 * 10.0**-decimals * 1.0000001, abs(expected) * 1e-12)
    assert abs(actual - expected) <= tol, (actual, printed)


def check_terms(b: BlisBasis, batch: list[BatchRequest], **expected: str) -> None:
    x = b.terms(batch)
    for name, printed in expected.items():
        check(float(x[TERM_INDEX[name]]), printed)


# --------------------------------------------------------------------------- §10.1 G1–G4

G_ROWS = [
    # tp, T_pf_compute, T_pf_kv, T_dc_compute, T_dc_kv, T_weight, T_tp_attn(=denseFFN), S, step
    (
        1,
        "5458.8209212053",
        "15.0243725373",
        "71.2745415571",
        "52.2331701493",
        "4166.7593170149",
        "0",
        "7797.8886778434",
        7797,
    ),
    (
        2,
        "2729.4104606026",
        "7.5121862687",
        "35.6372707786",
        "26.1165850746",
        "2083.3796585075",
        "30.4400047761",
        "4538.9356236453",
        4538,
    ),
    (
        4,
        "1364.7052303013",
        "3.7560931343",
        "17.8186353893",
        "13.0582925373",
        "1041.6898292537",
        "45.6600071642",
        "2909.4590965463",
        2909,
    ),
    (
        8,
        "682.3526151507",
        "1.8780465672",
        "8.9093176946",
        "6.5291462687",
        "520.8449146269",
        "53.2700083582",
        "2094.7208329968",
        2094,
    ),
]


@pytest.mark.parametrize("row", G_ROWS, ids=["G1", "G2", "G3", "G4"])
def test_g1_g4_dense_step_time_vs_tp(row: tuple) -> None:
    tp, pfc, pfkv, dcc, dckv, w, attn, s, step = row
    b = basis(DENSE_TEST, TEST_HW, tp)
    check_terms(b, GB, T_pf_compute=pfc, T_pf_kv=pfkv, T_dc_compute=dcc, T_dc_kv=dckv, T_weight=w)
    check(float(b.terms(GB)[TERM_INDEX["T_tp_comm"]]) / 2, attn)  # attn + denseFFN, equal
    check(b.step_s(D10, GB), s)
    assert b.step_time(D10, GB) == step
    # Dense model: the comm backend never matters (and the EP flag has no input at all).
    for be in ("naive", "pplx", "deepep_low_latency", "mori", "flashinfer_all2allv"):
        assert basis(DENSE_TEST, TEST_HW, tp, 1, be).step_time(D10, GB) == step


def test_g1_by_hand_intermediates() -> None:
    b = basis(DENSE_TEST, TEST_HW, 1)
    x = b.terms(GB)
    assert x[TERM_INDEX["T_pf_compute"]] == 5398773891072 / 9.89e8
    assert x[TERM_INDEX["T_dc_compute"]] == 70490521600 / 9.89e8
    assert x[TERM_INDEX["T_pf_kv"]] == 50331648 / 3.35e6
    assert x[TERM_INDEX["T_dc_kv"]] == 174981120 / 3.35e6
    assert x[TERM_INDEX["T_weight"]] == (2684354560 + 11274289152) / 3.35e6
    assert list(x[[TERM_INDEX[n] for n in ("L", "B", "one", "chi_L_moe")]]) == [32, 8, 1, 0]


# --------------------------------------------------------------------------- G5–G8


def test_g5_balanced_placement() -> None:
    b = basis(MOE_TEST, TEST_HW, 2, 2)
    assert b._N / b._G == 2
    assert 100 * b._k_eff / b._G == 50
    assert (100 / 2) * b._k_eff * (b._G - 1) / b._G * 2 == pytest.approx(150, rel=1e-9)


def test_g6_dispatch_per_layer_both_families() -> None:
    ag = basis(MOE_TEST, TEST_HW, 2, 2, "allgather_reducescatter")._dispatch_per_layer(100.0)
    a2a = basis(MOE_TEST, TEST_HW, 2, 2, "deepep_high_throughput")._dispatch_per_layer(100.0)
    assert ag == pytest.approx(614400 / 3.35e6, rel=1e-6)
    assert a2a == pytest.approx(1228800 / 3.35e6, rel=1e-6)
    assert a2a / ag == pytest.approx(2, rel=1e-9)
    # FP8 weights (w = 1, a = 2): dispatch uses a, not w.
    fp8 = MOE_TEST.__class__.from_config(
        {**MOE_TEST.raw, "quantization_config": {"quant_method": "fp8"}}, name="moe-fp8"
    )
    assert fp8.weight_bytes == 1.0 and fp8.bytes_per_param == 2
    assert basis(fp8, TEST_HW, 2, 2)._dispatch_per_layer(100.0) == ag


def test_g7_beta_ep_default() -> None:
    from coeffd.learners.features.basis import normalize_beta

    assert normalize_beta(D10)[0][10] == 0.752037
    assert normalize_beta([*D10, 0.9999])[0][10] == 0.9999


@pytest.mark.parametrize("b", [basis(LLAMA8B), basis(MIXTRAL, H100, 2, 2), basis(SCOUT, H100, 2)])
def test_g8_empty_batch(b: BlisBasis) -> None:
    assert b.step_time(D11, []) == 1
    assert b.step_time(D10, []) == 1
    assert not b.terms([]).any()


# --------------------------------------------------------------------------- §10.2 W1–W9


def test_w1_llama_pure_decode() -> None:
    b = basis(LLAMA8B)
    check_terms(
        b,
        DEC4,
        T_dc_compute="57.7516875675",
        T_dc_kv="97.9714292537",
        T_weight="4166.7593170149",
        T_pf_compute="0",
        T_tp_comm="0",
    )
    assert b.terms(DEC4)[TERM_INDEX["B"]] == 4
    check(b.step_s(D11, DEC4), "7038.8391079266")
    assert b.step_time(D11, DEC4) == 7038


def test_w2_llama_mixed() -> None:
    b = basis(LLAMA8B)
    check_terms(
        b,
        MIXB,
        T_pf_compute="30084.5408889338",
        T_pf_kv="76.3738937313",
        T_dc_compute="42.7971605215",
        T_dc_kv="35.3307510448",
    )
    check(b.step_s(D11, MIXB), "11497.988841218023")
    assert b.step_time(D11, MIXB) == 11497


def test_w2b_llama_mixed_tp2() -> None:
    b = basis(LLAMA8B, H100, 2)
    check_terms(
        b,
        MIXB,
        T_pf_compute="15042.2704444669",
        T_pf_kv="38.1869468657",
        T_dc_compute="21.3985802607",
        T_dc_kv="17.6653755224",
        T_weight="2083.3796585075",
        T_tp_comm="305.9650865672",
    )
    check(b.step_s(D11, MIXB), "6566.6734847357")
    assert b.step_time(D11, MIXB) == 6566


def test_w3_mixtral_tp2() -> None:
    b = basis(MIXTRAL, H100, 2)
    check_terms(
        b,
        MIXC,
        T_pf_compute="6632.3497001395",
        T_pf_kv="10.0162483582",
        T_dc_compute="104.1730319394",
        T_dc_kv="160.4164776119",
        T_weight="13862.4877277612",
        T_tp_comm="81.3820179104",
        T_moe_dispatch="0",
        chi_L_moe="0",
    )
    check(b.step_s(D11, MIXC), "21463.39153914728")
    assert b.step_time(D11, MIXC) == 21463


@pytest.mark.parametrize(
    ("backend", "dispatch", "s", "step"),
    [
        ("allgather_reducescatter", "30.5182567164", "11608.710350083042", 11608),
        ("deepep_low_latency", "61.0365134328", "11631.661208309288", 11631),
    ],
    ids=["W4a", "W4b"],
)
def test_w4_mixtral_tp2_dp2(backend: str, dispatch: str, s: str, step: int) -> None:
    b = basis(MIXTRAL, H100, 2, 2, backend)
    check_terms(
        b,
        MIXC,
        T_pf_compute="3316.1748500697",
        T_pf_kv="5.0081241791",
        T_dc_compute="52.0865159697",
        T_dc_kv="80.2082388060",
        T_weight="7131.5688310448",
        T_tp_comm="20.3455044776",
        T_moe_dispatch=dispatch,
    )
    check(b.step_s(D11, MIXC), s)
    assert b.step_time(D11, MIXC) == step


def test_w5_scout_fp8_interleaved() -> None:
    b = basis(SCOUT, H100, 2)
    assert b._phi == 1.979e9
    check_terms(
        b,
        MIXC,
        T_pf_compute="3222.8531756241",
        T_pf_kv="15.0243725373",
        T_dc_compute="50.8657382516",
        T_dc_kv="240.6247164179",
        T_weight="8563.8923462687",
        chi_L_moe="24",
    )
    x = b.terms(MIXC)
    assert float(x[TERM_INDEX["T_tp_comm"]]) == pytest.approx(
        76.2956417910 + 2 * 38.1478208955, abs=2e-10
    )
    check(D11[7] * float(x[TERM_INDEX["chi_L_moe"]]), "11564.6733312")
    check(b.step_s(D11, MIXC), "26013.147879159376")
    assert b.step_time(D11, MIXC) == 26013


def test_w6_deepseek_shared_experts() -> None:
    b = basis(DSV2L)
    check_terms(
        b,
        MIXC,
        T_pf_compute="2490.3865448004",
        T_pf_kv="33.8048382090",
        T_dc_compute="39.3700814068",
        T_dc_kv="541.4056119403",
        T_weight="9473.8059080597",
        T_tp_comm="0",
    )
    check(b.step_s(D11, MIXC), "15373.723315257184")
    assert b.step_time(D11, MIXC) == 15373


def test_w7_qwen3_moe_decode() -> None:
    b = basis(QWEN3MOE, H100, 2)
    check_terms(
        b,
        DEC4,
        T_dc_compute="9.6525686104",
        T_dc_kv="18.3696429851",
        T_weight="8789.2579343284",
        T_tp_comm="0.4695116418",
    )
    check(b.step_s(D11, DEC4), "13696.015532923919")
    assert b.step_time(D11, DEC4) == 13696


def test_w8_scout_on_a100_no_fp8_peak() -> None:
    b = basis(SCOUT, A100_80, 2)
    assert b._phi == 3.12e8 and b._bw == 1e6 * 2.039  # TB/s × 1e6, as BLIS computes it
    check_terms(
        b,
        MIXC,
        T_pf_compute="20442.3924184615",
        T_pf_kv="24.6844767043",
        T_dc_compute="322.6387692308",
        T_dc_kv="395.3373222168",
        T_weight="14070.1517214321",
    )
    assert float(b.terms(MIXC)[TERM_INDEX["T_tp_comm"]]) == pytest.approx(
        125.3508582639 + 2 * 62.6754291319, abs=2e-10
    )
    check(b.step_s(D11, MIXC), "36510.185634460984")
    assert b.step_time(D11, MIXC) == 36510


W9_ROWS = [
    (
        1,
        1,
        "",
        "9836.3002279474",
        "128.2729700303",
        "52.2331701493",
        "27724.9754555224",
        "0",
        "0",
        "0",
        "40562.582060536319",
        40562,
    ),
    (
        2,
        1,
        "",
        "4918.1501139737",
        "64.1364850152",
        "26.1165850746",
        "13862.4877277612",
        "30.4400047761",
        "30.4400047761",
        "0",
        "20921.2823149918",
        20921,
    ),
    (
        1,
        2,
        "allgather_reducescatter",
        "4918.1501139737",
        "64.1364850152",
        "26.1165850746",
        "14263.1376620896",
        "0",
        "0",
        "15.2200023881",
        "21432.841514652042",
        21432,
    ),
    (
        2,
        2,
        "allgather_reducescatter",
        "2459.0750569869",
        "32.0682425076",
        "13.0582925373",
        "7131.5688310448",
        "15.2200023881",
        "0",
        "22.8300035821",
        "11333.520032177839",
        11333,
    ),
    (
        2,
        2,
        "deepep_low_latency",
        "2459.0750569869",
        "32.0682425076",
        "13.0582925373",
        "7131.5688310448",
        "15.2200023881",
        "0",
        "45.6600071642",
        "11350.689039581704",
        11350,
    ),
]


@pytest.mark.parametrize("row", W9_ROWS, ids=[f"W9-{i}" for i in range(len(W9_ROWS))])
def test_w9_dp_ep_fixture(row: tuple) -> None:
    tp, dp, be, pfc, dcc, dckv, w, attn, reduce, disp, s, step = row
    b = basis(MOE_TEST, TEST_HW, tp, dp, be)
    x = b.terms(GB)
    check_terms(
        b, GB, T_pf_compute=pfc, T_dc_compute=dcc, T_dc_kv=dckv, T_weight=w, T_moe_dispatch=disp
    )
    assert float(x[TERM_INDEX["T_tp_comm"]]) == pytest.approx(
        float(attn) + float(reduce), abs=2e-10
    )
    check(float(x[TERM_INDEX["T_pf_kv"]]) * tp * dp, "15.0243725373")
    check(b.step_s(D10, GB), s)
    assert b.step_time(D10, GB) == step


# --------------------------------------------------------------------------- §10.3 C-variants

C_ROWS = [
    ("C1-7", LLAMA8B, 1, 1, "", "MIXB", 7, "34739.097366470203", 34739),
    ("C1-8", LLAMA8B, 1, 1, "", "MIXB", 8, "34739.097366470203", 34739),
    ("C1-9", LLAMA8B, 1, 1, "", "MIXB", 9, "34758.19083990304", 34758),
    ("C1-10", LLAMA8B, 1, 1, "", "MIXB", 10, "34828.85234199259", 34828),
    ("C1-11", LLAMA8B, 1, 1, "", "MIXB", 11, "34828.85234199259", 34828),
    ("C2-7", SCOUT, 2, 1, "", "MIXC", 7, "12728.665880101664", 12728),
    ("C2-8", SCOUT, 2, 1, "", "MIXC", 8, "17528.665880101664", 17528),
    ("C2-10", SCOUT, 2, 1, "", "MIXC", 10, "17823.912427905547", 17823),
    ("C2-11", SCOUT, 2, 1, "", "MIXC", 11, "17823.912427905547", 17823),
    ("C3-10", MIXTRAL, 2, 2, "deepep_high_throughput", "MIXC", 10, "11167.18971469613", 11167),
    ("C3-11", MIXTRAL, 2, 2, "deepep_high_throughput", "MIXC", 11, "11191.604320069264", 11191),
]


@pytest.mark.parametrize("row", C_ROWS, ids=[r[0] for r in C_ROWS])
def test_c_variants_coefficient_count(row: tuple) -> None:
    _, model, tp, dp, be, batch_name, n, s, step = row
    batch = MIXB if batch_name == "MIXB" else MIXC
    b = basis(model, H100, tp, dp, be)
    check(b.step_s(Q[:n], batch), s)
    assert b.step_time(Q[:n], batch) == step


@pytest.mark.parametrize("n", [7, 8, 9, 10, 11])
def test_d11_truncated(n: int) -> None:
    b = basis(LLAMA8B)
    if n <= 9:
        check(b.step_s(D11[:n], MIXB), "11429.19606345865")
        assert b.step_time(D11[:n], MIXB) == 11429
    else:
        assert b.step_time(D11[:n], MIXB) == 11497


# --------------------------------------------------------------------------- §10.4 E1–E5

E_ROWS = [
    ("E1", [BatchRequest(1024, 0, 256, 10)], "7407.9837819507793", 7407),
    ("E2", [BatchRequest(256, 0, 256, 10)], "7392.1361469479079", 7392),
    ("E3", [BatchRequest(100, 100, 0, 5)], "6842.5220796389513", 6842),
    ("E4", [BatchRequest(100, 100, 1, 0)], "6834.8276493469284", 6834),
]


@pytest.mark.parametrize("row", E_ROWS, ids=[r[0] for r in E_ROWS])
def test_edge_cases(row: tuple) -> None:
    _, batch, s, step = row
    b = basis(LLAMA8B)
    check(b.step_s(D11, batch), s)
    assert b.step_time(D11, batch) == step


def test_e1_e2_differ_only_by_attention() -> None:
    b = basis(LLAMA8B)
    d = b.terms(E_ROWS[0][1]) - b.terms(E_ROWS[1][1])
    assert d[TERM_INDEX["T_pf_compute"]] == pytest.approx(104.17, abs=0.01)
    assert not d[[i for i in range(11) if i != TERM_INDEX["T_pf_compute"]]].any()


def test_e4_neither_prefill_nor_decode() -> None:
    x = basis(LLAMA8B).terms(E_ROWS[3][1])
    nonzero = {n for n, i in TERM_INDEX.items() if x[i] != 0}
    assert nonzero == {"T_weight", "L", "B", "one"}


def test_e5_empty() -> None:
    assert basis(LLAMA8B).step_time(D11, []) == 1


# --------------------------------------------------------------------------- §6 timeline


def test_section6_timeline() -> None:
    tl = single_request_timeline(basis(LLAMA8B), D11, BLIS_DEFAULT_ALPHA, 256, 3)
    assert tl.enqueued_us == 15563
    assert tl.step_starts_us == (15563, 22955, 29809)
    assert tl.step_durations_us == (7392, 6854, 6854)
    check(tl.step_s[0], "7392.136146947908")
    check(tl.step_s[1], "6854.406546228611")
    check(tl.step_s[2], "6854.482728706749")
    assert tl.ttft_us == 23000
    assert tl.itls_us == (6899, 6899)
    assert tl.e2e_us == 37575
    assert tl.completion_us == 37575
    assert tl.mean_itl_us == 6899


def test_rep_helper() -> None:
    assert len(rep(3, 1, 0, 1, 0)) == 3
