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
from coeffd.learners.features.extended import N_EXTENDED, extended_plan
from coeffd.records.observations import BatchRequest, Composition, StepObservation

__all__ = ["step_rows"]

FloatArray = npt.NDArray[np.float64]


def _stats_tokens(requests: Sequence[BatchRequest]) -> tuple[list[float], float, int]:
    """:func:`~features.basis.batch_stats` of a batch, and (tokens through the model,
    partial prefill chunks) as :func:`features.extended._tokens` counts them: one loop.
    :func:`step_rows` writes the same loop out for a step's first batch and calls this for
    the further batches of a journey span (rare), so the two must stay the same sums."""
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
    # Why it is written out: at ~12 requests a step, a call, a list and an array per step
    # cost as much as the arithmetic; the statistics of :func:`_stats_tokens` are summed
    # here in the same order (the float ones; integer sums are exact in any order), and
    # the arrays are made once per burst from flat lists.
    flat: list[float] = []  # the six statistics of each exact row, one row after another
    exact: list[int] = []
    approx: list[int] = []
    ext: list[float] = []
    plan = extended_plan(basis, config) if extended else None
    budget = None if plan is None else plan.budget
    comm = plan is not None and plan.comm
    nan_row = (float("nan"),) * N_EXTENDED
    no_tail = (0.0, 0.0, 0.0, 0.0)
    aggregates_only = Composition.AGGREGATES
    for i, obs in enumerate(steps):
        reqs = obs.requests
        chunks = 0
        if reqs:
            t_pf = 0
            a_pf = 0.0
            t_dc = 0
            ctx = 0
            dc_tokens = 0
            for r in reqs:
                p = r.progress
                m = r.input_len
                t = r.new_tokens
                if p < m:
                    t_pf += t
                    a_pf += t * (m + t / 2)
                    if p > 0 or p + t < m:
                        chunks += 1
                else:
                    dc_tokens += t if t > 1 else 1
                    if r.output_len > 0:
                        t_dc += 1
                        ctx += p
            tokens: float = t_pf + dc_tokens
            if obs.composition is not aggregates_only:  # has_requests
                s = [float(t_pf), a_pf, float(t_dc), float(ctx), float(len(reqs)), 1.0]
                for batch in obs.more_batches:
                    if batch:  # an empty batch has no terms (not even its constant)
                        s = [u + v for u, v in zip(s, _stats_tokens(batch)[0], strict=True)]
                flat += s
                exact.append(i)
            else:
                approx.append(i)
        else:
            tokens = float(obs.aggregates.scheduled_tokens)
            approx.append(i)
        if plan is not None:
            if obs.more_batches:
                ext += nan_row
                continue
            agg = obs.aggregates
            total = agg.kv_blocks_total_gpu
            # the first six columns of extended_row, same operands
            ext += (
                float(agg.kv_usage_gpu_ratio),
                agg.kv_blocks_free_gpu / total if total > 0 else 0.0,
                float(agg.num_preempted),
                float(agg.waiting_depth),
                float(chunks),
                agg.scheduled_tokens / budget if budget else 0.0,
            )
            ext += plan.tail(obs, tokens) if comm or obs.kv_transfers else no_tail
    m_exact = len(exact)
    if m_exact:
        terms = basis.terms_many(np.fromiter(flat, np.float64, 6 * m_exact).reshape(m_exact, 6))
        if m_exact == n:
            x = terms
        else:
            x = np.zeros((n, N_TERMS))
            x[exact] = terms
    else:
        x = np.zeros((n, N_TERMS))
    for i in approx:
        x[i] = basis.terms_from_aggregates(steps[i].aggregates, block_size=config.block_size)
    if plan is None:
        return x, None
    return x, np.fromiter(ext, np.float64, n * N_EXTENDED).reshape(n, N_EXTENDED)
