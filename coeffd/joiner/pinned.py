"""Steps pinned by journeys: periods and batches of steps whose summary was not sampled.

At vLLM's default sampling (journey 1.0, step 0.01) only one step in a hundred carries a
``step.BATCH_SUMMARY``, but every traced request stamps its journey events with the step
they happened in. Those events pin schedule starts ``S(n)`` on the engine's own clock
(:mod:`.starts`), and the finished requests' lives (:class:`~.composition.Life`) say which
requests ran in every step between. Together they turn the unsampled steps into period
observations:

* **Batch of step n** (:func:`batch_at`): every request whose life covers ``n``. Decode
  steps are exact (one token, ``progress = I + (n − f) − 1``). A prefill is exact only
  when its size is known: one chunk and no prefix cache (``coeffd.prefix_caching=false``);
  with the cache on, the hit length is in no journey event, so such steps are dropped
  (``prefill``). Preempted or aborted requests make a step ambiguous (``preempted``); a
  step no request covers is an idle or empty schedule (``idle``).
* **Completeness** (``EngineState._explained``): a request still running when the step is
  built is invisible (its events arrive with its FINISHED), so a segment between two
  summaries is used only if both summaries' running queues are fully explained by the
  known lives. A request invisible inside the segment is either running at the first
  summary (then its count was short) or still running at the second (likewise).
* **Spans** (:func:`spans`): between consecutive pinned starts ``p < q`` the loop ran the
  batches ``p − a … q − 1 − a`` (``a`` = 1 with async scheduling, spec §2.5.5), so
  ``S(q) − S(p)`` is the sum of their periods — a linear observation of β on the summed
  basis terms, as exact as a one-step period. A span breaks at any unknown batch.

Pure functions; the engine state that feeds them lives in :mod:`.engine`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import msgspec

from coeffd.joiner.composition import Life
from coeffd.records.observations import BatchRequest

__all__ = ["Pin", "Span", "batch_at", "spans"]


def batch_at(
    lives: Iterable[Life], n: int, prefix_cache_off: bool
) -> tuple[BatchRequest, ...] | str:
    """The batch of step ``n`` rebuilt from the lives covering it, or why it cannot be
    (requests in the order of ``lives``).

    >>> dec = Life(first=1, first_token=1, last=9, input_len=100, output_len=9, preempted=False)
    >>> new = Life(first=5, first_token=5, last=7, input_len=40, output_len=3, preempted=False)
    >>> batch_at([dec, new], 4, False)
    (BatchRequest(input_len=100, progress=102, new_tokens=1, output_len=9),)
    >>> batch_at([dec, new], 5, False)
    'prefill'
    >>> batch_at([dec, new], 5, True)[1]
    BatchRequest(input_len=40, progress=0, new_tokens=40, output_len=3)
    >>> batch_at([dec], 12, False)
    'idle'
    """
    out: list[BatchRequest] = []
    for life in lives:
        if not (life.first <= n <= life.last):
            continue
        f = life.first_token
        if life.preempted or f is None:
            return "preempted"
        if n > f:
            out.append(
                BatchRequest(life.input_len, life.input_len + (n - f) - 1, 1, life.output_len)
            )
        elif prefix_cache_off and n == life.first == f:
            out.append(BatchRequest(life.input_len, 0, life.input_len, max(life.output_len, 1)))
        else:
            return "prefill"
    if not out:
        return "idle"
    return tuple(out)


class Pin(msgspec.Struct, frozen=True, gc=False):
    """A schedule start ``S(step)``: point estimate and half-width of its bounds (ns).

    A Struct, not a frozen dataclass: a point is made for every summarised step a loop
    wait or a segment reads (a frozen dataclass's ``__init__`` cost ~10× as much)."""

    step: int
    t_ns: float
    half_ns: float


class Span(msgspec.Struct, frozen=True, gc=False):
    """Consecutive batches ``first … first + len(batches) − 1`` and their summed period."""

    first: int
    batches: tuple[tuple[BatchRequest, ...], ...]
    period_ns: float
    half_ns: float
    start: Pin


def spans(
    pins: Sequence[Pin],
    batch: dict[int, tuple[BatchRequest, ...] | str],
    shift: int,
    max_steps: int,
) -> tuple[list[Span], dict[str, int]]:
    """Spans between consecutive pins whose batches are all known; drop reasons per batch.

    ``pins`` are sorted by step; ``batch`` maps every batch step in range to its batch
    or the reason it is unknown; ``shift`` is ``a`` (batch = start step − a).

    >>> b = (BatchRequest(10, 12, 1, 5),)
    >>> pins = [Pin(10, 0.0, 1.0), Pin(11, 8.0, 1.0), Pin(13, 24.0, 1.0), Pin(15, 40.0, 1.0)]
    >>> out, why = spans(pins, {10: b, 11: b, 12: b, 13: "prefill", 14: b}, 0, 8)
    >>> [(s.first, len(s.batches), s.period_ns) for s in out], why
    ([(10, 1, 8.0), (11, 2, 16.0)], {'prefill': 2})
    """
    out: list[Span] = []
    why: dict[str, int] = {}
    for p, q in itertools.pairwise(pins):
        first, end = p.step - shift, q.step - shift  # batches first .. end - 1
        if end - first > max_steps:
            why["unpinned"] = why.get("unpinned", 0) + (end - first)
            continue
        got: list[tuple[BatchRequest, ...]] = []
        bad = ""
        for n in range(first, end):
            b = batch.get(n, "unknown")
            if isinstance(b, str):
                bad = b
                break
            got.append(b)
        if bad:
            why[bad] = why.get(bad, 0) + (end - first)
            continue
        out.append(Span(first, tuple(got), q.t_ns - p.t_ns, p.half_ns + q.half_ns, p))
    return out, why
