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

``--fleet default`` (or ``dense``) measures instead the join stage of ``bench serve
--sampling default`` (issue 34): the 9-engine fleet recorded at vLLM's default sampling
(every step sampled with ``dense``), ``--copies`` live copies for ``--seconds`` of data,
decoded up front, then ``push_many`` per export request and a live ``tick`` every
``--tick`` s of data (0.25; the daemon ticks every 1 s, and between ticks a sweep visits
only the engines fed since), flush included: process CPU µs per event, best of ``--repeats``, and the
observations' sha256. With ``--baseline-rev`` the same rendered requests are joined by
that revision's ``coeffd`` (``git archive``) too, each side in its own process,
alternating ``--rounds`` times (a drifting machine hits both); identical digests mean
identical observations.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

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


# Run in a fresh process, with the tree under test first on sys.path (a baseline
# revision's package has no compiled decoder: decoding is not timed). Prints one line:
# "<µs per event> <events> <observations> <sha256>".
_FLEET_RUNNER = """
import hashlib, pickle, sys, time
tree, path, repeats, tick = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if tree:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, tree)
import logging, msgspec, structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from coeffd.joiner import Joiner
from coeffd.receivers.otlp.decode import Decoder
off, bodies = pickle.load(open(path, "rb"))
dec = Decoder()
batches = [(due, dec.decode_bytes(b).records) for due, b in bodies]
best, out = None, []
for _ in range(repeats):
    j, out, nxt, ev = Joiner(), [], batches[0][0], 0
    t = time.process_time()
    for due, recs in batches:
        if due >= nxt:
            out.extend(j.tick(int((due + off) * 1e9)))
            nxt = due + tick
        out.extend(j.push_many(recs))
        ev += len(recs)
    out.extend(j.flush())
    cpu = time.process_time() - t
    best = cpu if best is None else min(best, cpu)
print(1e6 * best / ev, ev, len(out), hashlib.sha256(msgspec.msgpack.encode(out)).hexdigest())
"""


def render_fleet(
    sampling: str, copies: int, seconds: float
) -> tuple[float, list[tuple[float, bytes]]]:
    """``bench serve``'s live replay of the fleet recording (vLLM's default sampling, or
    every step sampled), ``copies`` copies, ``seconds`` of data: the wall-minus-monotonic
    offset of its clock and the export requests with their (monotonic) due times."""
    from bench._fleetsize import DEFAULT_RATES, fleet_specs
    from bench.serve import RATES, LiveSender, record

    default = sampling == "default"
    rec = record(
        fleet_specs(60) if default else "fleet", 60, 1, DEFAULT_RATES if default else RATES
    )
    sender = LiveSender(1, rec)  # the channel connects lazily: nothing is sent
    try:
        plan = sender.plan(copies * rec.total / (sender.duration_ns / 1e9))
        off = time.time() - time.monotonic()
        due, body, _ = next(plan)
        end, out = due + seconds, []
        while due <= end:
            out.append((due, body))
            due, body, _ = next(plan)
    finally:
        sender.close()
    return off, out


def fleet_main(args: argparse.Namespace) -> int:
    """``--fleet``: the join stage on the fleet recording, this tree vs ``--baseline-rev``."""
    from bench.serve import old_http_tree

    with tempfile.TemporaryDirectory(prefix="coeffd-bench-joiner-") as tmp:
        path = Path(tmp) / "bodies.pkl"
        off, bodies = render_fleet(args.fleet, args.copies, args.seconds)
        path.write_bytes(pickle.dumps((off, bodies)))
        trees = {"this tree": ""}
        if args.baseline_rev:
            root, commit = old_http_tree(Path(tmp), args.baseline_rev)
            trees[commit] = str(root)
        print(
            f"joiner, fleet at {args.fleet} sampling: {args.copies} live copies, "
            f"{args.seconds:.0f} s of data, {len(bodies):,} export requests, a tick every "
            f"{args.tick:g} s of data; best of "
            f"{args.repeats} per process, {args.rounds} alternating rounds",
            flush=True,
        )
        best: dict[str, float] = {}
        digest: dict[str, str] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                line = subprocess.run(
                    [sys.executable, "-c", _FLEET_RUNNER, tree, str(path), str(args.repeats),
                     str(args.tick)],
                    capture_output=True, text=True, check=True,
                ).stdout.split()  # fmt: skip
                us, events, obs, sha = float(line[0]), int(line[1]), int(line[2]), line[3]
                print(
                    f"  {name:>10}: {us:6.2f} µs/event ({events:,} events, {obs:,} observations) sha256 {sha[:16]}",
                    flush=True,
                )
                best[name] = min(best.get(name, us), us)
                digest[name] = sha
    for name, us in best.items():
        print(f"{name:>12}: {us:6.2f} µs/event best")
    if len(best) == 2:
        (a, ua), (b, ub) = best.items()
        same = "identical" if digest[a] == digest[b] else "DIFFERENT"
        print(f"{a} = {ua / ub:.2f}× {b}; observations {same}")
        return 0 if digest[a] == digest[b] else 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print events/s, ratios and memory per in-flight request."""
    p = argparse.ArgumentParser(prog="python -m bench joiner", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=40_000)
    p.add_argument("--in-flight", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fleet", choices=("default", "dense"), default=None,
                   help="join bench serve's fleet recording instead (module docstring)")  # fmt: skip
    p.add_argument("--copies", type=int, default=10, help="--fleet: live copies")
    p.add_argument("--seconds", type=float, default=40.0, help="--fleet: seconds of data")
    p.add_argument("--rounds", type=int, default=2, help="--fleet: alternating rounds")
    p.add_argument("--tick", type=float, default=0.25, help="--fleet: seconds of data per tick")
    p.add_argument("--baseline-rev", default=None, help="--fleet: also join with this revision")
    args = p.parse_args(argv)
    if args.fleet:
        return fleet_main(args)

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
