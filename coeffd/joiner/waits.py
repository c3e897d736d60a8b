"""Sampled steps whose batch outlives the join window, held for the journeys it still needs.

A request's journey (its ``llm_core`` span) is exported only when the request ends, so a
step's batch can be rebuilt from journeys (:func:`.composition.from_lives`) only once
every request in it has ended. With ~28 ms steps a long generation outlives the 30 s
window of the step's period by far: at every-step sampling 58 % of Mixtral-8x7B's steps
reached the window with some of their requests still running, and left with the
summary's totals alone, whose decode context (estimated from the KV blocks in use) reads
12 % low under prefix sharing and biased the learned step time by 1 %.

Only what the composition needs is held: the observation already built at the window
(period, anchors, aggregates: none of that waits), the summary's totals, and the lives
covering the step so far (the engine's own index of lives forgets the step's bucket at
the window). Each later life covering a held step is counted against it; when as many
requests are known as the summary scheduled, the batch is rebuilt and the observation
leaves with it (``completed``), or with its totals when they disagree (``mismatch``). A
life that can never be rebuilt in it (preempted, aborted, a later prefill chunk) ends the
wait at once (``unusable``); the deadline (``joiner.composition_wait_s`` after the summary) ends it
with the totals (``expired``), as the window did before; at the cap per engine
(``joiner.max_composition_waits``) the oldest leaves with its totals (``capacity``); at
the end of the stream, or when the engine restarts or is forgotten, every held step leaves
with its totals (``ended``). Every outcome is counted (``coeffd_composition_waits_total``);
none is dropped.

Where journeys are sampled (a per-request draw below 1), most batches lack some journeys
for good, and waiting would only delay their steps and hold memory: once far more waits
have expired than completed, only one step in ``_PROBE`` waits, so that an engine whose
journeys are complete again (after an outage lost some) soon proves it.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import msgspec

from coeffd.joiner.composition import Life, from_lives, life_part
from coeffd.records.events import BatchSummary
from coeffd.records.observations import BatchRequest, Composition, StepObservation

_PROBE = 64  # 1 in this many steps waits while waits mostly expire
_SLACK = 64  # expired waits tolerated before completions must outnumber them 1:4


@dataclass(slots=True)
class _Held:
    obs: StepObservation  # as built at the window, with the summary's totals
    summary: BatchSummary
    lives: list[Life]  # covering the step, each counted once
    unknown: int  # lives whose token count is unknown (admissions): one at most
    deadline: int  # wall ns of the engine's clock


class CompositionWaits:
    """The held steps of one engine.

    >>> w = CompositionWaits(wait_ns=10, cap=4)
    >>> bool(w), w.due(0), w.released
    (False, None, [])
    """

    def __init__(self, wait_ns: int, cap: int) -> None:
        self.wait_ns = wait_ns
        self.cap = cap
        self.held: dict[int, _Held] = {}
        # the held steps, sorted: a life finds the ones it covers by bisection, so a
        # finished request costs a comparison when none is held in its range
        self.steps: list[int] = []
        # (deadline, step); an entry whose step has left is skipped when it comes up
        self.heap: list[tuple[int, int]] = []
        #: (observation, outcome) that left, for the joiner to emit and count, in order
        self.released: list[tuple[StepObservation, str]] = []
        self.completed = 0  # waits ended by the journeys (exact batches)
        self.expired = 0  # waits ended by their deadline
        self._declined = 0

    def __bool__(self) -> bool:
        return bool(self.held)

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, obs: StepObservation, summary: BatchSummary, covering: list[Life]) -> bool:
        """Hold ``obs`` (composed from the totals at the window) when the journeys still
        to come can complete its batch: fewer lives cover the step than the summary
        scheduled, and each of them can be rebuilt in it. False when they cannot (a
        request in it that no journey can rebuild, or more lives than requests): the
        caller emits it as it is."""
        need = summary.num_prefill_reqs + summary.num_decode_reqs
        if len(covering) >= need:
            return False
        n = summary.step
        unknown = 0
        for life in covering:
            part = life_part(life, n)
            if part < 0:
                return False
            unknown += part
        if unknown > 1:
            return False
        if self.expired > 4 * self.completed + _SLACK:
            self._declined += 1
            if self._declined % _PROBE:
                return False
        if len(self.held) >= self.cap:
            self._release_oldest("capacity")
        deadline = summary.wall_ns + self.wait_ns
        self.held[n] = _Held(obs, summary, list(covering), unknown, deadline)
        steps = self.steps
        if not steps or steps[-1] < n:
            steps.append(n)
        else:
            bisect.insort(steps, n)
        heap = self.heap
        heapq.heappush(heap, (deadline, n))
        if len(heap) > 2 * len(self.held) + 64:  # mostly steps completed before their deadline
            self.heap = [(h.deadline, k) for k, h in self.held.items()]
            heapq.heapify(self.heap)
        return True

    def add_life(self, life: Life) -> None:
        """A request finished: count it in the held steps it ran in, and release those it
        completes or makes impossible."""
        steps = self.steps
        if not steps or life.first > steps[-1] or life.last < steps[0]:
            return
        lo = bisect.bisect_left(steps, life.first)
        hi = bisect.bisect_right(steps, life.last, lo)
        if lo == hi:
            return
        held = self.held
        left = False
        for n in steps[lo:hi]:
            h = held[n]
            part = life_part(life, n)
            if part < 0 or h.unknown + part > 1:
                self._release(n, h, None, "unusable")
                left = True
                continue
            h.lives.append(life)
            h.unknown += part
            if len(h.lives) == h.summary.num_prefill_reqs + h.summary.num_decode_reqs:
                reqs = from_lives(h.summary, h.lives)
                self._release(n, h, reqs, "completed" if reqs is not None else "mismatch")
                left = True
        if left:
            steps[lo:hi] = [n for n in steps[lo:hi] if n in held]

    def due(self, now_wall: int) -> None:
        """Release the held steps whose deadline has passed on the engine's clock."""
        heap, held = self.heap, self.held
        gone = False
        while heap and heap[0][0] <= now_wall:
            deadline, n = heapq.heappop(heap)
            h = held.get(n)
            if h is not None and h.deadline == deadline:
                self._release(n, h, None, "expired")
                gone = True
        if gone:
            self.steps = [n for n in self.steps if n in held]

    def release_all(self) -> None:
        """Release every held step with what it has (end of stream, engine restarted or
        forgotten: no more journeys will come for it)."""
        for n in sorted(self.held, key=lambda k: (self.held[k].deadline, k)):
            self._release(n, self.held[n], None, "ended")
        self.steps.clear()
        self.heap.clear()

    def _release_oldest(self, how: str) -> None:
        heap, held = self.heap, self.held
        while heap:
            deadline, n = heapq.heappop(heap)
            h = held.get(n)
            if h is not None and h.deadline == deadline:
                self._release(n, h, None, how)
                del self.steps[bisect.bisect_left(self.steps, n)]
                return

    def _release(self, n: int, h: _Held, reqs: tuple[BatchRequest, ...] | None, how: str) -> None:
        """Take ``n`` off the held steps (``self.steps`` is the caller's to update)."""
        del self.held[n]
        if how == "completed":
            self.completed += 1
        elif how == "expired":
            self.expired += 1
        obs = h.obs
        if reqs is not None:
            obs = msgspec.structs.replace(obs, composition=Composition.JOURNEYS, requests=reqs)
        self.released.append((obs, how))
