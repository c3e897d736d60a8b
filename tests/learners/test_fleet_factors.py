"""The ``fleet_factors`` candidate on a synthetic fleet whose truth is shared vector ×
per-GPU × per-family × per-TP factors (real basis, real model and GPU sheets)."""

from __future__ import annotations

import numpy as np
import pytest

from coeffd.daemon.publish.snapshot import validate_for_blis
from coeffd.learners.features import BLIS_DEFAULT_BETA, MODELS, BlisBasis, load_hardware
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.fleet.factors import STRENGTHS
from coeffd.learners.fleet.members import MemberStats
from coeffd.learners.fleet.model import SOURCES, FleetModel
from coeffd.learners.targets import ALPHA_TARGETS
from tests.support.synthetic_steps import synth_steps

SIGMA = 0.02  # relative step-time noise of every synthetic row
ROWS = 400
BASE = np.array(BLIS_DEFAULT_BETA) * 0.8 + np.array([0, 0.3] + [0] * 6 + [0.5, 0, 0])
# Each factor moves its own terms, so the truth is exactly "shared + offsets" (a product of
# factors touching the same term would be so only to first order).
GPU = {"H100": {}, "A100-80": {0: 1.15, 1: 1.15, 2: 1.15, 9: 1.15}}  # compute, weights, KV
FAMILY = {"llama": {}, "qwen": {4: 1.10, 5: 1.10}}  # per layer, per request
TP = {1: {}, 2: {3: 1.30, 6: 1.10}}  # all-reduce, per step
KNOWN = [
    ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=1),
    ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=2),
    ServingConfig(model="llama-3.1-8b-instruct", gpu="A100-80", tp=1),
    ServingConfig(model="qwen2.5-7b-instruct", gpu="H100", tp=1),
    ServingConfig(model="qwen2.5-7b-instruct", gpu="A100-80", tp=1),
    ServingConfig(model="qwen3-14b", gpu="H100", tp=2),
]
# A100 is known only at TP 1, TP 2 only on H100: the combination is new
HELD_OUT = ServingConfig(model="llama-3.1-8b-instruct", gpu="A100-80", tp=2)


def true_beta(cfg: ServingConfig) -> np.ndarray:
    fam = "qwen" if cfg.model.startswith("qwen") else "llama"
    out = BASE.copy()
    for table, key in ((GPU, cfg.gpu), (FAMILY, fam), (TP, cfg.tp)):
        for i, f in table[key].items():  # type: ignore[attr-defined]
            out[i] *= f
    return out


def member(
    cfg: ServingConfig, seed: int, beta: np.ndarray | None = None
) -> tuple[MemberStats, np.ndarray]:
    """Statistics as a learner keeps them (relative-error weights) and the noiseless rows'
    step times, under ``beta`` (default: the configuration's :func:`true_beta`)."""
    basis = BlisBasis(MODELS[cfg.model], load_hardware(cfg.gpu), cfg.tp)
    beta = true_beta(cfg) if beta is None else beta
    s = synth_steps(basis, beta, ROWS, sigma=SIGMA, stall_rate=0.0, seed=seed)
    w = 1.0 / s.y**2
    m = MemberStats(
        key=cfg.id,
        description=cfg.to_dict(),
        beta_a=(s.x * w[:, None]).T @ s.x,
        beta_b=s.x.T @ (w * s.y),
        beta_n=float(ROWS),
        alpha_a=(1.0, 1.0, 1.0),
        alpha_b=(1.0, 1.0, 1.0),
        alpha_n=(float(ROWS),) * 3,
        rows_x=s.x,
        rows_y=s.y,
    )
    return m, s.mean


@pytest.fixture(scope="module")
def fleet() -> tuple[FleetModel, MemberStats, np.ndarray]:
    members = [member(c, i)[0] for i, c in enumerate(KNOWN)]
    held, mean = member(HELD_OUT, 99)
    return FleetModel(members, quirk=0.0), held, mean  # the truth has no quirks


def _error(beta: np.ndarray, m: MemberStats, mean: np.ndarray) -> float:
    assert m.rows_x is not None
    return float(np.mean(np.abs(m.rows_x @ beta - mean) / mean))


def test_factors_beat_the_fleet_vector_on_an_unseen_combination(fleet) -> None:
    fm, held, mean = fleet
    desc = held.description
    factors = fm.candidate_beta("fleet_factors", desc)
    plain = fm.candidate_beta("fleet", desc)
    validate_for_blis(fm.factors().alpha(desc), factors)
    err_f, err_p = _error(factors, held, mean), _error(plain, held, mean)
    # The stacked fit estimates a step time to ~σ·√(unknowns / rows) = 0.02·√(110 / 2400)
    # ≈ 0.4 %, plus what the ridge shrinks off the offsets; half the row noise bounds
    # both. One vector for every configuration cannot express a 15 % A100 and a 30 % TP-2
    # effect, so it is off by several times that.
    assert err_f < SIGMA / 2
    assert err_p > 3 * err_f
    # and by LOCO too, the candidate the fleet would score best
    r = fm.result()
    assert r.summary["fleet_factors"] < r.summary["fleet"]
    assert r.factor_strengths["beta"] in STRENGTHS
    assert set(r.factor_alpha_from) == set(ALPHA_TARGETS)
    assert set(r.factor_alpha_from.values()) <= {"factors", "kernel"}


def test_predict_uses_the_factors_and_states_an_honest_error(fleet) -> None:
    fm, held, _ = fleet
    p = fm.predict(held.description)
    assert "fleet_factors" in SOURCES
    assert p.source == "fleet_factors"
    assert p.expected_error is not None
    actual = float(np.mean(np.abs(held.rows_x @ np.array(p.beta) - held.rows_y) / held.rows_y))
    # stated: the relatives' LOCO errors, which include the rows' noise: the mean absolute
    # value of a relative error σ·z is σ·√(2/π) ≈ 0.8 σ (0.9 of it: sampling of 400 rows)
    assert p.expected_error > 0.9 * SIGMA * (2 / np.pi) ** 0.5
    assert actual < 1.5 * p.expected_error
    # every α target: one shared value + offsets (all members measured 1.0 here)
    assert np.allclose(p.alpha, 1.0, rtol=1e-3)


def test_leave_one_out_shortcut_equals_a_refit(fleet) -> None:
    fm, _, _ = fleet
    fit = fm.factors().beta_fit
    for lam in (STRENGTHS[0], STRENGTHS[-1]):
        fast = fit.loco(lam)
        for k, m in enumerate(fm.members.values()):
            slow = fit.predict(fit.without(k, lam), m.description)
            # the same step times (a coefficient near 0 may differ in its 6th digit)
            np.testing.assert_allclose(m.rows_x @ fast[k], m.rows_x @ slow, rtol=1e-7)


def _steps(cfg: ServingConfig, beta: np.ndarray, seed: int):  # type: ignore[no-untyped-def]
    basis = BlisBasis(MODELS[cfg.model], load_hardware(cfg.gpu), cfg.tp)
    return synth_steps(basis, beta, ROWS, sigma=SIGMA, stall_rate=0.0, seed=seed)


def test_a_level_seen_once_passes_on_less_of_its_idiosyncrasy_the_stronger_the_ridge() -> None:
    # one Mistral whose weight streaming is 10 % off its structure (its idiosyncrasy)
    odd = ServingConfig(model="mistral-nemo-instruct-2407", gpu="H100", tp=1)
    beta = true_beta(odd)
    beta[2] *= 1.1
    s = _steps(odd, beta, 7)
    w = 1.0 / s.y**2
    m = MemberStats(
        odd.id, odd.to_dict(), (s.x * w[:, None]).T @ s.x, s.x.T @ (w * s.y), float(ROWS)
    )
    fit = FleetModel([*[member(c, i)[0] for i, c in enumerate(KNOWN)], m]).factors().beta_fit
    # another Mistral: how much of that 10 % reaches its prediction (share of step time)
    other = ServingConfig(model="mistral-nemo-instruct-2407", gpu="A100-80", tp=2)
    structure = true_beta(other)
    idiosyncratic = structure.copy()
    idiosyncratic[2] *= 1.1
    s2 = _steps(other, structure, 8)
    full = np.mean(s2.x @ (idiosyncratic - structure) / s2.mean)
    passed = [
        float(np.mean(s2.x @ (fit.predict(fit.solve(lam), other.to_dict()) - structure) / s2.mean))
        / full
        for lam in STRENGTHS[:3]
    ]
    assert 1.0 > passed[0] > passed[1] > passed[2]
    assert passed[2] < 0.5 * passed[0]


def test_unknown_levels_contribute_nothing(fleet) -> None:
    fm, _, _ = fleet
    fit = fm.factors().beta_fit
    phi = fit.solve(0.1)
    shared = phi[: fit.d]
    # H200, a new family and TP 8: the shared vector alone
    np.testing.assert_array_equal(
        fit.predict(phi, {"model": "yi-34b", "gpu": "H200", "tp": 8}), shared
    )
    beta = fm.candidate_beta("fleet_factors", {"model": "yi-34b", "gpu": "H200", "tp": 8})
    assert np.all(beta >= 0)
