"""``python -m bench serve --sampling default``: engines per core learned with nothing shed.

A fleet operator sizes coeffd in engines: how many vLLM engines can one daemon core
learn from — every observation, nothing shed — at vLLM's default sampling (journeys 1.0,
steps 0.01, async scheduling and prefix caching on)? The workload is a base recording of
simfleet's 9-engine fleet at those rates (its one synchronous engine switched to async,
as vLLM ships), replayed live: engine ``u`` of a level replays recorded engine ``u mod 9``
as copy ``u // 9``, at its own phase, under its own engine identity and trace ids, wall
times shifted to when it is sent (~28 events/s per engine).

Each request is rendered from a pre-encoded template by patching bytes (OTLP's ids and
times are fixed width; the engine name is padded to a fixed width; identical to
``simfleet.replica``, tests/bench/test_fleetsize.py): the sender's own ceiling is printed
(~1.5M events/s rendered on its core, i.e. tens of thousands of engines) and so is the
share of its core each level used. A level fails by the daemon — any observation shed
(``coeffd_observations_shed_total``, ``coeffd_learning_keep_ratio`` < 1), engine sampling
(``coeffd_engine_sample_ratio`` < 1, events sampled out), push-back (gRPC
``UNAVAILABLE``) or requests held over 1 s by a daemon slow to acknowledge — or by the
sender (over 1 s late with its core busy), which is reported as such, never as the
daemon's limit. Levels double from ``--start`` engines until one fails, then bisect. The
daemon runs at its defaults except ``joiner.max_engines`` / ``max_requests`` (sized to the
fleet: each level starts new engine identities while a level's daemon keeps the earlier
ones, so the levels of a search can pass the default 4,096) and,
with ``--quick``, ``joiner.window_s = 5`` (each level waits a window before it is
measured; 30 s otherwise).

Measured in the same run: the same search on the daemon of ``--baseline-rev`` (its
``coeffd`` package extracted with ``git archive``), and unless ``--part rate`` the
ingest-only daemon (``pipeline.consumer = "counting"``) and the dense figure (every step
sampled). A bisection's level runs on a fresh daemon after a level it held, as the
doubling levels do. ``--quick --part rate`` (from 64 engines, one bisection, 30 s
recording) takes ~3 minutes. Targets (issue 34): ≥ 1,000 engines per core, ≥ 5× the
baseline revision.

Measured 2026-11-28 (``--quick --part rate``, 2 shared cores under load 7–9): this tree
512–768 engines per core, 1,024 falling behind; 7e2957b held no level (its wall-clock
tick rule sheds from 32 engines on a loaded machine; 96–128 at load 4–5, when this tree
held 384): both targets missed; ingest-only 1,536–3,072; every step sampled 8
(bench/README.md has the runs).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import heapq
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.serve import EXPORT, DaemonProc, Recording, _pin, old_http_tree, record
from coeffd.simfleet import SampleRates, build

DEFAULT_RATES = SampleRates(1.0, 0.01, 0.001, 100)  # vLLM's defaults (spec §3)
DENSE_RATES = SampleRates(1.0, 1.0, 0.02, 100)  # bench serve's recording: every step
BASELINE_REV = "7e2957b"  # main before issue 34's work
TAG_DIGITS = 10  # the engine-name suffix patched per copy: "~" + 10 digits
LAG_LIMIT_S = 1.0
SHORT_EVENTS = 100_000  # a level's deliveries are judged over at least this many events
SENDER_BUSY = 0.5  # a sender using more of its core than this may be what is late
ENGINES_TARGET = 1_000
RATIO_TARGET = 5.0


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes, i: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each field's payload in ``buf[i:end]``."""
    while i < end:
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            j = _varint(buf, i)[1]
        elif wire == 1:
            j = i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            j = i + n
        elif wire == 5:
            j = i + 4
        else:
            raise ValueError(f"wire type {wire} in an OTLP request")
        yield key >> 3, i, j
        i = j


class Template:
    """One export request pre-encoded, with the byte offsets :func:`replica` rewrites.

    :meth:`render` gives the bytes of ``replica(req, tag, shift)`` with the engine name
    suffixed by ``tag`` zero-padded to :data:`TAG_DIGITS` (fixed width, so no length
    changes): trace ids' first 4 bytes and span/parent ids' first 2 bytes tagged, every
    span and event time (``fixed64``) shifted.
    """

    def __init__(self, req: ExportTraceServiceRequest) -> None:
        padded = ExportTraceServiceRequest()
        padded.CopyFrom(req)
        for rs in padded.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key == "coeffd.engine":
                    kv.value.string_value += "~" + "0" * TAG_DIGITS
        self.data = np.frombuffer(padded.SerializeToString(), np.uint8)
        trace: list[int] = []
        span: list[int] = []
        times: list[int] = []
        engine: list[int] = []
        buf = self.data.tobytes()
        for f, a, b in _fields(buf, 0, len(buf)):
            if f == 1:
                self._resource_spans(buf, a, b, trace, span, times, engine)
        self.trace = np.array(trace, np.intp)[:, None] + np.arange(4)
        self.span = np.array(span, np.intp)[:, None] + np.arange(2)
        self.times = np.array(times, np.intp)[:, None] + np.arange(8)
        self.engine = np.array(engine, np.intp)[:, None] + np.arange(TAG_DIGITS)

    @staticmethod
    def _resource_spans(
        buf: bytes, a: int, b: int, trace: list[int], span: list[int], times: list[int],
        engine: list[int],
    ) -> None:  # fmt: skip
        for f, a2, b2 in _fields(buf, a, b):
            if f == 1:  # Resource.attributes: KeyValue{key 1, value 2: AnyValue{string 1}}
                for f3, a3, b3 in _fields(buf, a2, b2):
                    kv = dict((k, (s, e)) for k, s, e in _fields(buf, a3, b3)) if f3 == 1 else {}
                    if kv and buf[slice(*kv[1])] == b"coeffd.engine":
                        e = next(e for k, _, e in _fields(buf, *kv[2]) if k == 1)
                        engine.append(e - TAG_DIGITS)
            elif f == 2:  # ScopeSpans.spans
                for f3, a3, b3 in _fields(buf, a2, b2):
                    if f3 == 2:
                        Template._span(buf, a3, b3, trace, span, times)

    @staticmethod
    def _span(
        buf: bytes, a: int, b: int, trace: list[int], span: list[int], times: list[int]
    ) -> None:
        for f, s, e in _fields(buf, a, b):
            if f == 1:
                trace.append(s)
            elif f in (2, 4) and e > s:  # span id, parent span id (when set)
                span.append(s)
            elif f in (7, 8):  # start, end time (fixed64)
                times.append(s)
            elif f == 11:  # Span.Event: time_unix_nano (fixed64) is field 1
                times.extend(s2 for f2, s2, _ in _fields(buf, s, e) if f2 == 1)

    def render(self, tag: int, shift_ns: int) -> bytes:
        out = self.data.copy()
        t = tag.to_bytes(4, "big")
        out[self.trace] = np.frombuffer(t, np.uint8)
        out[self.span] = np.frombuffer(t[2:], np.uint8)
        out[self.engine] = np.frombuffer(f"{tag:0{TAG_DIGITS}d}".encode(), np.uint8)
        stamps = out[self.times].view("<i8") + np.int64(shift_ns)
        out[self.times] = stamps.view(np.uint8).reshape(-1, 8)
        return out.tobytes()


@dataclasses.dataclass
class Level:
    """One level's outcome: what was offered, delivered, and what the daemon did."""

    engines: int
    seconds: float
    offered: float
    delivered: float
    pushbacks: int
    lag: float
    sender_busy: float
    shed: float
    sampled_out: float
    keep: float
    share: float
    learned_steps: float
    learned_all: float
    outcomes: dict[str, float]

    @property
    def late(self) -> bool:
        """Requests left over ``LAG_LIMIT_S`` after they were due, or (over enough events
        that the requests' burstiness averages out) under 90 % of the rate delivered."""
        short = self.offered * self.seconds >= SHORT_EVENTS and self.delivered < 0.9 * self.offered
        return self.lag >= LAG_LIMIT_S or short

    @property
    def sender_limited(self) -> bool:
        """Late with the sender's core busy: maybe the sender's limit, not the daemon's."""
        return self.late and self.sender_busy >= SENDER_BUSY

    @property
    def daemon_ok(self) -> bool:
        """Nothing shed or sampled out, no push-back, and no request held up by a daemon
        slow to acknowledge (its receivers wait for the GIL during long ticks)."""
        return (
            self.pushbacks == 0
            and self.shed == 0
            and self.sampled_out == 0
            and self.keep >= 1.0
            and self.share >= 1.0
            and (not self.late or self.sender_limited)
        )

    @property
    def ok(self) -> bool:
        return self.daemon_ok and not self.sender_limited

    def line(self) -> str:
        why = (
            "ok" if self.ok else "SENDER-LIMITED" if self.daemon_ok else "shed, sampled or held up"
        )
        late = self.outcomes.get("late", 0.0)
        return (
            f"  {self.engines:>6,} engines {self.offered:>9,.0f} ev/s"
            f" offered {self.delivered:>9,.0f} delivered  push-backs {self.pushbacks:>3}"
            f"  lag {self.lag:4.2f} s  sender core {self.sender_busy:4.0%}  shed {self.shed:,.0f}"
            f"  sampled out {self.sampled_out:,.0f}  keep {self.keep:.2f}  engines share"
            f" {self.share:.2f}  learned {self.learned_steps:,.0f} steps/s"
            f" ({self.learned_all:,.0f} observations/s)  late {late:,.0f}  {why}"
        )


class FleetSender:
    """``N`` live engines over gRPC. The recording holds ``S`` engines; engine ``u``
    replays recorded engine ``u mod S`` as copy ``u // S``, at a golden-ratio phase of
    the recording; engines added later leave the earlier ones running (same identities).
    A copy starts a new cycle under new identities (a restarted engine: its clocks and
    step numbers start over)."""

    def __init__(self, port: int, rec: Recording, templates: list[Template]) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        self.export = self.channel.unary_unary(EXPORT)
        self.rec, self.templates = rec, templates
        ends = [_end_ns(r) - rec.wall0 for r in rec.requests]
        self.duration_ns = max(ends) + 1_000_000_000
        by: dict[str, list[int]] = {}
        for i, r in enumerate(rec.requests):
            by.setdefault(_engine_of(r), []).append(i)
        self.streams = [sorted(ix, key=ends.__getitem__) for _, ix in sorted(by.items())]
        self.ends = [[ends[i] for i in st] for st in self.streams]
        self.stream_events = [sum(rec.events[i] for i in st) for st in self.streams]
        self.heap: list[tuple[int, int, int, int]] = []  # (due wall ns, engine, cycle, position)
        self.engines = 0
        self.pending: tuple[int, bytes, int] | None = None

    @property
    def rate(self) -> float:
        """Events/s the current engines send on average."""
        n = len(self.streams)
        total = sum(self.stream_events[u % n] for u in range(self.engines))
        return total / (self.duration_ns / 1e9)

    def grow(self, engines: int) -> None:
        """Run ``engines`` engines from now (the new ones mid-stream)."""
        now, d = time.time_ns(), self.duration_ns
        for u in range(self.engines, engines):
            ends = self.ends[u % len(self.streams)]
            lead = int((u * 0.6180339887498949) % 1.0 * d)
            j = bisect.bisect_left(ends, lead)  # its first request ending after the phase
            entry = (
                (now - lead + ends[j], u, 0, j)
                if j < len(ends)
                else (now - lead + d + ends[0], u, 1, 0)
            )
            heapq.heappush(self.heap, entry)
        self.engines = max(self.engines, engines)

    def next(self) -> tuple[int, bytes, int]:
        """(due wall ns, request bytes, events) of the next request due."""
        if self.pending is not None:
            out, self.pending = self.pending, None
            return out
        due, u, c, j = heapq.heappop(self.heap)
        s, k = u % len(self.streams), u // len(self.streams)
        ends = self.ends[s]
        start = due - ends[j]
        i = self.streams[s][j]
        body = self.templates[i].render(k * 1000 + c % 1000, start - self.rec.wall0)
        if j + 1 < len(ends):
            heapq.heappush(self.heap, (start + ends[j + 1], u, c, j + 1))
        else:
            heapq.heappush(self.heap, (start + self.duration_ns + ends[0], u, c + 1, 0))
        return due, body, self.rec.events[i]

    def send(self, seconds: float, window: int = 16) -> tuple[int, int, float, float]:
        """Send for ``seconds``: (events acknowledged, push-backs, worst lag s, sender CPU
        share of its core)."""
        acked = pushbacks = 0
        lag = 0.0
        inflight: collections.deque[tuple[Any, int]] = collections.deque()
        c0, t0 = time.process_time(), time.monotonic()
        stop = time.time_ns() + int(seconds * 1e9)
        due, body, n = self.next()

        def settle(block: bool) -> None:
            nonlocal acked, pushbacks
            while inflight and (block or inflight[0][0].done()):
                fut, k = inflight.popleft()
                try:
                    fut.result(timeout=30)
                    acked += k
                except grpc.RpcError as e:
                    if e.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    ):
                        raise
                    pushbacks += 1
                block = False

        while (now := time.time_ns()) < stop:
            settle(False)
            if len(inflight) >= window:
                settle(True)
            elif due <= now:
                lag = max(lag, (now - due) / 1e9)
                inflight.append((self.export.future(body, timeout=30), n))
                due, body, n = self.next()
            else:
                time.sleep(min((due - now) / 1e9, 0.002))
        settle(True)
        self.pending = (due, body, n)  # drawn, not due yet: the next send starts with it
        busy = (time.process_time() - c0) / max(1e-9, time.monotonic() - t0)
        return acked, pushbacks, lag, busy

    def close(self) -> None:
        self.channel.close()


def _engine_of(req: ExportTraceServiceRequest) -> str:
    for rs in req.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == "coeffd.engine":
                return str(kv.value.string_value)
    return ""


def _end_ns(req: ExportTraceServiceRequest) -> int:
    return max(
        s.end_time_unix_nano for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans
    )


def sender_ceiling(rec: Recording, templates: list[Template], seconds: float = 2.0) -> float:
    """Events/s one core renders (template patch + heap), nothing sent."""
    s = FleetSender(1, rec, templates)  # the channel connects lazily: nothing is sent
    try:
        s.grow(100)
        events, c0 = 0, time.process_time()
        while time.process_time() - c0 < seconds:
            events += s.next()[2]
        return events / (time.process_time() - c0)
    finally:
        s.close()


def fleet_specs(seconds: float) -> list[Any]:
    """simfleet's fleet as vLLM ships it: async scheduling and prefix caching on."""
    return [
        dataclasses.replace(
            s, serving=dataclasses.replace(s.serving, async_scheduling=True, prefix_caching=True)
        )
        for s in build("fleet", seconds)
    ]


class Counters:
    """The daemon's load counters, read before and after a level."""

    def __init__(self, d: DaemonProc) -> None:
        m = d.metrics()
        self.t = time.monotonic()
        self.shed = _sum(m, "coeffd_observations_shed_total")
        self.sampled_out = _sum(m, "coeffd_events_sampled_out_total")
        self.steps = _sum(m, "coeffd_learner_observations_total", target="step_period")
        self.learned = _sum(m, "coeffd_learner_observations_total")
        self.keep = _sum(m, "coeffd_learning_keep_ratio", default=1.0)
        self.share = _sum(m, "coeffd_engine_sample_ratio", default=1.0)
        self.outcomes: dict[str, float] = collections.defaultdict(float)
        for lab, v in m.get("coeffd_join_outcomes_total", []):
            self.outcomes[lab["outcome"]] += v


def _sum(m: dict[str, Any], name: str, default: float = 0.0, **labels: str) -> float:
    rows = [v for lab, v in m.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    return sum(rows) if rows else default


def run_level(
    d: DaemonProc, sender: FleetSender, engines: int, warm: float, seconds: float
) -> Level:
    """Grow to ``engines``, send ``warm`` s (the join window fills), then measure ``seconds``."""
    sender.grow(engines)
    _, push_warm, _, _ = sender.send(warm)
    mid = Counters(d)
    acked, push, lag, busy = sender.send(seconds)
    after = Counters(d)
    dt = after.t - mid.t
    return Level(
        engines=engines,
        seconds=seconds,
        offered=sender.rate,
        delivered=acked / seconds,
        pushbacks=push_warm + push,
        lag=lag,
        sender_busy=busy,
        shed=after.shed - mid.shed,
        sampled_out=after.sampled_out - mid.sampled_out,
        keep=min(mid.keep, after.keep),
        share=min(mid.share, after.share),
        learned_steps=(after.steps - mid.steps) / dt,
        learned_all=(after.learned - mid.learned) / dt,
        outcomes={k: v - mid.outcomes.get(k, 0.0) for k, v in after.outcomes.items()},
    )


@dataclasses.dataclass
class Search:
    """Doubling from ``start`` engines until a level fails, then ``bisect`` halvings."""

    start: int
    bisect: int
    warm: float
    seconds: float


def search(
    name: str, spawn: Callable[[], DaemonProc], rec: Recording, templates: list[Template],
    plan: Search,
) -> tuple[int, bool]:  # fmt: skip
    """The most engines learned with nothing shed; and whether the sender held every level
    it was asked (False: the figure is the sender's limit, not the daemon's)."""
    print(f"\n{name}: levels of {plan.warm:.0f} s warm-up + {plan.seconds:.0f} s measured")
    best, bad, sender_held = 0, 0, True
    engines = plan.start
    d = spawn()
    sender = FleetSender(d.ports["otlp_grpc"], rec, templates)
    try:
        while True:
            # a fresh daemon's first level warms a window longer: its start (learners
            # created, first snapshots) trims the keep ratio for a few seconds
            warm = plan.warm * (2 if engines == plan.start else 1)
            lvl = run_level(d, sender, engines, warm, plan.seconds)
            print(lvl.line(), flush=True)
            sender_held &= not (lvl.daemon_ok and lvl.sender_limited)
            if not lvl.ok:
                bad = engines
                break
            best, engines = engines, engines * 2
    finally:
        sender.close()
        d.stop()
    for _ in range(plan.bisect):
        mid = (best + bad) // 2
        if mid <= best:
            break
        d = spawn()
        sender = FleetSender(d.ports["otlp_grpc"], rec, templates)
        try:
            # as on the way up, the level follows one the daemon held: a fresh daemon's
            # first seconds (its learners created, first snapshots) are not the level's
            if best:
                sender.grow(best)
                sender.send(plan.warm + plan.seconds)
            lvl = run_level(d, sender, mid, plan.warm * (1 if best else 2), plan.seconds)
        finally:
            sender.close()
            d.stop()
        print(lvl.line(), flush=True)
        sender_held &= not (lvl.daemon_ok and lvl.sender_limited)
        best, bad = (mid, bad) if lvl.ok else (best, mid)
    print(f"  {name}: {best:,} engines per core learned with nothing shed")
    return best, sender_held


def main(args: argparse.Namespace) -> int:
    """The engines-per-core searches (ours, the baseline revision's, ingest-only, dense)."""
    _pin(0)
    rec_s = 30.0 if args.quick else 60.0
    print(f"recording the fleet at vLLM's default sampling, {rec_s:.0f} s (simfleet)…", flush=True)
    rec = record(fleet_specs(rec_s), rec_s, 7, DEFAULT_RATES)
    templates = [Template(r) for r in rec.requests]
    per_engine = rec.total / (rec_s + 5) / len(build("fleet", rec_s))
    ceiling = sender_ceiling(rec, templates)
    print(
        f"  {len(rec.requests)} export requests, {rec.total:,} events per cycle "
        f"(~{per_engine:.0f} events/s per engine); the sender renders {ceiling:,.0f} events/s "
        f"on its core = {ceiling / per_engine:,.0f} engines before gRPC"
    )
    window = 5.0 if args.quick else 30.0
    sizing = ("--set", "joiner.max_engines=100000", "--set", "joiner.max_requests=2000000")
    common = (*sizing, "--set", f"joiner.window_s={window:g}")
    start = args.start or (64 if args.quick else 8)
    bisect_steps = args.bisect if args.bisect is not None else (1 if args.quick else 3)
    plan = Search(start, bisect_steps, window + 2, args.seconds)
    tmp = Path(tempfile.mkdtemp(prefix="coeffd-bench-"))
    runs = iter(range(1_000_000))

    def spawn(*extra: str, tree: Path | None = None) -> Callable[[], DaemonProc]:
        return lambda: DaemonProc(tmp / f"d{next(runs)}", *common, *extra, tree=tree)

    try:
        # the baseline's tree first: a bad revision fails now, not after our search
        baseline = None if args.baseline_rev == "none" else old_http_tree(tmp, args.baseline_rev)
        ours, held = search("this tree, default sampling", spawn(), rec, templates, plan)
        verdicts = [
            (f"≥ {ENGINES_TARGET:,} engines per core learned, nothing shed", ours >= ENGINES_TARGET)
        ]
        if baseline is not None:
            tree, commit = baseline
            base, _ = search(
                f"{commit} (baseline), default sampling", spawn(tree=tree), rec, templates, plan
            )
            # no level of the baseline held: the ratio is unknown, not infinite
            ratio = ours / base if base else float("nan")
            print(f"\nthis tree {ours:,} engines per core = {ratio:.2f}× {commit}'s {base:,}")
            verdicts.append(
                (f"≥ {RATIO_TARGET:g}× {commit} in the same run", ratio >= RATIO_TARGET)
            )
        if args.part != "rate":
            ingest_plan = dataclasses.replace(plan, start=max(plan.start, 2 * ours), warm=2.0)
            search(
                "ingest only (counting consumer)",
                spawn("--set", "pipeline.consumer=counting"),
                rec,
                templates,
                ingest_plan,
            )
            print("\nrecording the fleet with every step sampled (dense)…", flush=True)
            dense = record(fleet_specs(rec_s), rec_s, 7, DENSE_RATES)
            search(
                "this tree, every step sampled",
                spawn(),
                dense,
                [Template(r) for r in dense.requests],
                dataclasses.replace(plan, start=max(1, plan.start // 8)),  # ~10x the events
            )
        if not held:
            print("  note: the sender fell behind at some level below the daemon's limit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for what, ok in verdicts:
        print(f"  [{'met' if ok else 'MISSED'}] {what}")
    return 0 if all(ok for _, ok in verdicts) else 1
