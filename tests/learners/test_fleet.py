"""The fleet model on a real simfleet fleet through the real decoder, joiner and learners."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.fleet import FleetPublisher
from coeffd.daemon.publish.snapshot import validate_for_blis
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.joiner import Joiner
from coeffd.learners.config import LearnersConfig
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.fleet.error import relatives_error
from coeffd.learners.fleet.members import MemberStats
from coeffd.learners.fleet.model import SOURCES, FleetModel, one_se_choice
from coeffd.learners.fleet.results import FLEET_ID
from coeffd.learners.registry import LearnerRegistry
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.observations import StepObservation
from coeffd.simfleet import SampleRates, run
from coeffd.simfleet.scenarios import FLEET_SHARED, fleet_shared_engine

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

HELD_OUT = ("llama8b-a100-tp1", "mixtral-h100-tp2")


@pytest.fixture(scope="module")
def learned() -> tuple[LearnerRegistry, dict[str, Any]]:
    """10 of the 12 fleet-shared configurations learned for 15 simulated seconds."""
    specs = [fleet_shared_engine(*row) for row in FLEET_SHARED if row[0] not in HELD_OUT]
    dec, joiner, reg = Decoder(), Joiner(), LearnerRegistry()

    def learn(observations: Any) -> None:
        # as the daemon's consumer does: each batch's step observations learned per
        # configuration in one vectorised call (the same computation as one by one,
        # tests/learners/test_registry_batch.py), requests one by one
        steps: dict[str, tuple[ServingConfig, list[StepObservation]]] = {}
        for o in observations:
            cfg = ServingConfig.from_resource(o.source)
            if isinstance(o, StepObservation):
                steps.setdefault(cfg.id, (cfg, []))[1].append(o)
            else:
                reg.learn(cfg, o)
        for cfg, batch in steps.values():
            reg.learn_steps(cfg, batch)

    res = run(
        specs,
        15.0,
        2,
        rates=SampleRates(1.0, 0.5, 0.0, 100),
        trace_sinks=[lambda req: learn(joiner.push_many(dec.decode(req).records))],
        drain_s=3.0,
    )
    learn(joiner.flush())
    for cid in reg.ids():
        reg.estimate(cid)  # feeds the pooled prior, as publishing does
    return reg, res.truth


def test_loco_beats_blis_defaults_on_every_configuration(learned) -> None:
    reg, truth = learned
    r = FleetModel.from_registry(reg).result()
    assert set(r.loco) == {c["config_id"] for c in truth["configurations"]}
    validate_for_blis(r.alpha, r.beta)
    for cid, row in r.loco.items():
        # the truth's shared part is learnable, BLIS's vector is off by 20-30 % here
        assert row["fleet"].mape < 0.5 * row["blis_default"].mape, cid
        assert row["fleet"].n >= 20
    assert r.best_source in SOURCES
    assert r.summary[r.best_source] == min(r.summary[s] for s in r.summary if s != "blis_default")


def test_chatty_configuration_does_not_drown_the_rest(learned) -> None:
    reg, _ = learned
    fm = FleetModel.from_registry(reg)
    members = list(fm.members.values())
    loud = members[0]
    # the same configuration heard 50× as much (50 engines): information and n_eff ×50
    chatty = MemberStats(
        key=loud.key,
        description=loud.description,
        beta_a=loud.beta_a * 50,
        beta_b=loud.beta_b * 50,
        beta_n=loud.beta_n * 50,
        rows_x=loud.rows_x,
        rows_y=loud.rows_y,
    )
    fm2 = FleetModel([chatty, *members[1:]])
    # capped at the median effective size: it counts as much as a typical configuration
    counted = {k: fm2.weights[k] * m.beta_n for k, m in fm2.members.items()}
    assert counted[loud.key] == pytest.approx(
        np.median(list(m.beta_n for m in fm2.members.values()))
    )
    assert counted[loud.key] <= max(v for k, v in counted.items() if k != loud.key) * 1.000001
    # unweighted, the loud configuration would have pulled the fleet toward itself
    a = fm.prior_a + sum(m.beta_a for m in (chatty, *members[1:]))
    b = fm.prior_b + sum(m.beta_b for m in (chatty, *members[1:]))
    from coeffd.learners.nnls import nnls_information

    raw = nnls_information(a, b)
    x, y = loud.rows_x, loud.rows_y
    assert x is not None and y is not None
    err_loud_raw = float(np.mean(np.abs(x @ raw - y) / y))
    err_loud_weighted = float(np.mean(np.abs(x @ fm2.fit_beta() - y) / y))
    assert err_loud_raw < err_loud_weighted  # it did pull: the weights are what stop it


def test_a_configuration_after_drift_counts_little(learned) -> None:
    reg, _ = learned
    fm = FleetModel.from_registry(reg)
    m = next(iter(fm.members.values()))
    # After a drift alarm a configuration publishes its fast tracker (memory 1/(1 − λ),
    # ~90 steps), whose statistics RLSRegressor.inflate(keep=0.01) has just scaled down:
    # the fleet sees the long-memory member's information scaled to that.
    fast_n = 1.0 / (1.0 - LearnersConfig().forgetting)
    keep = 0.01 * fast_n / m.beta_n
    drifted = MemberStats(
        m.key, m.description, m.beta_a * keep, m.beta_b * keep * 3, m.beta_n * keep
    )
    others = [x for x in fm.members.values() if x.key != m.key]
    fm2 = FleetModel([drifted, *others])
    # ×3 on its whole vector barely moves the fleet's predictions (individual coefficients
    # of a joint fit are collinear; predictions are what BLIS uses): it is weighted by the
    # little it has re-learned since the alarm
    without = FleetModel(others).fit_beta()
    moved = _prediction_shift(without, fm2.fit_beta(), fm)
    assert moved < 0.05
    # At full weight it moves them several times as much, but no more than a quirk allows
    # one configuration: without the quirk discount (learners.fleet.members, "Quirks") its ×3
    # would move them twice as far again.
    full = [MemberStats(m.key, m.description, m.beta_a, m.beta_b * 3, m.beta_n), *others]
    loud = _prediction_shift(without, FleetModel(full).fit_beta(), fm)
    plain = FleetModel(others, quirk=0.0).fit_beta()
    face_value = _prediction_shift(plain, FleetModel(full, quirk=0.0).fit_beta(), fm)
    assert loud > 3 * moved
    assert face_value > 2 * loud


def _prediction_shift(a: np.ndarray, b: np.ndarray, fm: FleetModel) -> float:
    """Mean relative difference of two vectors' step times over every member's rows."""
    out = []
    for m in fm.members.values():
        if m.rows_x is not None and m.rows_y is not None:
            out.append(float(np.mean(np.abs(m.rows_x @ (a - b)) / m.rows_y)))
    return float(np.mean(out))


def test_prediction_for_unseen_configuration(learned) -> None:
    reg, _ = learned
    fm = FleetModel.from_registry(reg)
    desc = ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2, max_num_batched_tokens=2048)
    p = fm.predict(desc.to_dict())
    assert desc.id not in fm.members
    validate_for_blis(p.alpha, p.beta)
    # the source with the lowest LOCO error on its relatives, or the factor model where
    # the relatives' paired LOCO differences put it within one standard error of that one
    kern = fm.kernel(desc.to_dict())
    rel = {s: relatives_error(fm.result().loco, s, kern) for s in SOURCES}
    best = min(rel, key=lambda s: rel[s][0])  # type: ignore[index]
    assert p.detail["loco_best"] == best
    if p.source != best:
        assert p.source == "fleet_factors"
        keys = list(fm.result().loco)
        w = np.array([kern[k] for k in keys])
        d = np.array(
            [fm.result().loco[k][p.source].mape - fm.result().loco[k][best].mape for k in keys]
        )
        excess = float(w @ d / w.sum())
        n_eff = float(w.sum() ** 2 / (w @ w))
        se = math.sqrt(float(w @ (d - excess) ** 2 / w.sum()) / max(n_eff - 1, 1))
        assert 0 <= excess <= se
    assert p.expected_error is not None and 0 < p.expected_error < 0.2
    # the similar configurations come first: same model or GPU/TP
    first = fm.members[p.similar[0]].description
    assert first["model"] == "mixtral-8x7b-v0.1" or (first["gpu"], first["tp"]) == ("H100", 2)


def test_one_se_choice_prefers_the_factor_model_only_within_noise() -> None:
    # paired differences with a known mean and standard deviation: ±sd around the mean
    n, sd = 10, 0.004
    base = np.linspace(0.02, 0.03, n)
    se = sd / math.sqrt(n - 1)  # equal weights: n_eff = n
    spread = sd * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    for excess, expected in ((0.9 * se, "fleet_factors"), (1.1 * se, "fleet_local")):
        errors = {
            "fleet_local": base,
            "fleet_factors": base + excess + spread,
            "fleet": base + 0.01,
        }
        assert one_se_choice(errors, np.ones(n)) == (expected, "fleet_local")
    # the weights count: a tie among light relatives does not outvote a heavy one
    w = np.ones(n)
    w[0] = 100.0
    errors = {
        "fleet_local": base,
        "fleet_factors": base + np.where(np.arange(n) == 0, 0.01, -0.001),
    }
    assert one_se_choice(errors, np.ones(n))[0] == "fleet_factors"
    assert one_se_choice(errors, w)[0] == "fleet_local"


def test_fleet_publisher_snapshot_store_and_metrics(learned, tmp_path) -> None:
    reg, truth = learned
    metrics = CollectorRegistry()
    store = SnapshotStore(tmp_path / "snaps", registry=metrics)
    pub = FleetPublisher(reg, metrics)
    snap = pub.tick(100.0, store)
    assert snap is not None and snap.config_id == FLEET_ID and snap.version == 1
    store.publish(snap)
    assert pub.tick(101.0, store) is None  # not due yet
    again = pub.tick(200.0, store)  # due, but unchanged and the heartbeat not due
    assert again is None
    latest = store.latest(FLEET_ID)
    assert latest is not None and latest.beta == snap.beta
    ids = {c["config_id"] for c in truth["configurations"]}
    assert set(latest.loco) == ids | {"mean"}
    assert latest.loco["mean"]["fleet"].mape < latest.loco["mean"]["blis_default"].mape
    assert sorted(latest.configuration.description["members"]) == sorted(ids)
    text = generate_latest(metrics).decode()
    found = {
        (s.labels["config"], s.labels["coefficients"]): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "coeffd_fleet_loco_error_ratio"
        for s in fam.samples
    }
    for cid in ids:
        assert math.isclose(found[(cid, "fleet")], latest.loco[cid]["fleet"].mape, rel_tol=1e-9)
    assert ("mean", "blis_default") in found


def test_no_fleet_snapshot_from_one_configuration(tmp_path) -> None:
    reg = LearnerRegistry()
    pub = FleetPublisher(reg)
    assert pub.tick(0.0, SnapshotStore(tmp_path)) is None
    assert pub.model is not None and len(pub.model) == 0
    p = pub.predict({"model": "m", "gpu": "H100", "tp": 1})
    assert p is not None and p.source == "blis_default" and p.expected_error is None


def test_vectorised_fits_equal_the_plain_sums(learned) -> None:
    reg, _ = learned
    fm = FleetModel.from_registry(reg, quirk=0.0)  # members' information as learned
    from coeffd.learners.nnls import nnls_information

    keys = list(fm.members)
    mult = {k: 0.1 * (i + 1) for i, k in enumerate(keys[1:])}  # first left out
    a = fm.prior_a + sum(fm.weights[k] * f * fm.members[k].beta_a for k, f in mult.items())
    b = fm.prior_b + sum(fm.weights[k] * f * fm.members[k].beta_b for k, f in mult.items())
    np.testing.assert_allclose(fm.fit_beta(mult), nnls_information(a, b), rtol=1e-6, atol=1e-9)
    descs = [m.description for m in fm.members.values()]
    plain = np.array([[fm.similarity(x, y) for y in descs] for x in descs])
    np.testing.assert_array_equal(fm._similarity_matrix(), plain)
    other = {**descs[0], "gpu": "H200", "tp": 8}
    np.testing.assert_array_equal(fm._similarities(other), [fm.similarity(other, y) for y in descs])


def test_bad_statistics_never_make_a_bad_vector() -> None:
    from coeffd.learners.features import BLIS_DEFAULT_BETA

    desc = {"model": "m", "gpu": "H100", "tp": 1}
    nan = MemberStats("nan", desc, np.full((11, 11), np.nan), np.full(11, np.nan), 10.0)
    # information that asks for hugely negative coefficients: NNLS pins them at 0
    neg = MemberStats("neg", {**desc, "gpu": "A100-80"}, np.eye(11), -1e3 * np.ones(11), 10.0)
    fm = FleetModel([nan, neg])
    assert fm.rejected == ("nan",) and list(fm.members) == ["neg"]
    beta = fm.result().beta
    validate_for_blis(fm.result().alpha, beta)
    # nothing but zeros could fit "neg": BLIS would refuse all zeros, so the defaults stand
    assert beta == tuple(BLIS_DEFAULT_BETA)
