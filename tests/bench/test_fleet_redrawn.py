"""``bench fleet``'s redrawn fleets: the same batches and noise under another truth."""

from __future__ import annotations

import numpy as np
import pytest

from bench.fleet import shifted_members
from coeffd.learners.fleet.members import MemberStats


def _member(key: str, beta: np.ndarray, seed: int) -> MemberStats:
    rng = np.random.default_rng(seed)
    x = rng.uniform(1.0, 10.0, size=(300, len(beta)))
    noise = rng.normal(0.0, 0.02, size=300)
    y = x @ beta * (1.0 + noise)  # relative noise, as a learner's rows
    w = 1.0 / y**2
    m = MemberStats(key, {"model": "m"}, (x * w[:, None]).T @ x, x.T @ (w * y), 300.0,
                    rows_x=x, rows_y=y)  # fmt: skip
    return m


def test_a_member_moved_to_another_truth_keeps_its_batches_and_its_noise() -> None:
    old = np.array([1.0, 2.0, 0.5])
    new = old * np.array([1.03, 0.97, 1.01])
    m = _member("c", old, 1)
    (same,) = shifted_members([m], {"c": old}, {"c": old})
    assert np.array_equal(same.beta_b, m.beta_b) and np.array_equal(same.rows_y, m.rows_y)
    (moved,) = shifted_members([m], {"c": old}, {"c": new})
    assert moved.rows_x is m.rows_x and np.array_equal(moved.beta_a, m.beta_a)  # same batches
    assert m.rows_y is not None and moved.rows_y is not None
    # its own least-squares fit moves by exactly the change of truth: same noise around it
    fit = np.linalg.solve(m.beta_a, m.beta_b)
    np.testing.assert_allclose(np.linalg.solve(moved.beta_a, moved.beta_b), fit + new - old)
    np.testing.assert_allclose(moved.rows_y - m.rows_y, m.rows_x @ (new - old))
    assert np.abs(fit - old).max() > 1e-4  # the noise is there to be kept


def test_a_negative_number_of_redraws_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.fleet import main

    with pytest.raises(SystemExit) as exc:
        main(["--draws", "-1"])
    assert exc.value.code == 2
    assert "--draws -1" in capsys.readouterr().err
