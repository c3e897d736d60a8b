"""features.rows: the terms of many steps at once are the one-step functions' terms."""

from __future__ import annotations

import msgspec
import numpy as np

from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.features.extended import extended_terms
from coeffd.learners.features.observe import has_requests, have_requests, step_features
from coeffd.learners.features.rows import step_rows
from coeffd.learners.linalg import spd_solve
from coeffd.records.observations import Composition, KVTransferObservation, StepObservation
from coeffd.simfleet import SampleRates
from tests.support.simfleet_obs import simfleet_observations


def _steps(seconds: float = 6.0) -> list[StepObservation]:
    obs = simfleet_observations(seconds, 5, SampleRates(1.0, 1.0, 0.05, 100))
    return [o for o in obs if isinstance(o, StepObservation)]


def test_step_rows_equal_the_one_step_terms() -> None:
    steps = _steps()
    assert len(steps) > 150
    cfg = ServingConfig.from_resource(steps[0].source)
    basis = BasisResolver().basis(cfg)
    # every kind of row: exact, summary-only, a journey span of two batches, an empty one
    two = msgspec.structs.replace(steps[10], more_batches=(steps[11].requests, ()))
    summary = msgspec.structs.replace(steps[12], composition=Composition.AGGREGATES)
    bare = msgspec.structs.replace(steps[13], requests=(), composition=Composition.AGGREGATES)
    rows = [*steps, two, summary, bare]
    x, xe = step_rows(rows, basis, cfg, extended=True)
    assert xe is not None
    want = np.array([step_features(o, basis, block_size=cfg.block_size) for o in rows])
    want_e = np.array([extended_terms(o, basis, cfg) for o in rows])
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-9)
    np.testing.assert_array_equal(np.isnan(xe), np.isnan(want_e))
    # bit for bit: step_rows writes out extended_row's columns with the same operands
    assert np.array_equal(xe, want_e, equal_nan=True)
    assert np.isnan(xe[-3]).all() and not np.isnan(xe[:-3]).any()
    x_only, none = step_rows(rows, basis, cfg, extended=False)
    assert none is None and np.array_equal(x_only, x)


def test_extended_columns_of_a_tp_ep_moe_config_with_offload_are_the_one_step_ones() -> None:
    # every column of the per-configuration plan: TP all-reduce, EP dispatch, KV offload
    steps = _steps(3.0)
    cfg = ServingConfig(
        model="qwen3-30b-a3b", gpu="H100", tp=2, dp=2, ep=True, max_num_batched_tokens=4096
    )
    basis = BasisResolver().basis(cfg)
    moved = [
        msgspec.structs.replace(
            o,
            kv_transfers=(
                KVTransferObservation(o.source, 0, 1, True, 7, 10.0, o.step),
                KVTransferObservation(o.source, 0, 2, False, 3, 10.0, o.step),
                KVTransferObservation(o.source, 0, 3, True, 5, 10.0, o.step),
            ),
        )
        for o in steps[:20]
    ]
    rows = [*moved, *steps[20:]]
    _, xe = step_rows(rows, basis, cfg, extended=True)
    want_e = np.array([extended_terms(o, basis, cfg) for o in rows])
    assert xe is not None and np.array_equal(xe, want_e)
    assert (xe[:20, 6:8] > 0).all() and (xe[:, 8:] > 0).any(axis=0).all()


def test_have_requests_is_has_requests_of_each() -> None:
    steps = _steps(3.0)
    mixed = [
        *steps[:5],
        msgspec.structs.replace(steps[5], composition=Composition.AGGREGATES),
        msgspec.structs.replace(steps[6], requests=()),
    ]
    assert have_requests(mixed) == [has_requests(o) for o in mixed]
    assert have_requests(mixed)[-2:] == [False, False]


def test_spd_solve_is_numpy_linalg_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for d in (1, 4, 11, 21):
        m = rng.normal(size=(3 * d, d))
        a, b = m.T @ m + 1e-3 * np.eye(d), rng.normal(size=d)
        c = np.linalg.cholesky(a)
        got = spd_solve(a, b)
        assert got is not None
        assert np.array_equal(got, np.linalg.solve(c.T, np.linalg.solve(c, b)))
    assert spd_solve(-np.eye(3), np.ones(3)) is None
