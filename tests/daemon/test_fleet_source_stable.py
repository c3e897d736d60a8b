"""The same unseen-setup query keeps its source across fleet refits (issue 33, item 3):
two refits on slightly different data, whose LOCO errors put ``fleet_factors`` just inside
and then just outside the one-standard-error band, answer from the same source."""

from __future__ import annotations

import dataclasses

import numpy as np

from coeffd.daemon.fleet import FleetPublisher
from coeffd.learners.features import BLIS_DEFAULT_BETA, MODELS, BlisBasis, load_hardware
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.fleet.members import MemberStats
from coeffd.learners.fleet.model import FleetModel, paired_excess
from coeffd.learners.fleet.results import LocoError
from coeffd.learners.registry import LearnerRegistry
from tests.support.synthetic_steps import synth_steps

KNOWN = [
    ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=1),
    ServingConfig(model="llama-3.1-8b-instruct", gpu="A100-80", tp=2),
    ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2),
    ServingConfig(model="qwen3-30b-a3b", gpu="A100-80", tp=1),
    ServingConfig(model="qwen3-14b", gpu="H100", tp=1),
]
UNSEEN = ServingConfig(model="mixtral-8x7b-v0.1", gpu="A100-80", tp=4).to_dict()
TRUE_BETA = np.array(BLIS_DEFAULT_BETA) * 0.8


def _model(seed: int) -> FleetModel:
    members = []
    for i, cfg in enumerate(KNOWN):
        basis = BlisBasis(MODELS[cfg.model], load_hardware(cfg.gpu), cfg.tp)
        s = synth_steps(basis, TRUE_BETA, 200, sigma=0.02, seed=seed * 10 + i)
        w = 1.0 / s.y**2
        members.append(
            MemberStats(
                key=cfg.id,
                description=cfg.to_dict(),
                beta_a=(s.x * w[:, None]).T @ s.x,
                beta_b=s.x.T @ (w * s.y),
                beta_n=200.0,
                rows_x=s.x,
                rows_y=s.y,
            )
        )
    return FleetModel(members)


def _with_loco(model: FleetModel, band: float) -> FleetModel:
    """``model`` whose LOCO puts ``fleet_factors`` ``band`` standard errors (kernel-weighted
    for UNSEEN) behind ``fleet_local``, every other source far behind."""
    kern = model.kernel(UNSEEN)
    keys = list(model.members)
    w = np.array([kern[k] for k in keys])
    local = np.linspace(0.03, 0.05, len(keys))
    noise = np.array([0.004, -0.003, 0.005, -0.004, 0.002])
    excess, se = paired_excess(local + noise, local, w)
    # shift so the weighted mean excess is exactly band × its standard error (se fixed)
    factors = local + noise - excess + band * se
    loco = {
        k: {
            "fleet": LocoError(0.5, 200),
            "fleet_local": LocoError(float(local[i]), 200),
            "fleet_factors": LocoError(float(factors[i]), 200),
            "blis_default": LocoError(0.9, 200),
        }
        for i, k in enumerate(keys)
    }
    summary = {s: float(np.mean([r[s].mape for r in loco.values()])) for s in loco[keys[0]]}
    model._result = dataclasses.replace(model.result(), loco=loco, summary=summary)
    return model


def test_a_refit_on_slightly_different_data_keeps_the_source() -> None:
    first, second = _with_loco(_model(1), 0.6), _with_loco(_model(2), 1.4)
    # each refit on its own: the one-SE rule flips between them
    assert first.predict(UNSEEN).source == "fleet_factors"
    assert second.predict(UNSEEN).source == "fleet_local"
    pub = FleetPublisher(LearnerRegistry())
    pub.model = first
    assert pub.predict(UNSEEN).source == "fleet_factors"  # type: ignore[union-attr]
    pub.model = second  # the next refit, a few seconds later
    again = pub.predict(UNSEEN)
    assert again is not None and again.source == "fleet_factors"
    # clearly worse (beyond the wider band): it does move
    pub.model = _with_loco(_model(3), 3.0)
    moved = pub.predict(UNSEEN)
    assert moved is not None and moved.source == "fleet_local"
