"""A tiny deterministic vLLM engine-loop model that emits joiner input records directly.

Used by the joiner's tests and benchmark where the full ``simfleet`` (OTel SDK, OTLP
encode/decode) would be slow or beside the point. It reproduces what the join depends on:
the busy-loop order of events (spec §2.3, sync and async), idle gaps, 1 ms sleeps,
sampled summaries/snapshots, step-span closure, and export batching (each span reaches
the receiver with its events, after it ends, with a random export delay). Ground truth
is the attributable period of every non-empty batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from coeffd.records.events import (
    ApiEvent,
    ApiKind,
    BatchSummary,
    CoreSpan,
    JourneyEvent,
    JourneyKind,
    KVBatchInfo,
    KVTransfer,
    Record,
    RequestSnapshot,
    RequestSpan,
    Source,
    SpanInfo,
    StepSpan,
)

US = 1_000
MS = 1_000_000
S_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """What the synthetic engine does."""

    duration_s: float = 20.0
    rate_per_s: float = 20.0
    async_scheduling: bool = True
    step_rate: float = 0.01
    rich_rate: float = 0.001
    journey_rate: float = 1.0
    closure_interval: int = 100
    idle_every_s: float = 0.0  # >0: a quiet phase of idle_for_s every idle_every_s
    idle_for_s: float = 2.0
    max_export_delay_s: float = 5.0
    same_host: bool = True
    api_source: bool = False  # same host: the API server a source of its own all the same
    kv_offload: bool = False
    tp: int = 1
    engine_name: str = "e0"
    seed: int = 0


@dataclass(slots=True)
class Truth:
    """Ground truth: attributable period (µs) of each non-empty batch, step starts."""

    period_us: dict[int, float] = field(default_factory=dict)
    start_ns: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    async_scheduling: bool = True
    # request id -> (arrival->queued, finished->departed, first token->response) µs
    alpha_us: dict[str, tuple[float, float, float | None]] = field(default_factory=dict)
    kv_duration_us: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Req:
    rid: str
    arrive: int
    deliver: int
    prompt: int
    out: int
    stream: bool
    trace: bytes
    api_sid: bytes
    core_sid: bytes
    computed: int = 0
    produced: int = 0
    inflight: int = 0
    done: bool = False
    events: list[JourneyEvent] = field(default_factory=list)
    api_events: list[tuple[ApiKind, int]] = field(default_factory=list)
    scheduled_step: int = 0
    queued_at: int = 0
    sampled: bool = True


Batch = tuple[int, list[Record]]  # (delivery wall ns, records of one export)


def generate(cfg: SynthConfig) -> tuple[list[Batch], Truth]:
    """Run the model; returns export batches in delivery order and the truth."""
    return _Sim(cfg).run()


class _Sim:
    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.mono0 = 5000 * S_NS
        self.off = 1_767_220_600 * S_NS  # wall - mono of the engine host
        self.api_off = self.off if cfg.same_host else self.off + 3_217 * S_NS + 123_457
        attrs: tuple[tuple[str, str | int | float | bool], ...] = (
            ("service.name", cfg.engine_name),
        )
        self.src = Source(f"eng-{cfg.engine_name}", attrs)
        self.api_src = (
            self.src
            if cfg.same_host and not cfg.api_source
            else Source(f"api-{cfg.engine_name}", (("host", "b" if not cfg.same_host else "a"),))
        )
        self.kv_src = Source(f"kv-{cfg.engine_name}", attrs)
        self.truth = Truth(async_scheduling=cfg.async_scheduling)
        self.out: list[Batch] = []
        self.counter = 0
        self.running: list[_Req] = []
        self.waiting: list[_Req] = []
        self.finished_pending = False
        self.n_ids = 0
        self.step_span_start = 1
        self.step_span_open = self.mono0
        self.step_events: list[Record] = []
        self.since_check = 0
        self.emitted_since = False
        self.kv_seq = 0
        self.tid = 0
        self.sync_pending: list[int] = []

    # --------------------------------------------------------------- helpers

    def wall(self, mono: int) -> int:
        return mono + self.off + 300

    def _id(self, n: int) -> bytes:
        self.n_ids += 1
        return self.rng.getrandbits(8 * n).to_bytes(n, "big")

    def _deliver(self, end_wall: int) -> int:
        return end_wall + int(self.rng.random() * self.cfg.max_export_delay_s * S_NS)

    def _arrivals(self) -> list[_Req]:
        cfg = self.cfg
        rng = self.rng
        t = self.mono0 + 50 * MS
        end = self.mono0 + int(cfg.duration_s * S_NS)
        out = []
        i = 0
        while True:
            t += int(rng.expovariate(cfg.rate_per_s) * S_NS)
            if t >= end:
                break
            if cfg.idle_every_s > 0:
                phase = ((t - self.mono0) / S_NS) % cfg.idle_every_s
                if phase > cfg.idle_every_s - cfg.idle_for_s:
                    continue
            i += 1
            r = _Req(
                rid=f"chatcmpl-{i:08x}-{rng.getrandbits(32):08x}",
                arrive=t,
                deliver=t + int(rng.uniform(2.0, 4.0) * MS),
                prompt=rng.randint(20, 1500),
                out=rng.randint(1, 40),
                stream=rng.random() < 0.8,
                trace=self._id(16),
                api_sid=self._id(8),
                core_sid=self._id(8),
                sampled=rng.random() < cfg.journey_rate,
            )
            out.append(r)
        return out

    def _journey(self, r: _Req, kind: JourneyKind, t: int, step: int, **kw: object) -> None:
        if not r.sampled:
            return
        phase = "WAITING" if kind is JourneyKind.QUEUED else ("DECODE" if r.produced else "PREFILL")
        r.events.append(
            JourneyEvent(
                None,  # type: ignore[arg-type]  # span filled at export
                kind,
                self.wall(t),
                t,
                step,
                phase,
                min(r.computed, r.prompt),
                r.prompt,
                r.produced,
                r.out,
                0,
                **kw,  # type: ignore[arg-type]
            )
        )

    def _period_us(self, reqs: int, tokens: int) -> float:
        base = 6000.0 + 4.0 * tokens + 35.0 * reqs
        return base * (1.0 + 0.03 * self.rng.gauss(0.0, 1.0))

    # ------------------------------------------------------------ the loop

    def run(self) -> tuple[list[Batch], Truth]:
        arrivals = self._arrivals()
        ai = 0
        t = self.mono0
        end = self.mono0 + int(self.cfg.duration_s * S_NS)
        queue: list[tuple[int, int, int, list[_Req], list[_Req]]] = []  # batches on GPU
        gpu_free = t
        while True:
            # drain input queue
            while ai < len(arrivals) and arrivals[ai].deliver <= t:
                r = arrivals[ai]
                ai += 1
                t += 12 * US
                r.queued_at = t
                self._journey(r, JourneyKind.QUEUED, t, self.counter)
                self.waiting.append(r)
            work = self.waiting or self.running or self.finished_pending or queue
            if not work:
                if ai >= len(arrivals) and t >= end:
                    break
                if ai >= len(arrivals):
                    break
                t = max(t, arrivals[ai].deliver)  # idle: blocks on the input queue
                continue
            t += 8 * US
            executed = False
            if self.waiting or self.running or self.finished_pending:
                n, tokens, reqs, finished_in, disp = self._schedule(t)
                executed = tokens > 0
                g = self._period_us(len(reqs), tokens) if executed else 0.0
                if self.cfg.async_scheduling:
                    start = max(disp, gpu_free)
                    f = start + int(g * US)
                    gpu_free = f
                    queue.append((n, f, tokens, reqs, finished_in))
                    if executed:
                        self.truth.period_us[n] = g
                    if executed and len(queue) < 2:
                        t = disp
                        continue
                else:
                    # sync: the loop period is the batch's period by construction
                    s_n = self.truth.start_ns[n]
                    u_end = s_n + int(g * US) if executed else disp
                    queue.append((n, u_end, tokens, reqs, finished_in))
                    if executed:
                        self.sync_pending.append(n)
                t = disp
            if not queue:
                t += MS
                continue
            n, f, tokens, reqs, _ = queue.pop(0)
            if self.cfg.async_scheduling:
                t = max(t, f)
                t = self._update(n, reqs, t) + 20 * US
            else:
                # outputs are processed so that the next schedule starts exactly at f
                u = 30 * US + 4 * US * len(reqs)
                self._update(n, reqs, max(t, f - u))
                t = max(t, f - 20 * US)
            if not executed and (self.waiting or self.running):
                t += MS
        self._close_steps(t)
        self.out.sort(key=lambda b: b[0])
        return self.out, self.truth

    def _schedule(self, S: int) -> tuple[int, int, list[_Req], list[_Req], int]:
        self.counter += 1
        n = self.counter
        self.truth.start_ns[n] = S
        for m in self.sync_pending:  # sync: the period of batch m is S(m+1) - S(m)
            if m == n - 1:
                self.truth.period_us[m] = (S - self.truth.start_ns[m]) / 1e3
        self.sync_pending = []
        tev = S + 15 * US
        budget = 2048
        reqs: list[_Req] = []
        sched: dict[str, int] = {}
        for r in self.running:
            if r.computed < r.prompt:
                k = min(r.prompt - r.computed, budget)
            elif r.produced + r.inflight < r.out:  # async max-token guard
                k = 1
            else:
                continue
            if k <= 0 or budget <= 0:
                continue
            budget -= k
            sched[r.rid] = k
            reqs.append(r)
        admitted = []
        while self.waiting and budget > 0 and len(self.running) < 64:
            r = self.waiting.pop(0)
            k = min(r.prompt, budget)
            budget -= k
            tev += 10 * US
            r.scheduled_step = n
            self._journey(r, JourneyKind.SCHEDULED, tev, n, schedule_kind="FIRST")
            self.running.append(r)
            admitted.append(r)
            sched[r.rid] = k
            reqs.append(r)
        tokens = sum(sched.values())
        self.finished_pending = False
        d = 120 * US + 6 * US * len(reqs)
        E = max(tev + US, S + d)
        # summary
        if self.rng.random() < self.cfg.step_rate:
            pf = [r for r in reqs if r.produced == 0]
            dc = [r for r in reqs if r.produced > 0]
            self.step_events.append(
                BatchSummary(
                    None,  # type: ignore[arg-type]
                    self.wall(E + 5 * US),
                    n,
                    S,
                    E,
                    (E - S) // 1000,
                    len(self.running),
                    len(self.waiting),
                    len(pf),
                    len(dc),
                    tokens,
                    sum(sched[r.rid] for r in pf),
                    sum(sched[r.rid] for r in dc),
                    0,
                    0,
                    0.1,
                    8192,
                    7000,
                )
            )
            self.emitted_since = True
            if self.rng.random() < self.cfg.rich_rate:
                for r in self.running:
                    k = sched.get(r.rid, 0)
                    new = r in admitted
                    self.step_events.append(
                        RequestSnapshot(
                            None,  # type: ignore[arg-type]
                            self.wall(E + 20 * US),
                            n,
                            r.rid,
                            "DECODE" if r.produced else "PREFILL",
                            r.prompt,
                            0 if new else r.computed,
                            r.produced,
                            0,
                            k,
                            1,
                            0,
                            r.prompt,
                        )
                    )
        self.since_check += 1
        if self.since_check >= self.cfg.closure_interval:
            self.since_check = 0
            if self.emitted_since:
                self._close_steps(E + 40 * US, n)
                self.emitted_since = False
        for r in reqs:
            r.computed += sched[r.rid]
            if r.computed >= r.prompt:
                r.inflight += 1
        if self.cfg.kv_offload and admitted and self.rng.random() < 0.3:
            self._kv_transfer(n, E)
        return n, tokens, reqs, [], E + 30 * US

    def _update(self, n: int, reqs: list[_Req], t: int) -> int:
        tev = t + 10 * US
        done = []
        for r in reqs:
            if r.done:
                continue
            if r.inflight > 0:
                r.inflight -= 1
                r.produced += 1
                tev += 4 * US
                if r.produced == 1:
                    self._journey(r, JourneyKind.FIRST_TOKEN, tev, n)
                    r.api_events.append((ApiKind.FIRST_RESPONSE_FROM_CORE, tev))
                if r.produced >= r.out:
                    self._journey(r, JourneyKind.FINISHED, tev, n, finish_status="length")
                    done.append((r, tev))
                    r.done = True
        for r, tf in done:
            self.running.remove(r)
            self.finished_pending = True
            self._export_request(r, tf)
        return tev + 8 * US

    def _export_request(self, r: _Req, t_fin: int) -> None:
        if not r.sampled:
            return
        rng = self.rng
        a2q = rng.uniform(300, 900)  # ARRIVED earlier than QUEUED by ...
        arrived = r.queued_at - int(a2q * US)
        f2d = rng.uniform(200, 1200)
        departed = t_fin + int(f2d * US)
        ft = next(e.mono_ns for e in r.events if e.kind is JourneyKind.FIRST_TOKEN)
        fr_delay = rng.uniform(100, 800)
        first_resp = ft + int(fr_delay * US) if r.stream else departed - 50 * US
        self.truth.alpha_us[r.rid] = (a2q, f2d, fr_delay if r.stream and r.out > 1 else None)
        api_mono_shift = self.api_off - self.off  # API process mono domain if another host

        def api_mono(t: int) -> int:
            return t - api_mono_shift if not self.cfg.same_host else t

        api_info = SpanInfo(
            r.trace,
            r.api_sid,
            b"",
            "llm_request",
            "vllm.api",
            self.api_src,
            arrived + self.off,
            departed + self.off + 20 * US,
        )
        core_info = SpanInfo(
            r.trace,
            r.core_sid,
            r.api_sid,
            "llm_core",
            "vllm.scheduler",
            self.src,
            self.wall(r.queued_at) - 1000,
            self.wall(t_fin) + 1000,
        )
        core_recs: list[Record] = [CoreSpan(core_info, r.rid)]
        for e in r.events:
            core_recs.append(
                JourneyEvent(
                    core_info,
                    e.kind,
                    e.wall_ns,
                    e.mono_ns,
                    e.step,
                    e.phase,
                    e.prefill_done_tokens,
                    e.prefill_total_tokens,
                    e.decode_done_tokens,
                    e.decode_max_tokens,
                    e.num_preemptions,
                    e.schedule_kind,
                    e.finish_status,
                )
            )
        self.out.append((self._deliver(core_info.end_wall_ns), core_recs))
        api_recs: list[Record] = [
            RequestSpan(
                api_info,
                r.rid.rsplit("-", 1)[0],
                route="/v1/chat/completions",
                prompt_tokens=r.prompt,
                completion_tokens=r.out,
                max_tokens=r.out,
                n=1,
            )
        ]
        for kind, t in (
            (ApiKind.ARRIVED, arrived),
            (ApiKind.HANDOFF_TO_CORE, arrived + 40 * US),
            (ApiKind.FIRST_RESPONSE_FROM_CORE, first_resp),
            (ApiKind.DEPARTED, departed),
        ):
            api_recs.append(ApiEvent(api_info, kind, t + self.api_off + 250, api_mono(t)))
        self.out.append((self._deliver(api_info.end_wall_ns), api_recs))

    def _close_steps(self, t: int, end_step: int | None = None) -> None:
        end = self.counter if end_step is None else end_step
        if end < self.step_span_start:
            return
        info = SpanInfo(
            self._id(16),
            self._id(8),
            b"",
            f"scheduler_steps_{end}",
            "vllm.scheduler.step",
            self.src,
            self.wall(self.step_span_open),
            self.wall(t),
        )
        recs: list[Record] = [
            StepSpan(info, end, self.step_span_start, self.cfg.closure_interval, end)
        ]
        for e in self.step_events:
            if isinstance(e, BatchSummary):
                recs.append(
                    BatchSummary(info, *(getattr(e, f) for f in BatchSummary.__struct_fields__[1:]))
                )
            elif isinstance(e, RequestSnapshot):
                recs.append(
                    RequestSnapshot(
                        info, *(getattr(e, f) for f in RequestSnapshot.__struct_fields__[1:])
                    )
                )
        self.step_events = []
        self.step_span_start = end + 1
        self.step_span_open = t
        self.out.append((self._deliver(info.end_wall_ns), recs))

    def _kv_transfer(self, n: int, t: int) -> None:
        self.tid += 1
        dur_us = self.rng.uniform(80, 400)
        done_t = t + int(dur_us * US)
        store = self.rng.random() < 0.6
        recs: list[Record] = []
        for completed, tt in ((False, t), (True, done_t)):
            self.kv_seq += 1
            b = KVBatchInfo(self.kv_src, "", self.kv_seq, self.wall(tt), 0)
            for _ in range(self.cfg.tp):  # TP copies, identical and adjacent
                recs.append(
                    KVTransfer(
                        b,
                        completed,
                        self.tid,
                        "r",
                        "GPU" if store else "CPU",
                        "CPU" if store else "GPU",
                        4,
                        n,
                        True if completed else None,
                    )
                )
        self.truth.kv_duration_us[self.tid] = (self.wall(done_t) - self.wall(t)) / 1e3
        self.out.append((self.wall(done_t) + 1 * MS, recs))
