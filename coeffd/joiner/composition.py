"""Batch composition of a sampled step, in BLIS's meanings (blis spec §1.5).

Three sources, best first: ``step.REQUEST_SNAPSHOT`` of every running request (exact),
a reconstruction from the journey events of the running requests (accepted only when it
reproduces the summary's totals exactly), the summary's totals alone.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from coeffd.records.events import BatchSummary, RequestSnapshot
from coeffd.records.observations import BatchRequest, StepAggregates


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

    >>> from coeffd.records.events import RequestSnapshot
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

    >>> from coeffd.records.events import RequestSnapshot
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
    summary: BatchSummary, snaps: Mapping[str, RequestSnapshot]
) -> tuple[BatchRequest, ...] | None:
    """Composition from snapshots, or None if they do not cover the running queue.

    Snapshots are complete when there is one per running request and their scheduled
    tokens add up to the summary's; a span that hit the 128-event limit loses some.
    """
    if len(snaps) != summary.running_depth:
        return None
    if sum(s.scheduled_tokens for s in snaps.values()) != summary.scheduled_tokens:
        return None
    out = [
        snapshot_request(s, is_newly_admitted(s))
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


class Life(msgspec.Struct, frozen=True, gc=False):
    """The steps of one finished, journey-traced request (from its ``llm_core`` events).

    ``first`` is the admission step (SCHEDULED FIRST), ``first_token`` the step whose
    output produced the first token (= the last prefill step), ``last`` the last step the
    request was scheduled in (FINISHED's step; one more with async scheduling for a
    ``stopped`` request, whose next token was already scheduled when it stopped).
    """

    first: int
    first_token: int | None
    last: int
    input_len: int
    output_len: int
    preempted: bool


_ORDER = operator.attrgetter("input_len", "progress", "new_tokens")


def life_request(life: Life, n: int) -> tuple[BatchRequest | None, bool]:
    """The request's part in step ``n``: (known request, False), (request with unknown
    ``new_tokens``, True), or (None, True) when it cannot be reconstructed.

    Decode steps are exact (one token, ``progress = I + g - 1`` with ``g = n - f`` tokens
    produced before). The admission step of a request is a prefill with ``progress = 0``
    (BLIS convention) and an unknown token count (prefix-cache hits and chunking are not
    in the journey); a later prefill chunk has an unknown progress too.
    """
    f = life.first_token
    if life.preempted:
        return None, True
    if f is not None and n > f:
        return BatchRequest(life.input_len, life.input_len + (n - f) - 1, 1, life.output_len), False
    if n == life.first:
        return BatchRequest(life.input_len, 0, 0, max(life.output_len, 1)), True
    return None, True


def life_part(life: Life, n: int) -> int:
    """How a life covering step ``n`` enters the batch :func:`from_lives` rebuilds: 0 as a
    decode (known), 1 as its admission (token count unknown), -1 not at all (preempted,
    or a later prefill chunk: the step cannot be rebuilt whatever else arrives).

    >>> life = Life(first=10, first_token=12, last=40, input_len=900, output_len=29,
    ...             preempted=False)
    >>> [life_part(life, n) for n in (10, 11, 13)]
    [1, -1, 0]
    """
    if life.preempted:
        return -1
    f = life.first_token
    if f is not None and n > f:
        return 0
    if n == life.first:
        return 1
    return -1


def from_lives(summary: BatchSummary, lives: Iterable[Life]) -> tuple[BatchRequest, ...] | None:
    """Composition of step ``summary.step`` from the lives covering it, or None.

    Accepted only if it reproduces the summary exactly: as many scheduled requests, and
    the same total tokens with at most one request's count unknown (solved from the
    total). Any untraced or still-running request makes the totals disagree.
    """
    n = summary.step
    covering = [life for life in lives if life.first <= n <= life.last]
    # the count first: most mismatches are decided without building a request
    if len(covering) != summary.num_prefill_reqs + summary.num_decode_reqs:
        return None
    known: list[BatchRequest] = []
    unknown: list[BatchRequest] = []
    for life in covering:  # life_request, inlined: this runs per life per summarised step
        f = life.first_token
        if life.preempted:
            return None
        if f is not None and n > f:
            i = life.input_len
            known.append(BatchRequest(i, i + (n - f) - 1, 1, life.output_len))
        elif n == life.first:
            unknown.append(BatchRequest(life.input_len, 0, 0, max(life.output_len, 1)))
        else:
            return None
    rest = summary.scheduled_tokens - len(known)  # a known request is a decode: 1 token
    if not unknown:
        if rest != 0:
            return None
    elif len(unknown) == 1:
        u = unknown[0]
        if not 1 <= rest <= u.input_len:
            return None
        known.append(BatchRequest(u.input_len, u.progress, rest, u.output_len))
    else:
        return None
    return tuple(sorted(known, key=_ORDER))
