"""vLLM's spans and events for one engine: names, attribute keys, types and clocks.

This module is the single place that knows the spec's vocabulary (spec §2). The engine
calls it with simulated monotonic times (int ns); every event gets the wall timestamp
``mono + offset + read lag`` because vLLM reads the monotonic clock immediately before the
wall clock (spec §2.2, §2.6). Sampling decisions use their own RNG so the engine's
trajectory does not depend on the sample rates.
"""

from __future__ import annotations

import random
from typing import Any

from opentelemetry.trace import Span, Tracer

from coeffd.simfleet.config import SampleRates
from coeffd.simfleet.state import Req
from coeffd.simfleet.telemetry import KIND_INTERNAL, KIND_SERVER, remote_parent


class Emitter:
    """Spans of one engine's API process and EngineCore."""

    def __init__(
        self,
        rates: SampleRates,
        api_tracer: Tracer,
        core_tracer: Tracer,
        step_tracer: Tracer | None,
        wall_offset_ns: int,
        seed: int,
        model_name: str,
    ) -> None:
        self.rates = rates
        self._api = api_tracer
        self._core = core_tracer
        self._step = step_tracer
        self._off = wall_offset_ns
        self._rng = random.Random(seed)
        self._model = model_name
        self._seq = 0
        self._span: Span | None = None
        self._calls = 0
        self._emitted = False
        self.summaries = 0
        self.snapshots = 0

    # ---------------------------------------------------------------- clocks

    def wall(self, mono_ns: int) -> int:
        """Wall ns of a clock read done right after a mono read at ``mono_ns``."""
        return mono_ns + self._off + 200 + (self._rng.getrandbits(9))

    # ------------------------------------------------------------- API process

    def sample_journey(self) -> bool:
        """Per-request draw in the API process (spec §3)."""
        r = self.rates.journey
        return r >= 1.0 or self._rng.random() < r

    def api_start(
        self,
        t_ns: int,
        external_id: str,
        route: str,
        prompt_tokens: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
    ) -> Span:
        """``llm_request`` (SERVER) + ``api.ARRIVED`` right after the attributes are set."""
        span = self._api.start_span(
            "llm_request",
            kind=KIND_SERVER,
            start_time=self.wall(t_ns - 15_000),
            attributes={
                "gen_ai.request.id": external_id,
                "http.route": route,
                "gen_ai.response.model": self._model,
                "gen_ai.usage.prompt_tokens": prompt_tokens,
                "gen_ai.request.temperature": float(temperature),
                "gen_ai.request.top_p": float(top_p),
                "gen_ai.request.max_tokens": max_tokens,
                "gen_ai.request.n": 1,
            },
        )
        self.api_event(span, "api.ARRIVED", t_ns)
        return span

    def api_event(self, span: Span, name: str, t_ns: int) -> None:
        """An ``api.*`` event: ``event.ts.monotonic`` (double s) then the wall stamp."""
        if span.is_recording():  # an aborted request's span is already ended
            span.add_event(name, {"event.ts.monotonic": t_ns / 1e9}, timestamp=self.wall(t_ns))

    def api_cleanup(self, span: Span, t_ns: int) -> None:
        """The finalizer's cleanup-only call: span end with no terminal event."""
        if span.is_recording():
            span.end(end_time=self.wall(t_ns))

    def api_aborted(self, span: Span, t_ns: int, reason: str) -> None:
        """``api.ABORTED`` (``reason``; no ``error`` for a disconnect), span end."""
        if not span.is_recording():
            return
        span.add_event(
            "api.ABORTED",
            {"event.ts.monotonic": t_ns / 1e9, "reason": reason},
            timestamp=self.wall(t_ns),
        )
        span.end(end_time=self.wall(t_ns + 10_000))

    def api_departed(self, span: Span, t_ns: int, completion_tokens: int | None) -> None:
        """``gen_ai.usage.completion_tokens`` (chat), ``api.DEPARTED``, span end."""
        if not span.is_recording():
            return
        if completion_tokens is not None:
            span.set_attribute("gen_ai.usage.completion_tokens", completion_tokens)
        self.api_event(span, "api.DEPARTED", t_ns)
        span.end(end_time=self.wall(t_ns + 20_000))

    # -------------------------------------------------------------- EngineCore

    def core_start(self, t_ns: int, api_span: Span, internal_id: str) -> Span:
        """``llm_core`` child of the API span through the injected (remote) context."""
        return self._core.start_span(
            "llm_core",
            context=remote_parent(api_span),
            kind=KIND_INTERNAL,
            start_time=self.wall(t_ns - 8_000),
            attributes={"gen_ai.request.id": internal_id},
        )

    def journey(
        self,
        span: Span,
        kind: str,
        t_ns: int,
        step: int,
        phase: str,
        prefill_done: int,
        prefill_total: int,
        decode_done: int,
        decode_max: int,
        preemptions: int,
        schedule_kind: str | None = None,
        finish_status: str | None = None,
    ) -> None:
        """A ``journey.<kind>`` event with the common attributes in emission order."""
        attrs: dict[str, Any] = {
            "event.type": kind,
            "ts.monotonic": t_ns / 1e9,
            "ts.monotonic_ns": t_ns,
            "scheduler.step": step,
            "phase": phase,
            "prefill.done_tokens": prefill_done,
            "prefill.total_tokens": prefill_total,
            "decode.done_tokens": decode_done,
            "decode.max_tokens": decode_max,
            "num_preemptions": preemptions,
        }
        if schedule_kind is not None:
            attrs["schedule.kind"] = schedule_kind
        if finish_status is not None:
            attrs["finish.status"] = finish_status
        span.add_event("journey." + kind, attrs, timestamp=self.wall(t_ns))

    def core_end(self, span: Span, t_ns: int) -> None:
        span.end(end_time=self.wall(t_ns + 3_000))

    # ------------------------------------------------------------- step spans

    def open_steps(self, t_ns: int, range_start: int) -> None:
        """Open ``scheduler_steps_<seq+1>`` (spec §3 closure)."""
        if self._step is None:
            return
        seq = self._seq + 1
        self._span = self._step.start_span(
            f"scheduler_steps_{seq}",
            kind=KIND_INTERNAL,
            start_time=self.wall(t_ns),
            attributes={
                "scheduler.span_sequence": seq,
                "scheduler.step_range_start": range_start,
                "scheduler.closure_interval": self.rates.closure_interval,
            },
        )

    def close_steps(self, t_ns: int, range_end: int) -> None:
        if self._span is None:
            return
        self._span.set_attribute("scheduler.step_range_end", range_end)
        self._span.end(end_time=self.wall(t_ns))
        self._span = None
        self._seq += 1

    def draw_step(self) -> tuple[bool, bool]:
        """(summary, rich) Bernoulli draws for one ``schedule()`` call (spec §3)."""
        if self._span is None:
            return False, False
        p = self.rates.step
        if not (p >= 1.0 or self._rng.random() < p):
            return False, False
        q = self.rates.rich
        return True, q >= 1.0 or self._rng.random() < q

    def summary(
        self,
        t_ns: int,
        *,
        step: int,
        start_ns: int,
        end_ns: int,
        running: int,
        waiting: int,
        prefill_reqs: int,
        decode_reqs: int,
        prefill_tokens: int,
        decode_tokens: int,
        finished: int,
        preempted: int,
        kv_usage: float,
        blocks_total: int,
        blocks_free: int,
    ) -> None:
        """A ``step.BATCH_SUMMARY`` event of the step scheduled in ``[start_ns, end_ns]``."""
        assert self._span is not None
        attrs: dict[str, Any] = {
            "step.id": step,
            "step.ts_start_ns": start_ns,
            "step.ts_end_ns": end_ns,
            "step.duration_us": (end_ns - start_ns) // 1000,
            "queue.running_depth": running,
            "queue.waiting_depth": waiting,
            "batch.num_prefill_reqs": prefill_reqs,
            "batch.num_decode_reqs": decode_reqs,
            "batch.scheduled_tokens": prefill_tokens + decode_tokens,
            "batch.prefill_tokens": prefill_tokens,
            "batch.decode_tokens": decode_tokens,
            "batch.num_finished": finished,
            "batch.num_preempted": preempted,
            "kv.usage_gpu_ratio": kv_usage,
            "kv.blocks_total_gpu": blocks_total,
            "kv.blocks_free_gpu": blocks_free,
        }
        self._span.add_event("step.BATCH_SUMMARY", attrs, timestamp=self.wall(t_ns))
        self._emitted = True
        self.summaries += 1

    def snapshot(self, t_ns: int, step: int, r: Req, scheduled_tokens: int) -> None:
        """A ``step.REQUEST_SNAPSHOT`` event of running request ``r`` (the effective prompt
        length only when positive: vLLM omits it when the prefix cache covered it all)."""
        assert self._span is not None
        attrs: dict[str, Any] = {
            "step.id": step,
            "request.id": r.internal_id,
            "request.phase": r.phase(),
            "request.num_prompt_tokens": r.prompt_len,
            "request.num_computed_tokens": r.computed,
            "request.num_output_tokens": r.num_out,
            "request.num_preemptions": r.preemptions,
            "request.scheduled_tokens_this_step": scheduled_tokens,
            "kv.blocks_allocated_gpu": len(r.blocks),
            "kv.blocks_cached_gpu": r.committed,
        }
        eff = r.prompt_len - max(0, r.cached_first)
        if eff > 0:
            attrs["request.effective_prompt_len"] = eff
        self._span.add_event("step.REQUEST_SNAPSHOT", attrs, timestamp=self.wall(t_ns))
        self.snapshots += 1

    def after_schedule(self, t_ns: int, step: int) -> None:
        """Closure check every k calls: close + reopen only if something was emitted."""
        if self._span is None:
            return
        self._calls += 1
        if self._calls >= self.rates.closure_interval:
            if self._emitted:
                self.close_steps(t_ns, step)
                self.open_steps(t_ns + 1_000, step + 1)
            self._calls = 0
            self._emitted = False
