"""Training observations: what the joiner emits and the learners consume.

One record per thing that has a measured latency, with everything needed to explain it.
Latencies are in microseconds (as BLIS uses them); times are ``*_mono_ns`` of the
emitting EngineCore unless named otherwise.
"""

from __future__ import annotations

import enum

import msgspec

from coeffd.records.events import Source


class PeriodMethod(enum.StrEnum):
    """How a step period was reconstructed (spec §2.5)."""

    CONSECUTIVE_SUMMARIES = "consecutive_summaries"  # S(N+1) - S(N), exact
    JOURNEY_ANCHORS = "journey_anchors"  # same-type journey anchors around the step
    COMPLETION_ANCHORS = "completion_anchors"  # async: C(N) - C(N-1)
    #: unsampled steps between two journey-pinned starts: the sum of their periods
    #: (``StepObservation.more_batches``; joiner/pinned.py)
    JOURNEY_SPAN = "journey_span"


class Composition(enum.StrEnum):
    """Where a step's batch composition came from, best first."""

    SNAPSHOTS = "snapshots"  # step.REQUEST_SNAPSHOT for every running request: exact
    JOURNEYS = "journeys"  # reconstructed from journey events of running requests
    AGGREGATES = "aggregates"  # BATCH_SUMMARY totals only


class BatchRequest(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One scheduled request of a step, in BLIS's meanings (spec blis §1.5).

    ``input_len`` is the full prompt length, ``progress`` the tokens already processed
    before this step (vLLM ``num_computed_tokens``; 0 for a newly admitted request even
    with prefix-cache hits), ``new_tokens`` the tokens scheduled this step, ``output_len``
    the output length (only ``> 0`` matters for the decode classification).
    """

    input_len: int
    progress: int
    new_tokens: int
    output_len: int


class StepAggregates(msgspec.Struct, frozen=True, gc=False):
    """The BATCH_SUMMARY totals of a step (always present)."""

    num_prefill_reqs: int
    prefill_tokens: int
    num_decode_reqs: int
    decode_tokens: int
    scheduled_tokens: int
    running_depth: int
    waiting_depth: int
    num_preempted: int
    num_finished: int
    kv_usage_gpu_ratio: float
    kv_blocks_total_gpu: int
    kv_blocks_free_gpu: int


class KVTransferObservation(msgspec.Struct, frozen=True, gc=False):
    """One logical KV offload transfer (TP copies counted once)."""

    source: Source
    dp_rank: int
    transfer_id: int
    store: bool  # True: GPU->CPU store, False: CPU->GPU load
    block_count: int
    duration_us: float  # initiation -> completion (KV batch wall clocks)
    step: int | None  # scheduler step the transfer was issued in
    success: bool = True
    bytes: float | None = None  # filled from the configuration's KV bytes per block


class StepObservation(msgspec.Struct, frozen=True, gc=False):
    """Beta target: the busy-loop period of one sampled step of one engine."""

    source: Source
    step: int
    start_mono_ns: int
    period_us: float  # reconstructed busy-loop period attributed to this batch
    period_method: PeriodMethod
    period_uncertainty_us: float  # half-width of the plausible interval
    scheduler_duration_us: int  # step.duration_us (scheduler CPU only)
    composition: Composition
    requests: tuple[BatchRequest, ...]  # empty when composition == AGGREGATES
    aggregates: StepAggregates
    async_scheduling: bool
    kv_transfers: tuple[KVTransferObservation, ...] = ()
    # Added by the joiner (additive): the raw loop period S(N+1) - S(N) when the next step
    # also has a summary, whatever the attribution (== period_us in sync mode).
    loop_period_us: float | None = None
    #: Added for journey-pinned spans (additive): the batches of steps ``step + 1 …`` whose
    #: periods ``period_us`` also covers (it is the sum over ``requests`` and these);
    #: empty for a one-step observation.
    more_batches: tuple[tuple[BatchRequest, ...], ...] = ()


class QueueState(msgspec.Struct, frozen=True, gc=False):
    """The engine state a request met when queued (nearest step summary)."""

    step: int
    waiting_depth: int
    running_depth: int
    kv_usage_gpu_ratio: float
    distance_steps: int  # |summary step - queued step|


class RequestObservation(msgspec.Struct, frozen=True, gc=False):
    """Alpha targets: the API-side overheads of one request with both spans."""

    source: Source  # the EngineCore's source
    request_id: str  # internal id
    arrival_to_queued_us: float
    queue_wait_us: float | None  # QUEUED -> first SCHEDULED(FIRST)
    first_token_to_response_us: float | None  # streaming chat only
    finished_to_departed_us: float | None
    ttft_us: float | None  # ARRIVED -> FIRST_TOKEN (engine clock view)
    e2e_us: float | None  # ARRIVED -> DEPARTED
    prompt_tokens: int
    output_tokens: int
    num_preemptions: int
    finish_status: str | None
    route: str | None
    streaming: bool | None
    queue_state: QueueState | None
    api_source: Source | None = None
    #: Expected part of ``arrival_to_queued_us`` spent waiting for the engine loop's next
    #: iteration boundary (QUEUED is quantized to it, spec pitfall 9); BLIS's α0 excludes
    #: it. None when the engine's periods are not known yet.
    queued_loop_wait_us: float | None = None
    #: ARRIVED on the API server's wall clock (additive): where the request sits in the
    #: traffic, for a TraceV2 export (``coeffd trace``); None from older joiners.
    arrival_wall_ns: int | None = None


Observation = StepObservation | RequestObservation | KVTransferObservation
