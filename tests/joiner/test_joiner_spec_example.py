"""The spec §6 worked example (``vllm-example-traces.jsonl``) gives the documented numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.receivers.otlp.decode import decode_json
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    PeriodMethod,
    RequestObservation,
    StepObservation,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "shared" / "spec" / "vllm-example-traces.jsonl"


def _batches() -> list[list]:
    if not EXAMPLE.exists():
        pytest.skip(f"spec example not found at {EXAMPLE}")
    return [decode_json(line.encode()).records for line in EXAMPLE.read_text().splitlines()]


def _run(cfg: JoinerConfig, batches: list[list]) -> list:
    j = Joiner(cfg)
    out = []
    for b in batches:
        out += j.push_many(b)
    return out + j.flush()


def test_request_alpha_targets() -> None:
    out = _run(JoinerConfig(warmup_steps=0), _batches())
    (req,) = [o for o in out if isinstance(o, RequestObservation)]
    assert req.request_id == "chatcmpl-3f2a9c1e5b7d4a60-7c1d2e3f"
    assert round(req.arrival_to_queued_us / 1e3, 3) == 3.849
    assert round(req.finished_to_departed_us / 1e3, 3) == 0.914
    assert round(req.first_token_to_response_us / 1e3, 3) == 0.644
    assert round(req.queue_wait_us / 1e3, 3) == 0.301
    assert req.streaming is True
    assert req.route == "/v1/chat/completions"
    assert (req.prompt_tokens, req.output_tokens, req.finish_status) == (40, 3, "length")
    # QUEUED carries step 1041; the nearest summary is 1042 (running 2, waiting 0)
    assert req.queue_state is not None
    assert (req.queue_state.step, req.queue_state.distance_steps) == (1042, 1)
    assert req.queue_state.running_depth == 2


def test_period_from_consecutive_summaries_sync_attribution() -> None:
    out = _run(JoinerConfig(warmup_steps=0, async_scheduling=False), _batches())
    (step,) = [o for o in out if isinstance(o, StepObservation)]
    assert step.step == 1042
    assert step.period_method is PeriodMethod.CONSECUTIVE_SUMMARIES
    assert round(step.period_us / 1e3, 3) == 12.504  # P(1042) = S(1043) - S(1042)
    assert step.scheduler_duration_us == 379
    assert step.composition is Composition.SNAPSHOTS
    assert sorted(step.requests, key=lambda r: r.input_len) == [
        BatchRequest(input_len=40, progress=0, new_tokens=24, output_len=1),  # admitted, 16 cached
        BatchRequest(input_len=100, progress=137, new_tokens=1, output_len=37),
    ]
    assert step.aggregates.scheduled_tokens == 25


def test_async_inferred_and_attributed_to_next_interval() -> None:
    """FIRST_TOKEN(1042) falls after E(1043): async. Batch 1042 then owns
    [S(1043), S(1044)], with S(1044) pinned by that FIRST_TOKEN."""
    # uncalibrated prior bounds: ~8 % half-width, above the default 5 % acceptance
    out = _run(JoinerConfig(warmup_steps=0, max_uncertainty_fraction=0.15), _batches())
    (step,) = [o for o in out if isinstance(o, StepObservation)]
    assert step.async_scheduling is True
    assert round(step.loop_period_us / 1e3, 3) == 12.504  # the raw loop period is kept
    assert step.period_method is PeriodMethod.JOURNEY_ANCHORS
    ft_minus_s1043 = 28_803.559 - 16_502.377  # µs: S(1044) >= FIRST_TOKEN(1042)
    lo = step.period_us - step.period_uncertainty_us
    hi = step.period_us + step.period_uncertainty_us
    assert lo <= ft_minus_s1043 + 1 and hi >= ft_minus_s1043


def test_same_type_anchor_spacing_is_documented_value() -> None:
    """The §6 anchor arithmetic (12.40 ms, 12.30 ms) from the journey events themselves."""
    recs = [r for b in _batches() for r in b]
    t = {getattr(r, "kind", None): r.mono_ns for r in recs if type(r).__name__ == "JourneyEvent"}
    s1042 = next(
        r.start_mono_ns
        for r in recs
        if getattr(r, "step", None) == 1042 and hasattr(r, "start_mono_ns")
    )
    kinds = {k.value: v for k, v in t.items()}
    assert round((kinds["FIRST_TOKEN"] - s1042) / 2e6, 2) == 12.40
    assert round((kinds["FINISHED"] - kinds["FIRST_TOKEN"]) / 2e6, 2) == 12.30
