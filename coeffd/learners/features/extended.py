"""Extended step features: what BLIS's basis cannot see.

The extended learner regresses the step period on the eleven BLIS terms *plus* these
columns, and its predictions are reported beside the BLIS-basis learner's so the gain of
each effect is visible. Every column is a physical quantity (µs where it is a time), so a
fitted coefficient near 1 means "the roofline estimate is right":

==========================  =============================================================
column                      meaning
==========================  =============================================================
``kv_usage``                GPU KV-cache usage ratio at the step (pressure → eviction work)
``kv_free_frac``            free GPU blocks / total (evictable cached blocks count free)
``preempted``               requests preempted in this step (recompute, scheduler churn)
``waiting_depth``           waiting-queue length (scheduler scan cost)
``prefill_chunks``          prefill requests scheduled as a partial chunk this step
``budget_fill``             scheduled tokens / ``max_num_batched_tokens`` (0 when unknown)
``offload_store_us``        GPU→CPU KV bytes issued this step / host-link bandwidth (µs)
``offload_load_us``         CPU→GPU KV bytes issued this step / host-link bandwidth (µs)
``tp_comm_us``              TP all-reduce bytes per GPU / GPU interconnect bandwidth (µs)
``ep_comm_us``              MoE dispatch+combine bytes per GPU / interconnect (µs)
==========================  =============================================================

Communication bytes use vLLM's real sizes (ring all-reduce moves ``2·(tp−1)/tp`` of the
buffer per GPU; two all-reduces per layer — attention and MLP — for dense layers, one per
MoE layer plus the expert dispatch when experts are spread over several GPUs), divided by
the NVLink bandwidth of the hardware sheet (PCIe when the GPU has no NVLink). BLIS's own
TP term divides the same kind of volume by HBM bandwidth, which is why its coefficient
β₄ absorbs the ratio; here the ratio is explicit.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from coeffd.learners.features.basis import BlisBasis
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.features.observe import kv_bytes_per_block
from coeffd.records.observations import StepObservation

__all__ = [
    "EXTENDED_INDEX",
    "EXTENDED_NAMES",
    "N_EXTENDED",
    "ExtendedPlan",
    "extended_plan",
    "extended_row",
    "extended_terms",
]

EXTENDED_NAMES: tuple[str, ...] = (
    "kv_usage",
    "kv_free_frac",
    "preempted",
    "waiting_depth",
    "prefill_chunks",
    "budget_fill",
    "offload_store_us",
    "offload_load_us",
    "tp_comm_us",
    "ep_comm_us",
)
EXTENDED_INDEX: dict[str, int] = {n: i for i, n in enumerate(EXTENDED_NAMES)}
N_EXTENDED = len(EXTENDED_NAMES)


def _tokens(obs: StepObservation) -> tuple[float, int]:
    """(tokens through the model this step, partial prefill chunks)."""
    agg = obs.aggregates
    if obs.requests:
        chunks = 0
        tokens = 0
        for r in obs.requests:
            if r.progress < r.input_len:
                tokens += r.new_tokens
                if r.progress > 0 or r.progress + r.new_tokens < r.input_len:
                    chunks += 1
            else:
                tokens += max(1, r.new_tokens)
        return float(tokens), chunks
    # Without requests, whether a prefill is a partial chunk is unknowable: report 0
    # rather than guess, so the column never carries invented signal.
    return float(agg.scheduled_tokens), 0


def extended_terms(
    obs: StepObservation, basis: BlisBasis, config: ServingConfig
) -> npt.NDArray[np.float64]:
    """The :data:`EXTENDED_NAMES` columns of one step (see module docs)."""
    if obs.more_batches:
        # state columns of one step do not add up over a span: no extended row
        return np.full(N_EXTENDED, np.nan)
    tokens, chunks = _tokens(obs)
    return np.array(extended_row(obs, basis, config, tokens, chunks), dtype=np.float64)


def extended_row(
    obs: StepObservation, basis: BlisBasis, config: ServingConfig, tokens: float, chunks: int
) -> list[float]:
    """:func:`extended_terms` of a single-batch step whose tokens through the model and
    partial prefill chunks are known, as a list: the same values, no array per row."""
    plan = extended_plan(basis, config)
    agg = obs.aggregates
    total = agg.kv_blocks_total_gpu
    budget = plan.budget
    out = [
        float(agg.kv_usage_gpu_ratio),
        agg.kv_blocks_free_gpu / total if total > 0 else 0.0,
        float(agg.num_preempted),
        float(agg.waiting_depth),
        float(chunks),
        agg.scheduled_tokens / budget if budget else 0.0,
    ]
    out += plan.tail(obs, tokens)
    return out


class ExtendedPlan:
    """What :func:`extended_row` reads of a (basis, configuration) pair, read once.

    Why: the learning consumer builds a row per step observation, and reading these
    through the model's and GPU's properties cost more than the row's own arithmetic
    (:func:`features.rows.step_rows` holds one plan per burst). Each column keeps the
    operands and operation order of the formulas in the module docs, so the values are
    bit for bit those of evaluating them per row.
    """

    __slots__ = (
        "_per_block",
        "a",
        "basis",
        "budget",
        "comm",
        "config",
        "d",
        "dispatch",
        "dp",
        "group",
        "host",
        "hw",
        "k",
        "link",
        "model",
        "moe_layers",
        "reduces",
        "ring",
        "tp",
    )

    def __init__(self, basis: BlisBasis, config: ServingConfig) -> None:
        self.basis = basis
        self.config = config
        hw = self.hw = basis.hw
        model = self.model = basis.model
        self.budget = config.max_num_batched_tokens
        self.host = hw.host_bytes_per_us
        # bytes per block only when a transfer needs it: an unknown KV dtype raises there
        self._per_block: float | None = None
        self.link = hw.interconnect_bytes_per_us
        self.a = float(model.bytes_per_param)
        self.d = float(model.hidden_dim)
        tp = self.tp = config.tp
        dp = self.dp = config.dp
        self.ring = 2.0 * (tp - 1) / tp if tp > 1 else 0.0
        self.reduces = 2 * model.dense_layers + 2 * model.moe_layers  # attention + FFN/experts
        self.group = tp * dp if model.is_moe else 1
        self.dispatch = model.is_moe and self.group > 1 and bool(config.ep or dp > 1)
        self.k = model.experts_per_tok_eff if self.dispatch else 1
        self.moe_layers = model.moe_layers
        #: whether any step can have a communication column (the others skip :meth:`tail`)
        self.comm = self.link > 0 and (tp > 1 or self.dispatch)

    def current(self, basis: BlisBasis, config: ServingConfig) -> bool:
        """Whether this plan was read from these very objects (identity: cheap per call)."""
        return (
            self.basis is basis
            and self.config is config
            and self.model is basis.model
            and self.hw is basis.hw
        )

    def per_block(self) -> float:
        """KV bytes of one block on one TP rank (each rank moves its own shard over its
        own host link, in parallel)."""
        if self._per_block is None:
            config = self.config
            self._per_block = kv_bytes_per_block(
                self.model,
                config.block_size,
                kv_cache_dtype=config.kv_cache_dtype,
                tp=config.tp,
                per_rank=True,
            )
        return self._per_block

    def tail(self, obs: StepObservation, tokens: float) -> tuple[float, float, float, float]:
        """The last four columns (offload store/load, TP and EP communication, µs)."""
        store = load = tp_us = ep_us = 0.0
        host = self.host
        if obs.kv_transfers and host > 0:
            per_block = self.per_block()
            for tr in obs.kv_transfers:
                us = tr.block_count * per_block / host
                if tr.store:
                    store += us
                else:
                    load += us
        link = self.link
        if link > 0 and tokens > 0:
            a, d = self.a, self.d
            tokens_per_rank = tokens / self.dp
            if self.tp > 1:
                tp_us = self.reduces * tokens_per_rank * d * a * self.ring / link
            if self.dispatch:
                group = self.group
                # Dispatch and combine: each token's hidden state to k experts and back,
                # the fraction (G−1)/G of which lives on other GPUs.
                vol = tokens_per_rank * self.k * d * a * 2.0 * (group - 1) / group
                ep_us = vol * self.moe_layers / link
        return store, load, tp_us, ep_us


_last_plan: ExtendedPlan | None = None


def extended_plan(basis: BlisBasis, config: ServingConfig) -> ExtendedPlan:
    """The :class:`ExtendedPlan` of ``(basis, config)``: the last one made when it was made
    from these objects (a learner set passes the same ones burst after burst), else a new one."""
    global _last_plan
    plan = _last_plan
    if plan is None or not plan.current(basis, config):
        plan = _last_plan = ExtendedPlan(basis, config)
    return plan
