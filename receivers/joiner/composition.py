"""Batch composition of a sampled step, in BLIS's meanings (blis spec §1.5).

Three sources, best first: ``step.REQUEST_SNAPSHOT`` of every running request (exact),
a reconstruction from the journey events of the running requests (accepted only when it
reproduces the summary's totals exactly), the summary's totals alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from receivers.observations import BatchRequest, StepAggregates
from receivers.records import BatchSummary, RequestSnapshot


def aggregates_of(s: BatchSummary) -> StepAggregates:
    """The summary totals as the observation carries them."""
    return StepAggregates(
        num_prefill_reqs=s.num_prefill_reqs,
        prefill_tokens=s.prefill_tokens,
        num_decode_reqs=s.num_decode_reqs,
        decode_tokens=s.decode_tokens,
        scheduled_tokens=s.scheduled_tokens,
        running_depth=s.running_depth,
        waiting_depth=s.waiting_depth,
        num_preempted=s.num_preempted,
        num_finished=s.num_finished,
        kv_usage_gpu_ratio=s.kv_usage_gpu_ratio,
        kv_blocks_total_gpu=s.kv_blocks_total_gpu,
        kv_blocks_free_gpu=s.kv_blocks_free_gpu,
    )


def snapshot_request(snap: RequestSnapshot, newly_admitted: bool) -> BatchRequest:
    """One snapshot as a BLIS ``BatchRequest``.

    ``progress`` is vLLM's ``num_computed_tokens`` except for a request admitted in this
    very step, which BLIS gives ``progress = 0`` even with prefix-cache hits.
    ``output_len`` is only known so far; BLIS only looks at ``> 0``, and a scheduled
    request will produce at least one token, so it is at least 1.

    >>> from receivers.records import RequestSnapshot
    >>> s = RequestSnapshot(None, 0, 9, "r", "DECODE", 138, 112, 37, 2, 63, 9, 0, 26)
    >>> snapshot_request(s, False)  # resumed after preemption: re-prefills 138 + 37
    BatchRequest(input_len=175, progress=112, new_tokens=63, output_len=37)
    """
    progress = 0 if newly_admitted else snap.num_computed_tokens
    known = snap.num_prompt_tokens + snap.num_output_tokens
    # a request preempted by recompute re-prefills its prompt *and* its outputs so far:
    # in BLIS terms its input is all known tokens until it is back to decoding
    recomputing = snap.num_output_tokens > 0 and snap.num_computed_tokens < known - 1
    return BatchRequest(
        input_len=known if recomputing else snap.num_prompt_tokens,
        progress=progress,
        new_tokens=snap.scheduled_tokens,
        output_len=max(snap.num_output_tokens, 1),
    )


def is_newly_admitted(snap: RequestSnapshot) -> bool:
    """True when the snapshot's computed tokens are exactly its prefix-cache hit.

    A request admitted in this step has no output and ``num_computed_tokens`` equal to
    the cached prefix (``num_prompt_tokens - effective_prompt_len``; a whole-prompt hit
    omits ``effective_prompt_len`` and recomputes the last token). A later chunk has
    computed more than the cached prefix.

    >>> from receivers.records import RequestSnapshot
    >>> def snap(computed, eff):
    ...     return RequestSnapshot(None, 0, 1, "r", "PREFILL", 40, computed, 0, 0, 24, 3, 2, eff)
    >>> is_newly_admitted(snap(16, 24)), is_newly_admitted(snap(32, 24))
    (True, False)
    """
    if snap.num_output_tokens > 0 or snap.num_preemptions > 0:
        return False
    cached = (
        snap.num_prompt_tokens - snap.effective_prompt_len
        if snap.effective_prompt_len is not None
        else snap.num_prompt_tokens - 1
    )
    return snap.num_computed_tokens <= cached


def from_snapshots(
    summary: BatchSummary, snaps: Mapping[str, RequestSnapshot], scheduled_here: Iterable[str] = ()
) -> tuple[BatchRequest, ...] | None:
    """Composition from snapshots, or None if they do not cover the running queue.

    Snapshots are complete when there is one per running request and their scheduled
    tokens add up to the summary's; a span that hit the 128-event limit loses some.
    ``scheduled_here`` are request ids with a journey SCHEDULED in this step (a sure
    sign of admission in this step).
    """
    if len(snaps) != summary.running_depth:
        return None
    if sum(s.scheduled_tokens for s in snaps.values()) != summary.scheduled_tokens:
        return None
    admitted = set(scheduled_here)
    out = [
        snapshot_request(s, rid in admitted or is_newly_admitted(s))
        for rid, s in sorted(snaps.items())
        if s.scheduled_tokens > 0
    ]
    return tuple(out)


def matches_aggregates(reqs: Sequence[BatchRequest], summary: BatchSummary) -> bool:
    """True when a reconstructed batch reproduces the summary's totals exactly."""
    return (
        len(reqs) == summary.num_prefill_reqs + summary.num_decode_reqs
        and sum(r.new_tokens for r in reqs) == summary.scheduled_tokens
    )
