"""Feature rows of many step observations at once: what a learner set learns from a burst.

:func:`step_rows` gives the rows :func:`~features.observe.step_features` and
:func:`~features.extended.extended_terms` give one step at a time (equal to ~1e-15
relative: the terms of a batch are one matrix product over the batch's statistics
instead of one per step), with one pass over each step's requests for both. Why: the
learning consumer learns every step observation, and building two small arrays per
step (and testing each for finiteness) cost more than the learners' own updates.

>>> from coeffd.learners.features.config import BasisResolver, ServingConfig
>>> cfg = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100")
>>> x, xe = step_rows([], BasisResolver().basis(cfg), cfg, extended=True)
>>> x.shape, xe.shape
((0, 11), (0, 10))

(``tests/learners/features/test_rows.py`` compares them with the one-step functions.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from coeffd.learners.features.basis import N_TERMS, BlisBasis
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.features.extended import N_EXTENDED, extended_row
from coeffd.learners.features.observe import has_requests
from coeffd.records.observations import BatchRequest, StepObservation

__all__ = ["step_rows"]

FloatArray = npt.NDArray[np.float64]


def _stats_tokens(requests: Sequence[BatchRequest]) -> tuple[list[float], float, int]:
    """:func:`~features.basis.batch_stats` of a batch, and (tokens through the model,
    partial prefill chunks) as :func:`features.extended._tokens` counts them: one loop."""
    t_pf = 0
    a_pf = 0.0
    t_dc = 0
    ctx = 0
    tokens = 0
    chunks = 0
    for r in requests:
        p, n, t = r.progress, r.input_len, r.new_tokens
        if p < n:
            t_pf += t
            a_pf += t * (n + t / 2)
            tokens += t
            if p > 0 or p + t < n:
                chunks += 1
        else:
            tokens += t if t > 1 else 1
            if r.output_len > 0:
                t_dc += 1
                ctx += p
    return [float(t_pf), a_pf, float(t_dc), float(ctx), float(len(requests)), 1.0], tokens, chunks


def step_rows(
    steps: Sequence[StepObservation],
    basis: BlisBasis,
    config: ServingConfig,
    *,
    extended: bool,
) -> tuple[FloatArray, FloatArray | None]:
    """``(terms, extended columns)`` of ``steps``: row ``i`` is ``step_features`` and
    (with ``extended``) ``extended_terms`` of step ``i`` (NaN where it has none: a
    journey span of several batches); the second item is None without ``extended``."""
    n = len(steps)
    x = np.zeros((n, N_TERMS))
    stats: list[list[float]] = []
    exact: list[int] = []
    ext: list[list[float]] = []
    nan_row = [float("nan")] * N_EXTENDED
    for i, obs in enumerate(steps):
        reqs = obs.requests
        if reqs:
            s, tokens, chunks = _stats_tokens(reqs)
        else:
            s, tokens, chunks = [], float(obs.aggregates.scheduled_tokens), 0
        if has_requests(obs):
            for batch in obs.more_batches:
                if batch:  # an empty batch has no terms (not even its constant)
                    s = [u + v for u, v in zip(s, _stats_tokens(batch)[0], strict=True)]
            stats.append(s)
            exact.append(i)
        else:
            x[i] = basis.terms_from_aggregates(obs.aggregates, block_size=config.block_size)
        if extended:
            more = bool(obs.more_batches)
            ext.append(nan_row if more else extended_row(obs, basis, config, tokens, chunks))
    if exact:
        x[exact] = basis.terms_many(np.array(stats))
    return x, (np.array(ext, dtype=np.float64).reshape(n, N_EXTENDED) if extended else None)
