"""``python -m bench pipeline``: CPU cost per event of the daemon's pipeline, stage by
stage, in one process: no gRPC, no sender, no scheduler noise from a second process.

``bench serve`` answers "how many events/s does the daemon sustain"; this one answers
"where does each event's CPU go", which is what an optimisation changes. The workload is
``bench serve``'s live replay — ``K`` phase-shifted copies of a 60 s recording of the
9-engine fleet, every step sampled, data time spanning the join window — rendered to
export-request bytes up front. Each variant then processes the same bytes, ticking every
0.25 s of data time, and is timed (process CPU time) over the part after the first
``--warm`` seconds of data (the join window fills first). Best of ``--repeats``.

Variants, each including the previous one's work:

* **decode** (the baseline): ``Decoder.decode_bytes`` of every request, shedding at the
  consumer's 1/32 floor (shed steps' summaries are decoded partially);
* **join**: + the joiner (``push_many`` and ticks) at that floor;
* **learn (shed)**: the learning consumer at that floor: + learning 1/32 of the steps and
  requests, scoring, publishing snapshots (written by its writer thread, whose CPU counts
  too) — what a saturated daemon does per event;
* **learn (all)**: the learning consumer learning every step and request (no shedding,
  full decode);
* **sampled 1/8**: learn (shed) with engine sampling at a share of 1/8 (and each
  configuration's floor of 2 engines): the decoder skips the other engines' requests,
  counting their spans and events — per *received* event, what a daemon behind a large
  fleet spends.

Publishing and ticking cost per second of data, not per event, so they weigh more at
fewer copies.

The ceiling printed is ``1 / cost``: events/s one core could process at 100 % with no
receiving cost; ``bench serve`` measures what the receivers add.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bench.serve import RATES, LiveSender, record
from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.load import EngineSampler, LoadController, LoadShedder
from coeffd.daemon.settings import load_settings
from coeffd.joiner import Joiner
from coeffd.receivers.otlp.decode import Decoder

TICK_S = 0.25
TARGET = 150_000  # issue 7: events/s end to end on one core
SAMPLED = "sampled 1/8"

Body = tuple[float, bytes, int]  # (data time s, request bytes, events)


def render(copies: int, seconds: float, quick: bool) -> list[Body]:
    """``copies`` phase-shifted live copies of the recording, ``seconds`` of data time."""
    rec = record("fleet", 30.0 if quick else 60.0, 1, RATES)
    sender = LiveSender(1, rec)  # the channel connects lazily: nothing is sent
    try:
        plan = sender.plan(copies * rec.total / (sender.duration_ns / 1e9))
        out: list[Body] = []
        due, body, n = next(plan)
        end = due + seconds
        while due <= end:
            out.append((due, body, n))
            due, body, n = next(plan)
    finally:
        sender.close()
    return out


def _floor_load() -> LoadController:
    """A load controller at the consumer's 1/32 floor (a full queue), set quietly."""
    shedder = LoadShedder(0.1, 0.5, 1 / 32, 0.0)
    shedder.update(1.0)  # a full queue: the floor
    load = LoadController(shedder=shedder)
    load.step_filter = shedder.keep
    return load


def _sampler(share: float) -> EngineSampler:
    """An engine sampler held at ``share`` (its floor of 2 engines per configuration)."""
    t = [0.0]
    sampler = EngineSampler(min_share=share, clock=lambda: t[0], cpu_clock=lambda: 0.0)
    while sampler.share > share:
        t[0] += 1.0
        sampler.update(1.0, 1 / 32)
    return sampler


def run_variant(name: str, bodies: list[Body], warm_s: float, tmp: Path) -> tuple[float, int]:
    """CPU seconds and events of the measured part of one pass of ``name``."""
    dec = Decoder()
    offset = time.time() - bodies[0][0]  # data wall time = plan time + offset
    handle: Callable[[list[Any]], object] = lambda records: None  # noqa: E731
    tick: Callable[[float], object] = lambda now: None  # noqa: E731
    close: Callable[[], object] = lambda: None  # noqa: E731
    if name in ("decode", "join"):
        load = _floor_load()
        dec.step_filter = load.step_filter
    if name == "join":
        joiner = Joiner(load=load)
        handle = joiner.push_many
        tick = lambda now: joiner.tick(int(now * 1e9))  # noqa: E731
    elif name != "decode":
        settings = load_settings(
            overrides={
                "publish": {"snapshot_dir": str(tmp / "snapshots")},
                "state": {"state_dir": str(tmp / "state")},
                # steered by hand below: a constant full queue would keep halving it
                "pipeline": {"sample_engines": False},
            },
            environ={},
        )
        consumer, _ = build_consumer(settings, CollectorRegistry(), live=True)
        shed = name != "learn (all)"
        consumer.backlog = (lambda: 1.0) if shed else (lambda: 0.0)
        consumer.decoders.append(dec)
        if consumer.shedder is not None:
            consumer.shedder.tick_budget_s = 0.0  # the share follows the backlog alone
        handle, tick, close = consumer.consume, consumer.tick, consumer.close
        if name == SAMPLED:
            dec.source_filter = _sampler(1 / 8).keep
    t_measure = bodies[0][0] + warm_s
    next_tick = bodies[0][0]
    c0: float | None = None
    events = 0
    for due, body, n in bodies:
        if c0 is None and due >= t_measure:
            c0 = time.process_time()
        if due >= next_tick:
            tick(due + offset)
            next_tick = due + TICK_S
        handle(dec.decode_bytes(body).records)
        if c0 is not None:
            events += n
    cpu = time.process_time() - (c0 or 0.0)
    close()
    return cpu, events


def main(argv: Sequence[str] | None = None) -> int:
    """Run every variant; print µs/event, ratios to decode-only, and the ceiling."""
    p = argparse.ArgumentParser(prog="python -m bench pipeline", description=__doc__.split("\n")[0])
    p.add_argument("--copies", type=int, default=20, help="live copies of the recording (K)")
    p.add_argument("--warm", type=float, default=32.0, help="data seconds before measuring")
    p.add_argument("--seconds", type=float, default=15.0, help="data seconds measured")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="fewer copies, shorter, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.copies, args.warm, args.seconds, args.repeats = 10, 32.0, 8.0, 1
    bodies = render(args.copies, args.warm + args.seconds, args.quick)
    rate = sum(n for _, _, n in bodies) / (bodies[-1][0] - bodies[0][0])
    print(
        f"pipeline: {args.copies} live copies of the fleet (~{rate:,.0f} events/s of data), "
        f"{args.seconds:.0f} s measured after {args.warm:.0f} s; best of {args.repeats}"
    )
    names = ("decode", "join", "learn (shed)", "learn (all)", SAMPLED)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="coeffd-bench-") as tmp:
        for rep in range(args.repeats):  # interleaved, so drifting machine speed hits all
            for name in names:
                cpu, events = run_variant(name, bodies, args.warm, Path(tmp) / f"{rep}-{name}")
                us = 1e6 * cpu / events
                best[name] = min(best.get(name, us), us)
    base = best["decode"]
    # each variant's increment over the one it builds on
    builds_on = {"join": "decode", "learn (shed)": "join", "learn (all)": "join"}
    for name in names:
        us = best[name]
        step = (
            f"{us / best['learn (shed)']:.2f}× learn (shed)"
            if name == SAMPLED
            else f"+{us - best.get(builds_on.get(name, ''), 0.0):5.2f} µs"
        )
        print(
            f"  {name:<13} {us:6.2f} µs/event  = {us / base:4.2f}× decode"
            f"  ({step})  ceiling {1e6 / us:>9,.0f} events/s"
        )
    need = 1e6 / TARGET
    shed, sampled = best["learn (shed)"], best[SAMPLED]
    print(
        f"  target {TARGET:,} events/s end to end needs ≤ {need:.2f} µs/event including "
        f"receiving; joining every engine the learning pipeline alone costs {shed:.2f} "
        f"({shed / need:.1f}× that), sampling engines at 1/8 {sampled:.2f} "
        f"({sampled / need:.2f}× that)"
    )
    return 0 if sampled <= need else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
