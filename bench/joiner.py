"""``python -m bench joiner``: joiner throughput (events/s, one core) and memory per
in-flight request, vs baselines measured in the same run.

Workload: a vLLM-shaped stream for one engine. Each request contributes its ``llm_core``
export (span + QUEUED, SCHEDULED, FIRST_TOKEN, FINISHED) and its ``llm_request`` export
(span + ARRIVED, HANDOFF, FIRST_RESPONSE, DEPARTED); a ``scheduler_steps`` export with
summaries arrives every 100 steps. The API exports trail the core exports by
``--in-flight`` requests, so that many half-joined requests are held at steady state
(a request is in flight from its first record to its observation).

Measured on process CPU time, best of ``--repeats``:

* **joiner**: ``Joiner.push_many`` per export batch (what the pipeline consumer does);
* **iterate**: the bare cost of walking the same batches and dispatching on record type;
* **dict-insert**: walking them and inserting every record into a dict keyed by its span
  (the least any join must do).

Memory: ``tracemalloc`` growth of the joiner's own structures at steady state (records
are pre-built and shared, so this is the window's overhead) divided by the requests in
flight. Target: ≥ 300,000 events/s per core.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    Record,
    RequestSpan,
    Source,
    SpanInfo,
    StepSpan,
)

US = 1_000
MS = 1_000_000
OFF = 1_767_220_600_000_000_000  # wall - mono on this (single) host
SRC = Source("bench-engine", (("service.name", "bench"),))


def _core_batch(i: int, q: int, step_period: int, t0: int) -> list[Record]:
    tid = i.to_bytes(16, "big")
    api_sid = (2 * i + 1).to_bytes(8, "big")
    sid = (2 * i + 2).to_bytes(8, "big")
    t_q = t0 + i * 2 * MS
    n = q
    info = SpanInfo(
        tid, sid, api_sid, "llm_core", "vllm.scheduler", SRC, t_q + OFF, t_q + OFF + 60 * MS
    )
    rid = f"chatcmpl-{i:016x}-{i & 0xFFFFFFFF:08x}"
    ev = []
    for kind, dt, step, extra in (
        (JourneyKind.QUEUED, 0, n, {}),
        (JourneyKind.SCHEDULED, 100 * US, n + 1, {"schedule_kind": "FIRST"}),
        (JourneyKind.FIRST_TOKEN, 2 * step_period, n + 1, {}),
        (JourneyKind.FINISHED, 6 * step_period, n + 5, {"finish_status": "stopped"}),
    ):
        t = t_q + dt
        ev.append(
            JourneyEvent(info, kind, t + OFF, t, step, "DECODE", 64, 64, 5, 16, 0, **extra)  # type: ignore[arg-type]
        )
    return [CoreSpan(info, rid), *ev]


def _api_batch(i: int, t0: int, step_period: int) -> list[Record]:
    tid = i.to_bytes(16, "big")
    api_sid = (2 * i + 1).to_bytes(8, "big")
    t_q = t0 + i * 2 * MS
    t_a = t_q - 800 * US
    info = SpanInfo(
        tid, api_sid, b"", "llm_request", "vllm.api", SRC, t_a + OFF, t_q + OFF + 61 * MS
    )
    span = RequestSpan(
        info, f"chatcmpl-{i:016x}", route="/v1/chat/completions", prompt_tokens=64, n=1
    )
    evs = [
        ApiEvent(info, k, t + OFF, t)
        for k, t in (
            (ApiKind.ARRIVED, t_a),
            (ApiKind.HANDOFF_TO_CORE, t_a + 40 * US),
            (ApiKind.FIRST_RESPONSE_FROM_CORE, t_q + 2 * step_period + 500 * US),
            (ApiKind.DEPARTED, t_q + 6 * step_period + 900 * US),
        )
    ]
    return [span, *evs]


def _step_batch(k: int, t0: int, step_period: int) -> list[Record]:
    start = k * 100 + 1
    end = start + 99
    info = SpanInfo(
        k.to_bytes(16, "big") + b"s",
        (10**12 + k).to_bytes(8, "big"),
        b"",
        f"scheduler_steps_{k}",
        "vllm.scheduler.step",
        SRC,
        t0 + OFF + start * step_period,
        t0 + OFF + end * step_period,
    )
    recs: list[Record] = [StepSpan(info, k + 1, start, 100, end)]
    for n in (start + 10, start + 50):  # p = 0.02
        s = t0 + n * step_period
        recs.append(
            BatchSummary(
                info,
                s + OFF + 300 * US,
                n,
                s,
                s + 250 * US,
                250,
                40,
                10,
                1,
                39,
                140,
                100,
                39,
                0,
                0,
                0.3,
                8192,
                5000,
            )
        )
    return recs


def build_stream(n_requests: int, in_flight: int) -> list[list[Record]]:
    """Export batches in delivery order with ``in_flight`` half-joined requests."""
    step_period = 1 * MS  # 2 steps per request arrival (2 ms apart)
    t0 = 5000 * 10**9
    batches: list[list[Record]] = []
    next_step_batch = 0
    for i in range(n_requests + in_flight):
        if i < n_requests:
            q = (i * 2 * MS) // step_period
            batches.append(_core_batch(i, q, step_period, t0))
            while (next_step_batch + 1) * 100 < q:
                batches.append(_step_batch(next_step_batch, t0, step_period))
                next_step_batch += 1
        j = i - in_flight
        if j >= 0:
            batches.append(_api_batch(j, t0, step_period))
    return batches


def _cpu(fn: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print events/s, ratios and memory per in-flight request."""
    p = argparse.ArgumentParser(prog="python -m bench joiner", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=40_000)
    p.add_argument("--in-flight", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    batches = build_stream(args.requests, args.in_flight)
    n_events = sum(len(b) for b in batches)
    # the window must hold the in-flight requests (one arrival per 2 ms of data time)
    cfg = JoinerConfig(
        window_s=args.in_flight * 0.002 + 5.0, max_requests=4 * args.in_flight + 1000
    )
    obs_count = [0]

    def run_joiner() -> None:
        j = Joiner(cfg)
        n = 0
        for b in batches:
            n += len(j.push_many(b))
        n += len(j.flush())
        obs_count[0] = n

    dispatch: dict[type, int] = {
        t: 1 for t in (JourneyEvent, ApiEvent, BatchSummary, CoreSpan, RequestSpan, StepSpan)
    }

    def run_iterate() -> None:
        d = dispatch
        for b in batches:
            for r in b:
                d.get(type(r))

    def run_dict() -> None:
        held: dict[tuple[bytes, bytes], list[Record]] = {}
        for b in batches:
            for r in b:
                si = r.span  # type: ignore[union-attr]
                k = (si.trace_id, si.span_id)
                lst = held.get(k)
                if lst is None:
                    held[k] = [r]
                else:
                    lst.append(r)

    t_j = _cpu(run_joiner, args.repeats)
    t_i = _cpu(run_iterate, args.repeats)
    t_d = _cpu(run_dict, args.repeats)

    # memory at steady state: stop right after the in-flight window has filled
    tracemalloc.start()
    j = Joiner(cfg)
    base = tracemalloc.get_traced_memory()[0]
    peak_mem = 0
    for k, b in enumerate(batches):
        j.push_many(b)
        if k % 2000 == 0:
            peak_mem = max(peak_mem, tracemalloc.get_traced_memory()[0] - base)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    ev_s = n_events / t_j
    print(f"events: {n_events:,}  observations: {obs_count[0]:,}  requests: {args.requests:,}")
    print(f"{'joiner':14s} {ev_s:>12,.0f} events/s  (target >= 300,000)")
    print(
        f"{'iterate':14s} {n_events / t_i:>12,.0f} events/s  joiner costs {t_j / t_i:5.1f}x bare iteration"
    )
    print(
        f"{'dict-insert':14s} {n_events / t_d:>12,.0f} events/s  joiner costs {t_j / t_d:5.1f}x a dict insert per record"
    )
    # The stream holds --in-flight half-joined requests at steady state by construction;
    # the joiner's own indexes split a request's records across several maps (one of
    # them counted 798 of the 10,000 here), so none of their sizes is the denominator.
    print(
        f"memory: peak {peak / 2**20:.1f} MiB traced (incl. transient); window structures "
        f"{peak_mem / 2**20:.1f} MiB with {args.in_flight:,} requests in flight = "
        f"{peak_mem / max(args.in_flight, 1):,.0f} B per in-flight request (records themselves shared)"
    )
    return 0
