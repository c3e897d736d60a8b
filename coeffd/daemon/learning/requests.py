"""The finished requests of each configuration, kept for ``coeffd trace`` (issue 31).

BLIS judges latency coefficients on recorded traffic: ``blis replay`` runs a TraceV2 trace
through the simulator and ``blis calibrate`` compares its TTFT and E2E with the recorded
ones. The joiner already measures every request's arrival, first token, first response,
departure and token counts (:class:`~coeffd.records.observations.RequestObservation`);
this module keeps the newest of them per configuration in a bounded ring, and the step
summaries' KV size (``kv_blocks_total_gpu``, BLIS's ``--total-kv-blocks``), so
``GET /v1/requests/{config}`` (:mod:`coeffd.daemon.requests_api`) can hand them out.

Bounds (``[trace]`` settings): at most ``max_requests`` per configuration (oldest out) and
none that departed more than ``max_age_seconds`` before the newest one; each entry is a
tuple of ints and shared strings, 274 bytes (``bench calibrate`` measures it: 13 MiB
per configuration at the default 50,000). Ages are in the data's own time (the
requests' wall clocks), so a replay of old files keeps what it read.

Every request that reached the joiner is kept, learned or shed: an aborted one with status
``error``, one that never finished with ``incomplete`` (TraceV2's statuses), never
dropped silently. The writer thread of the HTTP API reads while the pipeline worker
appends, so both hold a lock (one append per request, cheap beside learning it).
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from coeffd.learners.features.config import ServingConfig
from coeffd.records.observations import Observation, RequestObservation, StepObservation

__all__ = ["FinishedRequest", "RequestRing", "status_of"]


class FinishedRequest(NamedTuple):
    """One request as a TraceV2 row needs it; times in µs of the API server's wall clock.

    ``first_response_us`` / ``departure_us`` are 0 when the request never got there.
    """

    arrival_us: int
    first_response_us: int
    departure_us: int
    input_tokens: int
    output_tokens: int
    status: str  # "ok", "error" (aborted), "incomplete" (no FINISHED)
    finish_reason: str  # vLLM's finish status ("stop", "length", "abort"), "" unknown
    streaming: bool


#: vLLM's FINISHED statuses that end a request normally (spec: stopped, length, aborted,
#: ignored, error).
_OK = frozenset({"stopped", "length", "stop"})


def status_of(finish_status: str | None, departed: bool = True) -> str:
    """TraceV2's status: ``ok`` for a request that finished normally and departed,
    ``error`` for one vLLM aborted, ignored or failed, ``incomplete`` for one that never
    finished or never departed (the client got no whole answer).

    >>> status_of("stopped"), status_of("aborted"), status_of(None), status_of("length", False)
    ('ok', 'error', 'incomplete', 'incomplete')
    """
    if finish_status is None:
        return "incomplete"
    if finish_status.lower() not in _OK:
        return "error"
    return "ok" if departed else "incomplete"


def finished_request(obs: RequestObservation) -> FinishedRequest | None:
    """The ring's entry for ``obs``; None without an arrival wall clock (older joiners)."""
    if obs.arrival_wall_ns is None:
        return None
    arrival = obs.arrival_wall_ns // 1000
    first = 0
    if obs.ttft_us is not None:
        # what the client saw first: the response after the first token (BLIS's TTFT
        # includes that output processing, α2); measured for streaming requests only
        first = arrival + round(obs.ttft_us + (obs.first_token_to_response_us or 0.0))
    departure = arrival + round(obs.e2e_us) if obs.e2e_us is not None else 0
    status = status_of(obs.finish_status, departure > 0)
    return FinishedRequest(
        arrival,
        first,
        departure,
        obs.prompt_tokens,
        obs.output_tokens,
        sys.intern(status),
        sys.intern(obs.finish_status or ""),
        bool(obs.streaming),
    )


class RequestRing:
    """Per configuration: the newest finished requests and the engine's KV size.

    >>> ring = RequestRing(max_requests=2)
    >>> for i in range(3):
    ...     ring.add("c", FinishedRequest(i * 10**6, i * 10**6 + 5, i * 10**6 + 9, 8, 2, "ok", "stop", True))
    >>> [r.arrival_us for r in ring.requests("c")]
    [1000000, 2000000]
    """

    def __init__(self, max_requests: int = 50_000, max_age_seconds: float = 3600.0) -> None:
        self.max_requests = max_requests
        self.max_age_us = int(max_age_seconds * 1e6)
        self._rings: dict[str, collections.deque[FinishedRequest]] = {}
        self._kv_blocks: dict[str, int] = {}
        self._configs: dict[str, ServingConfig] = {}
        self._lock = threading.Lock()
        #: requests seen without an arrival wall clock (not kept)
        self.unusable = 0

    def observe(self, config: ServingConfig, obs: Observation) -> None:
        """The consumer's hook: keep a request, note a step summary's KV size."""
        config_id = config.id
        if config_id not in self._configs:
            self._configs[config_id] = config
        if isinstance(obs, RequestObservation):
            entry = finished_request(obs)
            if entry is None:
                self.unusable += 1
            else:
                self.add(config_id, entry)
        elif isinstance(obs, StepObservation):
            total = obs.aggregates.kv_blocks_total_gpu
            if total > 0:
                self._kv_blocks[config_id] = total

    def observe_steps(self, config: ServingConfig, steps: Sequence[StepObservation]) -> None:
        """:meth:`observe` of a burst of one configuration's steps: only the last step
        with a KV size counts, so it is looked for from the end (one attribute read per
        burst, not per step).

        >>> from coeffd.learners.features.config import ServingConfig
        >>> ring = RequestRing()
        >>> ring.observe_steps(ServingConfig(model="m", gpu="H100"), [])
        >>> ring.facts(ServingConfig(model="m", gpu="H100").id)
        {}
        """
        config_id = config.id
        if config_id not in self._configs:
            self._configs[config_id] = config
        for obs in reversed(steps):
            total = obs.aggregates.kv_blocks_total_gpu
            if total > 0:
                self._kv_blocks[config_id] = total
                return

    def add(self, config_id: str, entry: FinishedRequest) -> None:
        if self.max_requests <= 0:
            return
        with self._lock:
            ring = self._rings.get(config_id)
            if ring is None:
                ring = self._rings[config_id] = collections.deque(maxlen=self.max_requests)
            ring.append(entry)
            horizon = (entry.departure_us or entry.arrival_us) - self.max_age_us
            while ring and (ring[0].departure_us or ring[0].arrival_us) < horizon:
                ring.popleft()

    def requests(self, config_id: str, since_s: float | None = None) -> list[FinishedRequest]:
        """The kept requests of ``config_id`` by arrival; with ``since_s`` only those that
        arrived at most that long before the newest departure."""
        with self._lock:
            rows = list(self._rings.get(config_id, ()))
        rows.sort(key=lambda r: r.arrival_us)
        if since_s is not None and rows:
            newest = max(r.departure_us or r.arrival_us for r in rows)
            start = newest - int(since_s * 1e6)
            rows = [r for r in rows if r.arrival_us >= start]
        return rows

    def configurations(self) -> list[str]:
        with self._lock:
            return sorted(self._rings)

    def description(self, config_id: str) -> dict[str, Any] | None:
        """What ``config_id`` stands for, with :meth:`facts`; None when never seen."""
        cfg = self._configs.get(config_id)
        return None if cfg is None else cfg.to_dict() | self.facts(config_id)

    def facts(self, config_id: str) -> dict[str, int]:
        """What the step summaries say about the engine (for snapshot descriptions)."""
        total = self._kv_blocks.get(config_id)
        return {"kv_blocks_total_gpu": total} if total else {}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._rings.values())
