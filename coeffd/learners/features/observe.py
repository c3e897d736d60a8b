"""Glue from joiner observations to feature vectors.

:func:`step_features` picks the best composition a step offers: per-request batches
(``SNAPSHOTS`` / ``JOURNEYS``) go through the linear fast path of :class:`BlisBasis`
(equal to the bit-exact terms to ~1e-15 relative); ``AGGREGATES`` steps fall back to
:meth:`BlisBasis.terms_from_aggregates`.

KV offload transfers carry block counts; :func:`kv_bytes_per_block` turns them into bytes
with vLLM's real KV layout (not BLIS's 2-bytes-per-element convention).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from coeffd.learners.features.basis import BlisBasis
from coeffd.learners.features.model import ModelSpec
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    KVTransferObservation,
    StepAggregates,
    StepObservation,
)

__all__ = [
    "aggregates_from_requests",
    "fill_transfer_bytes",
    "has_requests",
    "have_requests",
    "kv_bytes_per_block",
    "step_features",
]


def has_requests(obs: StepObservation) -> bool:
    """Whether a step comes with its per-request composition (its terms are exact), not
    only the BATCH_SUMMARY totals (its terms are estimated)."""
    return bool(obs.requests) and obs.composition is not Composition.AGGREGATES


def have_requests(steps: Sequence[StepObservation]) -> list[bool]:
    """:func:`has_requests` of each step, without a call per step (a learner set asks it of
    every step observation it learns; the calls cost four times the tests)."""
    aggregates_only = Composition.AGGREGATES
    return [bool(obs.requests) and obs.composition is not aggregates_only for obs in steps]


def step_features(
    obs: StepObservation,
    basis: BlisBasis,
    *,
    block_size: int = 16,
    context_tokens: float | None = None,
) -> npt.NDArray[np.float64]:
    """The eleven split-form BLIS terms of one step observation (µs / counts).

    Per-request compositions use the requests; ``AGGREGATES`` (or a per-request
    composition that arrived without requests) uses the BATCH_SUMMARY approximation, with
    decode context from KV blocks in use × ``block_size`` unless ``context_tokens`` is given.
    """
    if has_requests(obs):
        x = basis.fast_terms(obs.requests)
        # a journey-pinned span: its period is the sum of its batches' periods, and the
        # step time is linear in the terms, so the terms add up too
        for batch in obs.more_batches:
            x = x + basis.fast_terms(batch)
        return x
    return basis.terms_from_aggregates(
        obs.aggregates, context_tokens=context_tokens, block_size=block_size
    )


def kv_bytes_per_block(
    model: ModelSpec,
    block_size: int = 16,
    *,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    per_rank: bool = False,
) -> float:
    """Bytes of one KV block, all layers, in vLLM's layout.

    ``per_rank=False`` (default) is the logical block (all KV heads), which is what a KV
    transfer observation counts once; ``per_rank=True`` is what one TP rank holds and moves
    over its own host link: ``H_kv/tp`` heads, at least one (vLLM replicates KV heads when
    ``tp > H_kv``). MLA latents are not sharded by TP.

    >>> from coeffd.learners.features.catalog import load_model
    >>> kv_bytes_per_block(load_model("llama-3.1-8b-instruct"))   # 16 · 32 · 2 · 8 · 128 · 2
    2097152.0
    >>> kv_bytes_per_block(load_model("llama-3.1-8b-instruct"), tp=2, per_rank=True)
    1048576.0
    """
    total = block_size * model.kv_bytes_per_token_vllm(kv_cache_dtype)
    if not per_rank or tp <= 1 or model.kv_lora_rank > 0:
        return float(total)
    heads_per_rank = max(1, math.ceil(model.num_kv_heads / tp))
    return float(total) * heads_per_rank / model.num_kv_heads


def fill_transfer_bytes(
    obs: KVTransferObservation,
    model: ModelSpec,
    block_size: int = 16,
    *,
    kv_cache_dtype: str = "auto",
) -> KVTransferObservation:
    """A copy of a transfer observation with ``bytes`` filled from the block count."""
    if obs.bytes is not None:
        return obs
    per_block = kv_bytes_per_block(model, block_size, kv_cache_dtype=kv_cache_dtype)
    return msgspec.structs.replace(obs, bytes=obs.block_count * per_block)


def aggregates_from_requests(
    requests: Sequence[BatchRequest],
    *,
    kv_blocks_total: int = 100_000,
    block_size: int = 16,
    waiting_depth: int = 0,
) -> StepAggregates:
    """The BATCH_SUMMARY totals vLLM would report for a scheduled batch (no prefix sharing).

    Blocks in use are those the scheduled requests hold after this step's allocation,
    ``⌈(p + t)/block_size⌉`` each. Used to measure the aggregate approximation against the
    exact per-request terms (tests, ``python -m bench basis``).
    """
    n_pf = t_pf = n_dc = t_dc = used = 0
    for r in requests:
        if r.progress < r.input_len:
            n_pf += 1
            t_pf += r.new_tokens
        else:
            n_dc += 1
            t_dc += max(1, r.new_tokens)
        used += -(-(r.progress + max(1, r.new_tokens)) // block_size)
    free = max(0, kv_blocks_total - used)
    return StepAggregates(
        num_prefill_reqs=n_pf,
        prefill_tokens=t_pf,
        num_decode_reqs=n_dc,
        decode_tokens=t_dc,
        scheduled_tokens=t_pf + t_dc,
        running_depth=len(requests),
        waiting_depth=waiting_depth,
        num_preempted=0,
        num_finished=0,
        kv_usage_gpu_ratio=1 - free / kv_blocks_total,
        kv_blocks_total_gpu=kv_blocks_total,
        kv_blocks_free_gpu=free,
    )
