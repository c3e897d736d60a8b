"""Discrete-event model of one vLLM v1 engine (EngineCore busy loop + its API server).

Length: one event loop whose scheduling, preemption and timing order mirror vLLM's
``Scheduler.schedule()`` step for step; split, the order would no longer read as vLLM's.

The scheduler follows vLLM v1's ``Scheduler.schedule()``: running requests first (one
token for decodes, chunked prefill under the token budget), preemption by recompute of the
lowest-priority running request when the block pool cannot grow a request, then
admissions from the waiting queue (prefix-cache lookup, optional CPU-tier load) while
budget, ``max_num_seqs`` and blocks allow, and only if nothing was preempted this step.

The busy loop follows ``EngineCore.run_busy_loop`` (spec §2.3): drain the input queue
(QUEUED), ``step()`` or ``step_with_batch_queue()`` (async scheduling: outputs of step N
are processed after ``schedule(N+1)``), sleep 1 ms when nothing executed but requests are
pending, block when idle (the step counter does not advance).

The true busy-loop period of a batch is the project's BLIS step time with the true β,
times log-normal noise, plus rare stalls. In async mode the GPU runs batches back to back,
so the spacing of schedule starts (and of completions) equals the period of the batch one
step earlier (spec §2.5 point 5); in sync mode the period between schedule starts equals
the period of the batch scheduled at the first of them.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from coeffd.records.observations import BatchRequest
from coeffd.simfleet.blocks import BlockPool, block_hash
from coeffd.simfleet.config import Coefficients, EngineSpec
from coeffd.simfleet.emitter import Emitter
from coeffd.simfleet.kv import KVSink, encode_batch
from coeffd.simfleet.offload import OffloadTier
from coeffd.simfleet.physics import StepPhysics
from coeffd.simfleet.state import INF, MS, US, Batch, Entry, Req, StepRecord
from coeffd.simfleet.workload import Arrival, ArrivalProcess


class Engine:
    """One EngineCore + API server. ``advance()`` runs the next due activity."""

    def __init__(
        self,
        spec: EngineSpec,
        seed: int,
        physics: StepPhysics,
        emitter: Emitter | None,
        kv_sinks: list[KVSink],
        t0_ns: int,
        end_ns: int,
        kv_form: str = "array",
        kv_topic: bytes = b"",
        kv_source: dict[str, Any] | None = None,
        record_steps: bool = False,
        check_invariants: bool = False,
        record_latencies: bool = False,
    ) -> None:
        sc = spec.serving
        self.spec = spec
        self.sc = sc
        self.physics = physics
        self.em = emitter
        self.kv_sinks = kv_sinks
        self.kv_form = kv_form
        self.kv_topic = kv_topic
        self.kv_source = kv_source or {}
        self.kv_seq = 0
        self.bs = sc.block_size
        self.pool = BlockPool(sc.num_gpu_blocks, sc.block_size, sc.prefix_caching)
        self.rng = random.Random(seed)
        self._ids = random.Random(seed ^ 0x1D5)
        self.t = t0_ns
        self.t0 = t0_ns
        self.end_ns = end_ns
        self._arrivals = iter(ArrivalProcess(spec.workload, seed ^ 0xA7, t0_ns + 50 * MS))
        self._next_arrival: Arrival | None = next(self._arrivals)
        # (time, seq, kind, request): kind 0 = ADD, 1 = ABORT (EngineCore input queue)
        self._inbox: list[tuple[int, int, int, Req]] = []
        self._inbox_seq = 0
        self._api: list[tuple[int, int, Callable[[], None]]] = []
        self._api_seq = 0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.counter = 0
        self.batch_queue: deque[Batch] = deque()
        self.gpu_free_ns = t0_ns
        self.finished_since = 0
        self.finished_pending = False
        self.busy = False
        self.async_sched = sc.async_scheduling
        # CPU offload tier (LRU of block hashes) and transfers
        self.kv_block_bytes = physics.kv_bytes_per_block
        cpu_blocks = 0
        if sc.cpu_offload_gib > 0:
            cpu_blocks = int(sc.cpu_offload_gib * (1 << 30) / self.kv_block_bytes)
        self.offload = OffloadTier(cpu_blocks, sc.block_size, sc.tp, self._kv_duration_ns)
        # statistics / ground truth
        self.record_steps = record_steps
        self.check = check_invariants
        self.steps: list[StepRecord] = []
        self.finished_reqs: list[Req] = []  # kept only with record_steps (memory)
        #: (arrival index, arrival, first response, departure) ns of every finished
        #: request, only with ``record_latencies`` (the closed loop's TTFT and E2E)
        self.latencies: list[tuple[int, int, int, int]] | None = [] if record_latencies else None
        self.num_finished = 0
        self.num_preemptions = 0
        self.num_aborted = 0
        self._now_api = t0_ns  # time of the API activity being run (abort timestamps)
        self._last_start = t0_ns  # S, E and preemptions of the latest schedule()
        self._last_end = t0_ns
        self._last_preempted = 0
        self.num_arrivals = 0
        self.shutdown_done = False
        if self.em is not None:
            self.em.open_steps(t0_ns, 1)

    # ------------------------------------------------------------ truth & noise

    def coeffs(self, t_ns: int) -> Coefficients:
        return self.spec.truth.at((t_ns - self.t0) / 1e9)

    def _lognorm(self, sigma: float) -> float:
        return math.exp(sigma * self.rng.gauss(0.0, 1.0)) if sigma > 0 else 1.0

    def _period(self, batch: Batch, t_ns: int) -> None:
        """True period of a non-empty batch: BLIS S(β_true) × noise + rare stall."""
        c = self.coeffs(t_ns)
        s = self.physics.step_time_us(c.beta, batch.blis)
        nz = self.spec.noise
        p = s * self._lognorm(nz.sigma)
        if nz.stall_rate > 0 and self.rng.random() < nz.stall_rate:
            p += nz.stall_us * self.rng.paretovariate(1.5)
        batch.truth_us = s
        batch.period_us = p

    @property
    def num_transfers(self) -> int:
        """KV transfers submitted so far (stores and loads)."""
        return self.offload.num_transfers

    def _kv_duration_ns(self, store: bool, blocks: int, t: int) -> int:
        c = self.coeffs(t)
        k = 0 if store else 1
        us = c.kv_base_us[k] + blocks * self.kv_block_bytes / c.kv_bytes_per_us[k]
        return int(us * self._lognorm(self.spec.noise.kv_sigma) * US)

    # ------------------------------------------------------------ scheduling

    def next_time(self) -> int:
        """Simulated time of this engine's next activity (INF when done)."""
        if self.shutdown_done:
            return INF
        t = INF
        if self._next_arrival is not None:
            t = self._next_arrival.t_ns
        if self._api:
            t = min(t, self._api[0][0])
        if self._work_pending():
            t = min(t, self.t)
        elif self._inbox:
            t = min(t, max(self.t, self._inbox[0][0] + 20 * US))
        if t == INF:
            return self.t  # final shutdown step
        return t

    def _work_pending(self) -> bool:
        return bool(self.waiting or self.running or self.finished_pending or self.batch_queue)

    def advance(self) -> int:
        """Run the earliest due activity; returns its time."""
        t = self.next_time()
        if self._next_arrival is not None and self._next_arrival.t_ns <= t:
            a = self._next_arrival
            self._arrive(a)
            nxt = next(self._arrivals)
            self._next_arrival = nxt if nxt.t_ns < self.end_ns else None
            return a.t_ns
        if self._api and self._api[0][0] <= t:
            ta, _, fn = heapq.heappop(self._api)
            self._now_api = ta
            fn()
            return ta
        if self._work_pending() or self._inbox:
            self.t = max(self.t, t)
            self._iteration()
            return t
        self.shutdown(self.t)
        return t

    def _later(self, t_ns: int, fn: Callable[[], None]) -> None:
        self._api_seq += 1
        heapq.heappush(self._api, (t_ns, self._api_seq, fn))

    # ------------------------------------------------------------ API process

    def _arrive(self, a: Arrival) -> None:
        self.num_arrivals += 1
        chat = a.route == "/v1/chat/completions"
        base = f"{self._ids.getrandbits(64):016x}"
        ext = ("chatcmpl-" if chat else "cmpl-") + base
        internal = (ext if chat else ext + "-0") + "-" + f"{self._ids.getrandbits(32):08x}"
        c = self.coeffs(a.t_ns)
        nz = self.spec.noise
        deliver = a.t_ns + int(c.alpha[0] * self._lognorm(nz.alpha_sigma) * US)
        r = Req(
            arr=a,
            external_id=ext,
            internal_id=internal,
            deliver_ns=deliver,
            tokens=list(a.prompt),
            prompt_len=len(a.prompt),
            target_out=a.output_len,
            max_tokens=a.max_tokens,
        )
        em = self.em
        if em is not None and em.sample_journey():
            r.api_span = em.api_start(
                a.t_ns, ext, a.route, len(a.prompt), a.max_tokens, a.temperature, a.top_p
            )
            if chat:
                em.api_event(r.api_span, "api.HANDOFF_TO_CORE", a.t_ns + 40 * US)
        self._push_input(deliver, 0, r)
        wl = self.spec.workload
        if wl.abort_fraction > 0 and self.rng.random() < wl.abort_fraction:
            patience = 1.0 + self.rng.expovariate(1.0 / wl.abort_patience_s)
            self._later(a.t_ns + int(patience * 1e9), partial(self._client_abort, r))

    def _push_input(self, t: int, kind: int, r: Req) -> None:
        self._inbox_seq += 1
        heapq.heappush(self._inbox, (t, self._inbox_seq, kind, r))

    def _client_abort(self, r: Req) -> None:
        """Client disconnect: ``api.ABORTED`` now, an ABORT to the engine shortly after."""
        if r.finished:
            return
        t = self._now_api
        em = self.em
        if em is not None and r.api_span is not None:
            em.api_aborted(r.api_span, t, "client_disconnect")
        self._push_input(t + 150 * US, 1, r)

    # ------------------------------------------------------------ busy loop

    def _iteration(self) -> None:
        t = self.t
        while self._inbox and self._inbox[0][0] <= t:
            _, _, kind, r = heapq.heappop(self._inbox)
            t += 12 * US
            if kind == 0:
                self._add_request(r, t)
            else:
                self._abort_request(r, t)
        if not (self.waiting or self.running or self.finished_pending or self.batch_queue):
            self.t = t
            return
        t += 8 * US
        if self.async_sched:
            self._step_with_batch_queue(t)
        else:
            self._step(t)

    def _add_request(self, r: Req, t: int) -> None:
        if self.em is not None and r.api_span is not None:
            r.core_span = self.em.core_start(t, r.api_span, r.internal_id)
            self._journey(r, "QUEUED", t, self.counter, phase="WAITING")
        self.waiting.append(r)

    def _abort_request(self, r: Req, t: int) -> None:
        """``finish_requests`` from the input queue: FINISHED(aborted) with the current counter."""
        if r.finished:
            return
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        else:
            return  # not (yet) known to the engine: vLLM ignores such aborts
        r.finished = True
        self.pool.free(r.blocks)
        r.blocks = []
        self.finished_since += 1
        self.finished_pending = True
        self.num_aborted += 1
        self._journey(r, "FINISHED", t, self.counter, finish_status="aborted")
        if self.em is not None and r.core_span is not None:
            self.em.core_end(r.core_span, t)

    def _has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _step(self, t: int) -> None:
        """Sync: schedule(N), execute(N), update(N)."""
        b = self._schedule(t)
        executed = b.tokens > 0
        t = b.dispatch_ns
        end = 0
        if executed:
            self._period(b, t)
            # the loop's own CPU time is part of the period; the GPU takes the rest, and
            # the next schedule() starts one period after this one (the period *is* the
            # spacing, spec §2.5): output processing that ends early waits for it; only
            # CPU work beyond the slack left here pushes the next start later
            start = self._last_start
            end = start + int(b.period_us * US)
            b.gpu_end_ns = max(t + 50 * US, end - 150 * US)
            t = b.gpu_end_ns
        self._record(b)
        t = self._update(b, t)
        if executed:
            t = max(t, end - 8 * US)  # the 8 µs before schedule() in _iteration
        if not executed and self._has_unfinished():
            t += MS
        self.t = t

    def _step_with_batch_queue(self, t: int) -> None:
        """Async (batch queue 2): schedule(N+1), then wait for and process batch N."""
        executed = False
        if self.waiting or self.running or self.finished_pending:
            b = self._schedule(t)
            executed = b.tokens > 0
            if executed:
                self._period(b, t)
                b.gpu_end_ns = max(b.dispatch_ns, self.gpu_free_ns) + int(b.period_us * US)
            else:
                b.gpu_end_ns = max(b.dispatch_ns, self.gpu_free_ns)
            self.gpu_free_ns = b.gpu_end_ns
            self._record(b)
            self.batch_queue.appendleft(b)
            t = b.dispatch_ns
            if executed and len(self.batch_queue) < 2 and self.batch_queue[-1].gpu_end_ns > t:
                self.t = t
                return
        elif not self.batch_queue:
            self.t = t
            return
        old = self.batch_queue.pop()
        t = max(t, old.gpu_end_ns)
        t = self._update(old, t)
        if not executed and self._has_unfinished():
            t += MS
        self.t = t

    def _record(self, b: Batch) -> None:
        if self.record_steps:
            self.steps.append(
                StepRecord(
                    b.step,
                    self._last_start,
                    self._last_end,
                    b.tokens,
                    len(self.running),
                    len(self.waiting),
                    self.pool.num_free,
                    b.period_us,
                    b.truth_us,
                    self._last_preempted,
                    b.blis,
                )
            )

    # ------------------------------------------------------------ schedule()

    def _known(self, r: Req) -> int:
        return len(r.tokens)

    def _ensure_hashes(self, r: Req, n_blocks: int) -> None:
        bs = self.bs
        hs = r.hashes
        toks = r.tokens
        while len(hs) < n_blocks:
            i = len(hs)
            parent = hs[-1] if hs else None
            hs.append(block_hash(parent, tuple(toks[i * bs : (i + 1) * bs])))

    def _blocks_needed(self, r: Req, upto_tokens: int) -> int:
        return -(-upto_tokens // self.bs) - len(r.blocks)

    def _commit(self, r: Req, upto_tokens: int) -> None:
        """Commit full blocks of known tokens up to ``upto_tokens`` (BlockStored)."""
        upto = min(upto_tokens, len(r.tokens), len(r.blocks) * self.bs) // self.bs
        if upto <= r.committed:
            return
        self._ensure_hashes(r, upto)
        c = r.committed
        parent = r.hashes[c - 1] if c > 0 else None
        self.pool.commit(
            r.blocks[c:upto], r.hashes[c:upto], parent, r.tokens[c * self.bs : upto * self.bs]
        )
        r.committed = upto

    def _preempt(self, v: Req, n: int, t: int) -> None:
        self.pool.free(v.blocks)
        v.blocks = []
        v.committed = 0
        v.computed = 0
        v.placeholders = 0
        v.epoch += 1
        v.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(v)
        self._journey(v, "PREEMPTED", t, n)

    def _schedule(self, S: int) -> Batch:
        self.counter += 1
        n_step = self.counter
        # stores planned in earlier steps are submitted with this step's batch (deferred,
        # tagged with this step: spec §5.6); loads planned in this step go out with it too
        offload = self.offload
        deferred = offload.take_deferred()
        sc = self.sc
        bs = self.bs
        budget = sc.max_num_batched_tokens
        entries: list[Entry] = []
        preempted = 0
        admitted = 0
        tev = S + 15 * US
        running = self.running
        pool = self.pool
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            need = len(r.tokens) + r.placeholders - r.computed
            # async max-token guard: no more tokens in flight than max_tokens
            if need <= 0 or len(r.tokens) - r.prompt_len + r.placeholders >= r.max_tokens:
                i += 1
                continue
            n = min(need, budget)
            nb = self._blocks_needed(r, r.computed + n)
            self_preempted = False
            while nb > 0 and not pool.can_allocate(nb):
                victim = running.pop()
                tev += 6 * US
                self._preempt(victim, n_step, tev)
                preempted += 1
                if victim is r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if nb > 0:
                r.blocks.extend(pool.allocate(nb))
            self._commit(r, r.computed + n)
            entries.append(Entry(r, n, False, r.epoch))
            budget -= n
            i += 1
        if not preempted:
            j = 0
            waiting = self.waiting
            while j < len(waiting) and budget > 0 and len(running) < sc.max_num_seqs:
                r = waiting[j]
                if r.loading:
                    j += 1
                    continue
                hits: list[int] = []
                start = r.computed
                if start == 0:
                    known = self._known(r)
                    limit = (known - 1) // bs
                    self._ensure_hashes(r, limit)
                    hits = pool.lookup(r.hashes, limit)
                    if offload.cpu_blocks and not r.cpu_loaded:
                        c = offload.held(r.hashes[len(hits) : limit])
                        if c > 0:
                            offload.start_load(r, c, n_step)
                            j += 1
                            continue
                    if r.cpu_loaded:
                        # blocks loaded from the CPU tier count as computed, like hits
                        c = offload.held(r.hashes[len(hits) : limit])
                        start = (len(hits) + c) * bs
                    else:
                        start = len(hits) * bs
                need = self._known(r) - start
                n = min(need, budget)
                nb = -(-(start + n) // bs) - len(hits)
                if not pool.can_allocate(nb + pool.num_idle(hits)):
                    break
                pool.touch(hits)
                r.blocks = list(hits) + pool.allocate(nb)
                r.committed = len(hits)
                r.computed = start
                if r.cached_first < 0:
                    r.cached_first = start
                del waiting[j]
                running.append(r)
                admitted += 1
                tev += 10 * US
                self._journey(
                    r, "SCHEDULED", tev, n_step, schedule_kind="RESUME" if r.started else "FIRST"
                )
                r.started = True
                self._commit(r, start + n)
                entries.append(Entry(r, n, False, r.epoch))
                budget -= n
        # offload store planning (connector metadata): new full blocks go to the CPU tier
        if offload.cpu_blocks:
            offload.plan_stores(entries, n_step)
        # scheduler CPU time (spec §2.4: "typically a few hundred µs", far below the period)
        dur_us = (
            120.0
            + 1.5 * len(running)
            + 2.5 * len(entries)
            + 45.0 * admitted
            + 30.0 * preempted
            + (60.0 if offload.cpu_blocks else 0.0)
        ) * self._lognorm(0.15)
        E = max(tev + US, S + int(dur_us * US))
        self._last_start = S
        self._last_end = E
        self._last_preempted = preempted
        # BLIS view of the batch, and the async-quirk classification of BATCH_SUMMARY
        blis: list[BatchRequest] = []
        pf_reqs = pf_tok = dc_reqs = dc_tok = 0
        for e in entries:
            r = e.req
            need = self._known(r) + r.placeholders - r.computed
            if r.computed >= r.prompt_len and need == 1:
                blis.append(BatchRequest(r.prompt_len, r.computed, 1, r.target_out))
            else:
                blis.append(
                    BatchRequest(
                        max(r.prompt_len, self._known(r)), r.computed, e.tokens, r.target_out
                    )
                )
            if r.num_out == 0:
                pf_reqs += 1
                pf_tok += e.tokens
            else:
                dc_reqs += 1
                dc_tok += e.tokens
        total = pf_tok + dc_tok
        em = self.em
        t_after = E
        if em is not None:
            summ, rich = em.draw_step()
            if summ:
                em.summary(
                    E,
                    step=n_step,
                    start_ns=S,
                    end_ns=E,
                    running=len(running),
                    waiting=len(self.waiting),
                    prefill_reqs=pf_reqs,
                    decode_reqs=dc_reqs,
                    prefill_tokens=pf_tok,
                    decode_tokens=dc_tok,
                    finished=self.finished_since,
                    preempted=preempted,
                    kv_usage=float(pool.usage()),
                    blocks_total=pool.total,
                    blocks_free=pool.num_free,
                )
                t_after += 15 * US
                if rich:
                    sched = {id(e.req): e.tokens for e in entries}
                    for r in running:
                        t_after += 20 * US
                        em.snapshot(t_after, n_step, r, sched.get(id(r), 0))
            em.after_schedule(t_after, n_step)
        self.finished_since = 0
        self.finished_pending = False
        # _update_after_schedule: advance computed tokens, add output placeholders
        for e in entries:
            r = e.req
            r.computed += e.tokens
            if r.computed >= self._known(r) + r.placeholders:
                r.placeholders += 1
                e.samples = True
            r.hwm = max(r.hwm, min(r.computed, r.prompt_len))
        b = Batch(n_step, entries, total, blis)
        b.dispatch_ns = t_after + 30 * US
        offload.submit(b, deferred)
        if self.check:
            self._check_invariants(b)
        return b

    # ------------------------------------------------------------ update_from_output()

    def _update(self, b: Batch, t: int) -> int:
        tev = t + 10 * US
        em = self.em
        nz = self.spec.noise
        c = self.coeffs(t)
        for e in b.entries:
            r = e.req
            if not e.samples or r.finished or r.epoch != e.epoch:
                continue
            r.placeholders -= 1
            r.tokens.append(self.rng.getrandbits(16))
            tev += 4 * US
            if r.num_out == 1:
                self._journey(r, "FIRST_TOKEN", tev, b.step)
                t_resp = tev + int(c.alpha[2] * self._lognorm(nz.alpha_sigma) * US)
                r.first_response_ns = t_resp
                if em is not None and r.api_span is not None and r.arr.stream:
                    self._later(
                        t_resp,
                        partial(em.api_event, r.api_span, "api.FIRST_RESPONSE_FROM_CORE", t_resp),
                    )
            self._commit(r, min(r.computed, self._known(r)))
            if r.num_out >= r.target_out or r.num_out >= r.max_tokens:
                self._finish(r, tev, b.step, c)
        events = self.pool.take_events()
        self.offload.publish_into(events, b, tev)
        if events:
            tev += 8 * US  # the publish itself (time passes whether or not anyone listens)
            if self.kv_sinks:
                wall = (em.wall(tev) if em is not None else tev + self._wall_offset_fallback) / 1e9
                payload = encode_batch(wall, events, self.sc.dp_rank, self.kv_form)
                for s in self.kv_sinks:
                    s.publish(self.kv_topic, self.kv_seq, payload, self.kv_source)
                self.kv_seq += 1
        return tev + 25 * US

    _wall_offset_fallback = 1_767_220_600_000_000_000

    def _finish(self, r: Req, t: int, step: int, c: Coefficients) -> None:
        r.finished = True
        self.running.remove(r)
        self.pool.free(r.blocks)
        r.blocks = []
        self.finished_since += 1
        self.finished_pending = True
        self.num_finished += 1
        if self.record_steps:
            self.finished_reqs.append(r)
        status = "stopped" if r.target_out < r.max_tokens else "length"
        self._journey(r, "FINISHED", t, step, finish_status=status)
        em = self.em
        if em is not None and r.core_span is not None:
            em.core_end(r.core_span, t)
        # noise is drawn whether or not the request is traced, so the engine's trajectory
        # does not depend on the sample rates
        nz = self.spec.noise
        chat = r.arr.route == "/v1/chat/completions"
        t_first = t + int(c.alpha[2] * self._lognorm(nz.alpha_sigma) * US)
        t_dep = t + int(c.alpha[1] * self._lognorm(nz.alpha_sigma) * US)
        if self.latencies is not None:
            self.latencies.append((r.arr.index, r.arr.t_ns, r.first_response_ns, t_dep))
        if em is not None and r.api_span is not None:
            span = r.api_span
            if chat and not r.arr.stream:
                # non-streaming: the final output is the first response (spec §2.2)
                self._later(
                    t_first, partial(em.api_event, span, "api.FIRST_RESPONSE_FROM_CORE", t_first)
                )
            wl = self.spec.workload
            if wl.no_terminal_fraction > 0 and self._ids.random() < wl.no_terminal_fraction:
                # the cleanup path ends the span without DEPARTED or ABORTED
                self._later(t_dep, partial(em.api_cleanup, span, t_dep))
            else:
                tokens = r.num_out if chat else None
                self._later(t_dep, partial(em.api_departed, span, t_dep, tokens))

    def _journey(
        self,
        r: Req,
        kind: str,
        t: int,
        step: int,
        phase: str | None = None,
        schedule_kind: str | None = None,
        finish_status: str | None = None,
    ) -> None:
        if self.em is None or r.core_span is None:
            return
        self.em.journey(
            r.core_span,
            kind,
            t,
            step,
            phase or r.phase(),
            r.hwm,
            r.prompt_len,
            r.num_out,
            r.max_tokens,
            r.preemptions,
            schedule_kind,
            finish_status,
        )

    # ------------------------------------------------------------ shutdown / checks

    def shutdown(self, t: int) -> None:
        """Close the open step span (``step_range_end`` = counter), as at engine exit."""
        if self.shutdown_done:
            return
        self.shutdown_done = True
        if self.em is not None:
            self.em.close_steps(t, self.counter)

    def _check_invariants(self, b: Batch) -> None:
        sc = self.sc
        assert b.tokens <= sc.max_num_batched_tokens, (b.step, b.tokens)
        assert len(self.running) <= sc.max_num_seqs
        seen = set()
        for e in b.entries:
            r = e.req
            assert id(r) not in seen, "request scheduled twice in one step"
            seen.add(id(r))
            assert e.tokens > 0
            assert r.computed <= self._known(r) + r.placeholders
            assert len(r.blocks) * self.bs >= r.computed, (r.internal_id, len(r.blocks), r.computed)
        held = sum(len(set(r.blocks)) for r in self.running)
        assert self.pool.num_free + held >= 0
        for r in self.waiting:
            assert not r.blocks, "waiting request holds blocks"
            assert r.computed == 0
        assert not (set(map(id, self.waiting)) & set(map(id, self.running)))
        self.pool.check()
