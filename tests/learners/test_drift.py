"""Drift detection: silent on stationary streams, bounded delay on a step change."""

from __future__ import annotations

import numpy as np
import pytest

from coeffd.learners.drift import DriftMonitor
from coeffd.learners.features import (
    BLIS_DEFAULT_BETA,
    TERM_NAMES,
    BlisBasis,
    load_hardware,
    load_model,
)
from coeffd.learners.prior import prior_precision
from coeffd.learners.rls import RLSRegressor
from tests.support.synthetic_steps import TRUE_BETA, synth_steps


@pytest.fixture(scope="module")
def basis() -> BlisBasis:
    return BlisBasis(load_model("llama-3.1-8b-instruct"), load_hardware("H100"), tp=1)


def _learner(detector: str = "adwin") -> RLSRegressor:
    d0 = np.asarray(BLIS_DEFAULT_BETA)
    return RLSRegressor(
        TERM_NAMES,
        forgetting=0.99,
        prior_mean=d0,
        prior_precision=prior_precision(d0, 0.01),
        weighting="relative",
        huber=3.0,
        drift=DriftMonitor(detector),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_stationary_stream(basis: BlisBasis, seed: int) -> None:
    s = synth_steps(basis, TRUE_BETA, 20_000, seed=seed)  # includes 0.3 % stalls
    m = _learner()
    m.learn_many(s.x, s.y)
    assert m.drift is not None and m.drift.detections == 0


def test_alarm_within_bounded_delay_and_recovery(basis: BlisBasis) -> None:
    after = np.asarray(TRUE_BETA) * np.array([1.3, 1, 1.1, 1, 1, 1, 1, 1, 1, 1.25, 1])
    s = synth_steps(basis, TRUE_BETA, 6000, seed=5, change_at=3000, beta_after=after)
    m = _learner()
    m.learn_many(s.x[:3000], s.y[:3000])
    before = m.nonnegative_coef()
    m.learn_many(s.x[3000:], s.y[3000:])
    assert m.drift is not None
    hist = m.drift.history
    assert m.drift.detections >= 1
    assert 3000 <= hist[0]["n"] <= 3000 + 150  # bounded delay, recorded with the row index
    # After the alarm the learner follows the new truth on the big terms.
    after_coef = m.nonnegative_coef()
    for i in (0, 9):
        assert abs(after_coef[i] / after[i] - 1) < 0.05
        assert abs(before[i] / TRUE_BETA[i] - 1) < 0.05


def test_page_hinkley_selectable() -> None:
    rng = np.random.default_rng(3)
    mon = DriftMonitor("page_hinkley", grace=50)
    assert not any(mon.update(float(v), i) for i, v in enumerate(rng.normal(0, 1, 2000)))
    shifted = [mon.update(float(v), 2000 + i) for i, v in enumerate(rng.normal(3, 1, 500))]
    assert any(shifted)
    assert mon.history[0]["detector"] == "page_hinkley"


def test_monitor_state_round_trip() -> None:
    mon = DriftMonitor(keep=0.05, fast_for=10)
    mon.detections = 2
    mon.history = []
    back = DriftMonitor()
    back.load_state(mon.state_dict())
    assert back.state_dict() == mon.state_dict()
    with pytest.raises(ValueError):
        DriftMonitor("nope")  # type: ignore[arg-type]


def test_inflation_keeps_estimate_but_drops_confidence() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(0.5, 2, (500, 3))
    y = x @ np.array([1.0, 2.0, 3.0])
    m = RLSRegressor(["a", "b", "c"], forgetting=0.99, prior_precision=1e-3)
    m.learn_many(x, y)
    theta, std_a = m.coef, np.diag(np.linalg.inv(m.information()[0]))
    m.inflate(0.01)
    np.testing.assert_allclose(m.coef, theta, rtol=1e-9)
    assert np.all(np.diag(np.linalg.inv(m.information()[0])) > 10 * std_a)


def test_daemon_does_not_import_scipy_stats() -> None:
    """River's drift package __init__ pulls scipy.stats (~70 MB RSS) through KSWIN; the
    daemon loads only the detectors it uses, and they are River's own, working classes."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import coeffd.daemon.commands.serve\n"
        "from coeffd.learners.drift import DriftMonitor\n"
        "m = DriftMonitor('adwin', grace=0)\n"
        "hits = [m.update(0.0 if i < 500 else 3.0, i) for i in range(1000)]\n"
        "assert any(hits), 'ADWIN missed a 3-sigma shift'\n"
        "DriftMonitor('page_hinkley')\n"
        "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))\n"
        "import river.drift\n"  # a later ordinary import still works and is whole
        "print(river.drift.KSWIN.__name__, river.drift.ADWIN.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[-2:] == ["[]", "KSWIN river.drift.adwin"]  # (before them: the drift log line)
