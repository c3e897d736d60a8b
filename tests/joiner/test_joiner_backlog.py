"""Late data (issue 32, item 8): each source's window follows its own data, so a backlog
delivered long after the fact is joined as it was when live, and the receiver's clock
only finishes sources that fell idle.

Live here means: every export is pushed at its delivery time and the joiner is ticked
with that time as the receiver's clock (as the daemon's worker does every second).
"""

from __future__ import annotations

import functools

import msgspec
from test_joiner_delivery import _key

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.events import RequestSpan
from coeffd.records.observations import (
    Observation,
    RequestObservation,
    StepObservation,
)
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate

WINDOW_S = 5.0  # small, so that a 40 s run is a backlog of 8 windows


@functools.cache
def _generated() -> tuple[Batch, ...]:
    batches, _ = generate(
        SynthConfig(duration_s=40, rate_per_s=15, step_rate=0.2, rich_rate=0.05, seed=71)
    )
    return tuple(batches)


def _batches() -> list[Batch]:
    return list(_generated())


def _live(j: Joiner, batches: list[Batch]) -> list[Observation]:
    out: list[Observation] = []
    for t, recs in batches:
        out += j.push_many(recs)
        out += j.tick(t)
    return out


def _burst(j: Joiner, batches: list[Batch], now: int) -> tuple[list[Observation], int]:
    """Everything in one burst at ``now``: a tick every 50 exports, 10 ms apart."""
    out: list[Observation] = []
    for i, (_, recs) in enumerate(batches):
        out += j.push_many(recs)
        if i % 50 == 0:
            now += S_NS // 100
            out += j.tick(now)
    return out, now


def _idle(j: Joiner, now: int, seconds: int) -> tuple[list[Observation], int]:
    """The receiver's clock runs on, one tick a second, and nothing arrives."""
    out: list[Observation] = []
    for _ in range(seconds):
        now += S_NS
        out += j.tick(now)
    return out, now


def _periods(out: list[Observation]) -> dict[tuple, float]:
    return {_key(o): o.period_us for o in out if isinstance(o, StepObservation)}


def _encoded(out: list[Observation]) -> dict[tuple, bytes]:
    return {_key(o): msgspec.json.encode(o) for o in out}


def test_a_backlog_is_joined_as_when_delivered_live() -> None:
    """Seven minutes late, 40 s of telemetry (8 windows) in one burst: the same observations as
    live (it lost all but its last window's worth to ``late`` when every tick moved each
    source's watermark to the receiver's clock)."""
    batches = _batches()
    cfg = JoinerConfig(window_s=WINDOW_S)
    live = Joiner(cfg)
    live_out = _live(live, batches)
    live_out += _idle(live, batches[-1][0], 3 * int(WINDOW_S))[0]
    assert live.flush() == []  # the clock finished everything
    base = _encoded(live_out)
    assert {k[0] for k in base} == {"step", "request"} and len(base) > 500

    j = Joiner(cfg)
    now = batches[-1][0] + 420 * S_NS
    out, _ = _idle(j, now - 10 * S_NS, 10)  # the daemon ticked before the burst came
    burst, now = _burst(j, batches, now)
    out += burst
    out += _idle(j, now, 3 * int(WINDOW_S))[0]
    assert j.flush() == []
    assert j.metrics.outcomes[("request", "late")] == 0
    got = _encoded(out)
    # The same joins; the values agree to the anchors' calibration at the moment each
    # step was decided (which moves with the delivery's timing by a few hundred ns).
    assert len(set(base) - set(got)) <= 0.01 * len(base)
    assert len(got) <= 1.01 * len(base)
    live_p, burst_p = _periods(live_out), _periods(out)
    rel = [abs(burst_p[k] / p - 1.0) for k, p in live_p.items() if k in burst_p]
    assert len(rel) > 500 and sorted(rel)[len(rel) // 2] < 1e-4
    assert sum(1 for r in rel if r > 1e-3) <= 0.005 * len(rel)  # a span cut elsewhere


def test_an_idle_source_is_finished_and_its_later_backlog_is_not_late() -> None:
    """A replica falls silent (its exporter holds the data back): what the window holds
    is finished by the receiver's clock; two minutes later the held data arrives in one
    burst and is joined, none of it late."""
    batches = _batches()
    cut = len(batches) // 3
    cfg = JoinerConfig(window_s=WINDOW_S)
    ref = Joiner(cfg)
    ref_out = _live(ref, batches) + ref.flush()
    ref_keys = set(_encoded(ref_out))

    j = Joiner(cfg)
    before = _live(j, batches[:cut])
    finished, now = _idle(j, batches[cut - 1][0], 120)
    assert finished  # the idle source's last steps and requests completed on the clock
    assert j.entries()["request"] == 0
    burst, now = _burst(j, batches[cut:], now)
    after = burst + _idle(j, now, 3 * int(WINDOW_S))[0] + j.flush()
    assert j.metrics.outcomes[("request", "late")] == 0
    got = set(_encoded(before + finished)) | set(_encoded(after))
    # Only what straddles the silence differs: requests whose spans came on both sides
    # (finished as expired, counted) and steps around the cut pinned by their journeys.
    missing = ref_keys - got
    n_ref_steps = sum(1 for k in ref_keys if k[0] == "step")
    missed_requests = sum(1 for k in missing if k[0] == "request")
    assert missed_requests <= j.metrics.outcomes[("request", "expired")]
    missed_steps = sorted(k[2] for k in missing if k[0] == "step")
    assert len(missed_steps) <= 0.08 * n_ref_steps
    last_step = max(k[2] for k in ref_keys if k[0] == "step")
    assert missed_steps[-1] - missed_steps[0] <= 0.15 * last_step  # around the cut only
    late_requests = {k for k in _encoded(after) if k[0] == "request"}
    assert len(late_requests) >= 0.6 * sum(1 for k in ref_keys if k[0] == "request")


def test_data_behind_its_source_beyond_max_lateness_is_counted() -> None:
    """Data more than ``max_lateness_s`` behind its source's newest is counted as late
    (``coeffd_join_outcomes_total``), never silently dropped."""
    batches = _batches()
    cfg = JoinerConfig(window_s=WINDOW_S, max_lateness_s=20.0)
    held = [b for b in batches[:100] if any(isinstance(r, RequestSpan) for r in b[1])]
    rest = [b for b in batches if b not in held]
    assert held and rest[-1][0] - held[-1][0] > 25 * S_NS
    j = Joiner(cfg)
    _live(j, rest)
    before = j.metrics.outcomes[("request", "late")]
    for _, recs in held:
        assert not [o for o in j.push_many(recs) if isinstance(o, RequestObservation)]
    n_spans = sum(1 for _, recs in held for r in recs if isinstance(r, RequestSpan))
    assert j.metrics.outcomes[("request", "late")] - before == n_spans
