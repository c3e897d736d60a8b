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

import msgspec
import numpy as np
import numpy.typing as npt

from learners.features.basis import BlisBasis
from learners.features.model import ModelSpec
from receivers.observations import Composition, KVTransferObservation, StepObservation

__all__ = ["fill_transfer_bytes", "kv_bytes_per_block", "step_features"]


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
    if obs.requests and obs.composition is not Composition.AGGREGATES:
        return basis.fast_terms(obs.requests)
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

    >>> from learners.features.catalog import load_model
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
