"""What a simulated engine holds: requests, scheduled entries, batches, KV transfers.

Plain slotted dataclasses shared by the busy loop (:mod:`.engine`) and the CPU offload
tier (:mod:`.offload`); times are integer ns of the simulated clock (``US``/``MS``
convert), and ``INF`` is "never".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coeffd.records.observations import BatchRequest
from coeffd.simfleet.kv import KVEvent
from coeffd.simfleet.workload import Arrival

__all__ = ["INF", "MS", "US", "Batch", "Entry", "Req", "StepRecord", "Transfer"]

US = 1_000
MS = 1_000_000
INF = 1 << 62


@dataclass(slots=True, eq=False)
class Req:
    """A request inside the engine (vLLM ``Request``), with its telemetry handles."""

    arr: Arrival
    external_id: str
    internal_id: str
    deliver_ns: int
    tokens: list[int]  # prompt, then realized output tokens
    prompt_len: int
    target_out: int
    max_tokens: int
    hashes: list[int] = field(default_factory=list)  # full-block hash chain of known tokens
    computed: int = 0
    placeholders: int = 0
    epoch: int = 0
    blocks: list[int] = field(default_factory=list)
    committed: int = 0
    hwm: int = 0
    preemptions: int = 0
    cached_first: int = -1
    started: bool = False
    finished: bool = False
    loading: bool = False
    cpu_loaded: bool = False
    cpu_stored: int = 0
    api_span: Any = None
    core_span: Any = None
    first_response_ns: int = 0  # first token delivered to the client (TTFT end)

    @property
    def num_out(self) -> int:
        return len(self.tokens) - self.prompt_len

    def phase(self) -> str:
        return "PREFILL" if self.num_out == 0 else "DECODE"


@dataclass(slots=True)
class Entry:
    """One request's share of a scheduled step (``samples``: it gets an output token)."""

    req: Req
    tokens: int
    samples: bool
    epoch: int


@dataclass(slots=True)
class Transfer:
    """One KV transfer between the GPU and the CPU tier (a store or a load)."""

    tid: int
    req_id: str
    store: bool
    blocks: int
    hashes: list[int]
    step: int
    done_ns: int
    req: Req | None = None


@dataclass(slots=True)
class Batch:
    """One scheduled step in flight."""

    step: int
    entries: list[Entry]
    tokens: int
    blis: list[BatchRequest]
    dispatch_ns: int = 0
    gpu_end_ns: int = 0
    period_us: float = 0.0
    truth_us: float = 0.0
    worker_events: list[KVEvent] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)


@dataclass(slots=True)
class StepRecord:
    """Per-step ground truth kept for tests (only when ``record_steps``)."""

    step: int
    start_ns: int
    end_ns: int
    tokens: int
    running: int
    waiting: int
    free_blocks: int
    period_us: float
    truth_us: float
    preempted: int
    blis: list[BatchRequest]
