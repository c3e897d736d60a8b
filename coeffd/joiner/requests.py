"""Per-request join state: ``llm_request`` (API) + ``llm_core`` (EngineCore) → alpha targets.

The two spans are linked by trace id and ``llm_core.parent_span_id == llm_request.span_id``
(spec §2.6), never by request-id strings. Mono times of the API process and of the
EngineCore are compared only after the two processes were shown to share a host: each
journey/API event reads wall and mono back to back, so equal ``wall - mono`` offsets
(within a tolerance) mean one ``CLOCK_MONOTONIC``.
"""

from __future__ import annotations

import msgspec

from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    RequestSpan,
    Source,
)
from coeffd.records.observations import QueueState, RequestObservation

EntryKey = tuple[bytes, bytes]  # (trace id, llm_request span id)
_ARRIVED, _FIRST_RESPONSE = ApiKind.ARRIVED, ApiKind.FIRST_RESPONSE_FROM_CORE
_DEPARTED = ApiKind.DEPARTED


class CoreState(msgspec.Struct, gc=False):
    """One ``llm_core`` span and the journey events that matter for alpha targets.

    This and :class:`RequestEntry` are untracked by the cyclic GC (they form no cycle):
    one of each per request in flight, and each tracked object is work for every
    collection."""

    span: CoreSpan | None = None
    queued: JourneyEvent | None = None
    scheduled_first: JourneyEvent | None = None
    first_token: JourneyEvent | None = None
    finished: JourneyEvent | None = None
    max_preemptions: int = 0
    emitted: bool = False

    def add(self, ev: JourneyEvent) -> bool:
        """Record a journey event; False if it was already there (duplicate)."""
        k = ev.kind
        if ev.num_preemptions > self.max_preemptions:
            self.max_preemptions = ev.num_preemptions
        if k is JourneyKind.QUEUED:
            if self.queued is not None:
                return False
            self.queued = ev
        elif k is JourneyKind.SCHEDULED:
            if ev.schedule_kind == "RESUME":
                return True
            if self.scheduled_first is not None:
                return False
            self.scheduled_first = ev
        elif k is JourneyKind.FIRST_TOKEN:
            if self.first_token is not None:
                return False
            self.first_token = ev
        elif k is JourneyKind.FINISHED:
            if self.finished is not None:
                return False
            self.finished = ev
        return True


class RequestEntry(msgspec.Struct, gc=False):
    """Both sides of one traced request (several ``llm_core`` when n > 1)."""

    key: EntryKey
    deadline_wall: int
    api: RequestSpan | None = None
    api_events: dict[ApiKind, ApiEvent] = msgspec.field(default_factory=dict)
    cores: dict[bytes, CoreState] = msgspec.field(default_factory=dict)

    def api_done(self) -> bool:
        ev = self.api_events
        return self.api is not None and (ApiKind.DEPARTED in ev or ApiKind.ABORTED in ev)


def same_host(api_ev: ApiEvent, core_ev: JourneyEvent, tolerance_ns: float) -> bool:
    """Whether two events' processes share ``CLOCK_MONOTONIC`` (equal wall-mono offsets).

    >>> from coeffd.records.events import ApiKind, JourneyKind
    >>> a = ApiEvent(None, ApiKind.ARRIVED, 1_000_350, 350)
    >>> j = JourneyEvent(None, JourneyKind.QUEUED, 2_000_334, 1_000_334, 1, "WAITING", 0, 1, 0, 1, 0)
    >>> same_host(a, j, 200_000.0)
    True
    """
    off_api = api_ev.wall_ns - api_ev.mono_ns
    off_core = core_ev.wall_ns - core_ev.mono_ns
    return abs(off_api - off_core) <= tolerance_ns


def infer_streaming(entry: RequestEntry, core: CoreState) -> bool | None:
    """Streaming chat sends its first response right after the first token; a
    non-streaming one only after FINISHED (FINAL_ONLY outputs). Undecidable when the
    first token is also the last, or without FIRST_RESPONSE (completions)."""
    fr = entry.api_events.get(ApiKind.FIRST_RESPONSE_FROM_CORE)
    fin = core.finished
    if fr is None or fin is None or core.first_token is None:
        return None
    if fin.step == core.first_token.step:
        return None
    return fr.mono_ns < fin.mono_ns


def build_observation(
    entry: RequestEntry,
    core: CoreState,
    engine_source: Source,
    queue_state: QueueState | None,
    tolerance_ns: float,
) -> tuple[RequestObservation | None, str]:
    """The RequestObservation of one core span, or a rejection reason."""
    if entry.api is None:
        return None, "no_api_span"
    if core.span is None:
        return None, "no_core_span"
    ev = entry.api_events
    arrived = ev.get(_ARRIVED)
    q = core.queued
    if arrived is None:
        return None, "no_arrived"
    if q is None:
        return None, "no_queued"
    # same_host(arrived, q, tolerance_ns), inlined (once per request observation)
    if abs((arrived.wall_ns - arrived.mono_ns) - (q.wall_ns - q.mono_ns)) > tolerance_ns:
        return None, "different_hosts"
    fin = core.finished
    ft = core.first_token
    streaming = infer_streaming(entry, core)
    api = entry.api
    fr = ev.get(_FIRST_RESPONSE)
    dep = ev.get(_DEPARTED)
    # durations in µs from mono ns, inline (six per request observation)
    ft_to_resp = (
        (fr.mono_ns - ft.mono_ns) / 1e3 if streaming and ft is not None and fr is not None else None
    )
    last = fin or ft or core.scheduled_first or q
    t_arr = arrived.mono_ns
    sched = core.scheduled_first
    # positional, in the fields' order (keywords cost a name lookup each, once per
    # request observation); test_joiner_identity pins the result
    obs = RequestObservation(
        engine_source,  # source
        core.span.request_id,  # request_id
        (q.mono_ns - t_arr) / 1e3,  # arrival_to_queued_us
        (sched.mono_ns - q.mono_ns) / 1e3 if sched is not None else None,  # queue_wait_us
        ft_to_resp,  # first_token_to_response_us
        # finished_to_departed_us
        (dep.mono_ns - fin.mono_ns) / 1e3 if fin is not None and dep is not None else None,
        (ft.mono_ns - t_arr) / 1e3 if ft is not None else None,  # ttft_us
        (dep.mono_ns - t_arr) / 1e3 if dep is not None else None,  # e2e_us
        q.prefill_total_tokens,  # prompt_tokens
        (  # output_tokens
            last.decode_done_tokens
            if fin is not None or api.completion_tokens is None
            else api.completion_tokens
        ),
        core.max_preemptions,  # num_preemptions
        fin.finish_status if fin is not None else None,  # finish_status
        api.route,  # route
        streaming,  # streaming
        queue_state,  # queue_state
        api.span.source,  # api_source
        None,  # queued_loop_wait_us (decided later: Joiner._emit_loop_wait)
        arrived.wall_ns,  # arrival_wall_ns
    )
    return obs, ""
