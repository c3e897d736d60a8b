"""learners.merge: parallel learners of one configuration merge as one learner that saw
every row (information form), with the prior counted once."""

from __future__ import annotations

import numpy as np
import pytest

from coeffd.learners.config import LearnersConfig
from coeffd.learners.merge import MergeError, merge_learner_states, merge_set_states
from coeffd.learners.registry import LearnerRegistry
from coeffd.learners.rls import RLSRegressor
from tests.learners.test_registry import _cfg, _steps

FEATURES = [f"x{i}" for i in range(4)]
BETA = np.array([2.0, 0.5, 3.0, 1.0])


def _stream(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 10.0, (n, len(FEATURES)))
    y = x @ BETA * np.exp(rng.normal(0, 0.03, n))
    return x, y


def _fed(rows: list[tuple[np.ndarray, float]], **kw: object) -> RLSRegressor:
    m = RLSRegressor(features=FEATURES, prior_precision=1e-3, **kw)  # type: ignore[arg-type]
    for x, y in rows:
        m.learn_one(dict(zip(FEATURES, x, strict=True)), float(y))
    return m


def _rows(x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, float]]:
    return list(zip(x, y.tolist(), strict=True))


def _loaded(state: dict[str, object]) -> RLSRegressor:
    m = RLSRegressor([])
    m.load_state(state)
    return m


@pytest.mark.parametrize("seeds", [(1, 2), (3, 4, 5)])
def test_parallel_members_merge_as_one_learner_fed_every_row(seeds: tuple[int, ...]) -> None:
    streams = [_rows(*_stream(s, 400)) for s in seeds]
    members = [_fed(rows, forgetting=1.0).state_dict() for rows in streams]
    one = _fed([r for rows in streams for r in rows], forgetting=1.0)
    merged = _loaded(merge_learner_states(members))
    a1, b1 = merged.data_information()
    a2, b2 = one.data_information()
    # the statistics are sums: equal to float rounding of the summation order
    np.testing.assert_allclose(a1, a2, rtol=1e-9)
    np.testing.assert_allclose(b1, b2, rtol=1e-9)
    np.testing.assert_allclose(merged.coef, one.coef, rtol=1e-9)
    assert merged.n_learned == one.n_learned == 400 * len(seeds)
    # and it learned from more than either member: its information dominates each one's
    for state in members:
        a_member, _ = _loaded(state).data_information()
        assert np.all(np.linalg.eigvalsh(a1 - a_member) > -1e-9 * np.abs(a1).max())


def test_each_members_forgetting_is_kept_not_reapplied() -> None:
    x1, y1 = _stream(1, 300)
    x2, y2 = _stream(2, 300)
    m1, m2 = _fed(_rows(x1, y1), forgetting=0.99), _fed(_rows(x2, y2), forgetting=0.99)
    merged = _loaded(merge_learner_states([m1.state_dict(), m2.state_dict()]))
    a, b = merged.data_information()
    np.testing.assert_allclose(a, m1.data_information()[0] + m2.data_information()[0], rtol=1e-12)
    np.testing.assert_allclose(b, m1.data_information()[1] + m2.data_information()[1], rtol=1e-12)
    assert merged.n_effective == pytest.approx(m1.n_effective + m2.n_effective)


def test_members_with_other_features_or_forgetting_are_refused() -> None:
    x, y = _stream(1, 50)
    a = _fed(_rows(x, y), forgetting=1.0).state_dict()
    b = _fed(_rows(x, y), forgetting=0.99).state_dict()
    with pytest.raises(MergeError, match="forgetting"):
        merge_learner_states([a, b])
    with pytest.raises(MergeError, match="nothing"):
        merge_learner_states([])


def test_learner_sets_merge_and_publish_the_summed_estimate() -> None:
    """Two registries (two sidecars) of one configuration → one set whose β is the fit of
    the summed statistics; counts add, the reference's prior is kept once."""
    settings = LearnersConfig(forgetting=1.0, steady_forgetting=1.0)  # type: ignore[call-arg]
    cfg = _cfg()
    regs = [LearnerRegistry(settings) for _ in range(2)]
    for i, reg in enumerate(regs):
        for o in _steps(reg, cfg, 300, seed=10 + i):
            reg.learn(cfg, o)
    states = [reg.get(cfg.id).state_dict() for reg in regs]  # type: ignore[union-attr]
    merged = merge_set_states(states)
    assert merged["observations"] == sum(s["observations"] for s in states)
    assert merged["version"] == sum(s["version"] for s in states)
    view = LearnerRegistry(settings)
    view.load_state({"sets": {cfg.id: merged}})
    est = view.estimate(cfg.id)
    slow = view.get(cfg.id) or view.ensure(cfg)
    learner = slow.published_learner("beta")
    assert learner is not None
    a_sum = sum(np.asarray(s["learners"][k]["a"]) for s in states for k in ("beta_steady",))
    np.testing.assert_allclose(learner.data_information()[0], a_sum, rtol=1e-9)
    assert est.vectors["beta"].observations == sum(
        s["learners"]["beta_steady"]["n_learned"] for s in states
    )
    with pytest.raises(MergeError, match="different configurations"):
        merge_set_states([states[0], {**states[1], "config": {**states[1]["config"], "tp": 2}}])
