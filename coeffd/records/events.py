"""Typed, immutable event records: what receivers hand to the pipeline.

One record per span (``RequestSpan``, ``CoreSpan``, ``StepSpan``) followed by one
record per event of that span, and one record per ZMQ KV event. The vLLM fork's attribute
names (its telemetry spec: docs/ARCHITECTURE.md) are mapped to plain field names; the
mapping lives in ``receivers.otlp.decode`` and ``receivers.kv.decode`` only.

Times are integers in nanoseconds and name their clock: ``wall_ns`` is
``CLOCK_REALTIME`` (event ``timeUnixNano``, KV ``ts``), ``mono_ns`` is
``CLOCK_MONOTONIC`` of the emitting process. Comparing a wall with a mono time is never
meaningful.

msgspec ``Struct`` (frozen) is used rather than a frozen dataclass because its
constructor runs in C: a frozen dataclass pays one ``object.__setattr__`` per field,
which dominates the decode hot path.
"""

from __future__ import annotations

import enum

import msgspec

AttrValue = str | int | float | bool


class Source(msgspec.Struct, frozen=True, gc=False):
    """A stable identity of one telemetry stream (one process's exporter, or one KV publisher).

    ``id`` is a short hash of the sorted resource attributes, so the same process
    configuration gets the same id after a restart. Steps are keyed per source, never
    globally: step ids collide across engines.
    """

    id: str
    attributes: tuple[tuple[str, AttrValue], ...]

    def get(self, key: str, default: AttrValue | None = None) -> AttrValue | None:
        """Return a resource attribute by key."""
        for k, v in self.attributes:
            if k == key:
                return v
        return default


class SpanInfo(msgspec.Struct, frozen=True, gc=False):
    """Identifiers of the span an event belongs to; shared by all records of that span."""

    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    parent_span_id: bytes  # b"" for a root span
    name: str
    scope: str
    source: Source
    start_wall_ns: int
    end_wall_ns: int
    dropped_events: int = 0


# --------------------------------------------------------------------------- spans


class RequestSpan(msgspec.Struct, frozen=True, gc=False):
    """``llm_request`` (scope ``vllm.api``): one per traced API request."""

    span: SpanInfo
    request_id: str  # external id (gen_ai.request.id)
    route: str | None = None  # http.route
    model: str | None = None  # gen_ai.response.model
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    is_error: bool = False  # span status ERROR


class CoreSpan(msgspec.Struct, frozen=True, gc=False):
    """``llm_core`` (scope ``vllm.scheduler``): child of ``llm_request`` in EngineCore."""

    span: SpanInfo
    request_id: str  # internal id (gen_ai.request.id)


class StepSpan(msgspec.Struct, frozen=True, gc=False):
    """``scheduler_steps_<seq>`` (scope ``vllm.scheduler.step``)."""

    span: SpanInfo
    sequence: int
    range_start: int
    closure_interval: int
    range_end: int | None = None


# -------------------------------------------------------------------------- events


class ApiKind(enum.StrEnum):
    ARRIVED = "ARRIVED"
    HANDOFF_TO_CORE = "HANDOFF_TO_CORE"
    FIRST_RESPONSE_FROM_CORE = "FIRST_RESPONSE_FROM_CORE"
    DEPARTED = "DEPARTED"
    ABORTED = "ABORTED"


class JourneyKind(enum.StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    FIRST_TOKEN = "FIRST_TOKEN"
    PREEMPTED = "PREEMPTED"
    FINISHED = "FINISHED"


class ApiEvent(msgspec.Struct, frozen=True, gc=False):
    """``api.*`` event on ``llm_request``; ``mono_ns`` from ``event.ts.monotonic`` (API process)."""

    span: SpanInfo
    kind: ApiKind
    wall_ns: int
    mono_ns: int
    reason: str | None = None  # ABORTED only
    error: str | None = None  # ABORTED only, when a message exists


class JourneyEvent(msgspec.Struct, frozen=True, gc=False):
    """``journey.*`` event on ``llm_core``; ``mono_ns`` from ``ts.monotonic_ns`` (EngineCore)."""

    span: SpanInfo
    kind: JourneyKind
    wall_ns: int
    mono_ns: int
    step: int  # scheduler.step
    phase: str  # WAITING | PREFILL | DECODE
    prefill_done_tokens: int
    prefill_total_tokens: int
    decode_done_tokens: int
    decode_max_tokens: int
    num_preemptions: int
    schedule_kind: str | None = None  # SCHEDULED: FIRST | RESUME
    finish_status: str | None = None  # FINISHED: stopped | length | aborted | ignored | error


class BatchSummary(msgspec.Struct, frozen=True, gc=False):
    """``step.BATCH_SUMMARY``: one sampled scheduler step of one EngineCore."""

    span: SpanInfo
    wall_ns: int
    step: int
    start_mono_ns: int  # S(N)
    end_mono_ns: int  # E(N)
    duration_us: int  # scheduler CPU time only, not the step period
    running_depth: int
    waiting_depth: int
    num_prefill_reqs: int
    num_decode_reqs: int
    scheduled_tokens: int
    prefill_tokens: int
    decode_tokens: int
    num_finished: int
    num_preempted: int
    kv_usage_gpu_ratio: float
    kv_blocks_total_gpu: int
    kv_blocks_free_gpu: int
    #: Decoded while the daemon sheds load, for a step it will not learn: only the fields
    #: the joiner's bookkeeping reads are set (step, times, queue depths, request counts,
    #: scheduled tokens, KV usage); the rest are 0. The joiner never builds an
    #: observation from it.
    partial: bool = False


class RequestSnapshot(msgspec.Struct, frozen=True, gc=False):
    """``step.REQUEST_SNAPSHOT``: one running request at a rich-sampled step."""

    span: SpanInfo
    wall_ns: int
    step: int
    request_id: str  # internal id
    phase: str  # PREFILL | DECODE
    num_prompt_tokens: int
    num_computed_tokens: int  # before this step's tokens
    num_output_tokens: int
    num_preemptions: int
    scheduled_tokens: int  # 0 if running but not scheduled
    kv_blocks_allocated_gpu: int
    kv_blocks_cached_gpu: int
    effective_prompt_len: int | None = None


# ----------------------------------------------------------------------- KV events


class KVBatchInfo(msgspec.Struct, frozen=True, gc=False):
    """The ZMQ message a KV event came in: one per published ``KVEventBatch``."""

    source: Source
    topic: str
    seq: int
    wall_ns: int  # batch ts (wall clock at publish)
    dp_rank: int


class KVTransfer(msgspec.Struct, frozen=True, gc=False):
    """``TransferInitiated`` / ``TransferCompleted`` (CPU offloading, fork events)."""

    batch: KVBatchInfo
    completed: bool
    transfer_id: int
    request_id: str
    source_medium: str
    dest_medium: str
    block_count: int
    scheduler_step: int | None
    success: bool | None = None  # completed only


class KVRemoteTransfer(msgspec.Struct, frozen=True, gc=False):
    """``RemoteTransferInitiated`` / ``RemoteTransferCompleted`` (NIXL, P2P)."""

    batch: KVBatchInfo
    completed: bool
    transfer_id: int
    request_id: str
    connector_type: str
    source_rank: int
    dest_rank: int
    block_count: int
    success: bool | None = None


class KVCacheCommit(msgspec.Struct, frozen=True, gc=False):
    """``CacheLoadCommitted`` (``load=True``) / ``CacheStoreCommitted``."""

    batch: KVBatchInfo
    load: bool
    request_id: str
    medium: str
    block_count: int
    scheduler_step: int | None  # load: carries N-1 (spec §5.6)


class KVCacheEviction(msgspec.Struct, frozen=True, gc=False):
    """``CacheEviction`` from the offload tier."""

    batch: KVBatchInfo
    medium: str
    blocks_evicted: int
    reason: str
    scheduler_step: int | None


class KVBlocks(msgspec.Struct, frozen=True, gc=False):
    """``BlockStored`` (``stored=True``) / ``BlockRemoved``; hashes reduced to a count."""

    batch: KVBatchInfo
    stored: bool
    medium: str | None
    num_blocks: int
    num_tokens: int = 0  # BlockStored only
    block_size: int | None = None  # BlockStored only


class KVAllCleared(msgspec.Struct, frozen=True, gc=False):
    """``AllBlocksCleared``: prefix-cache reset."""

    batch: KVBatchInfo


SpanRecord = RequestSpan | CoreSpan | StepSpan
EventRecord = ApiEvent | JourneyEvent | BatchSummary | RequestSnapshot
KVRecord = KVTransfer | KVRemoteTransfer | KVCacheCommit | KVCacheEviction | KVBlocks | KVAllCleared
Record = SpanRecord | EventRecord | KVRecord
