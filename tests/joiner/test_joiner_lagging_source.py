"""A replay (no receiver clock) whose engine's data lags the rest of the fleet's: an
engine whose exporter is slower than its API server's (a busier process, a bigger
queue) still sends, so it is not gone, however far the fleet's newest data runs ahead.

It was: in replay an engine two windows behind the fleet's newest data was forgotten
mid-stream, so a fast simulation over the wire (``bench closedloop``: the engine core's
exporter stalled while the API server's data ran ~65 simulated s on) lost ~3,100 pending
steps' compositions at once (they left with their summaries' totals, 1,240-1,840 rows the
learners then left out), in 10 runs of 17.
"""

from __future__ import annotations

import functools

import pytest

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.observations import (
    Composition,
    Observation,
    RequestObservation,
    StepObservation,
)
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate

WINDOW_S = 5.0


@functools.cache
def _generated() -> tuple[Batch, ...]:
    batches, _ = generate(
        SynthConfig(
            duration_s=40,
            rate_per_s=15,
            step_rate=0.5,
            rich_rate=0.0,
            seed=13,
            api_source=True,
            max_export_delay_s=0.1,
        )
    )
    return tuple(batches)


def _replay(batches: list[tuple[int, list]]) -> tuple[Joiner, list[Observation]]:
    j = Joiner(JoinerConfig(window_s=WINDOW_S))
    out: list[Observation] = []
    for _, recs in batches:
        out += j.push_many(recs)
    return j, out + j.flush()


def _source(r: object) -> str:
    span = getattr(r, "span", None)
    return str((span.source if span is not None else r.source).id)  # type: ignore[attr-defined]


def _lagged(
    lag_ns: int, pause_at: int | None = None, stalled: str = "engine"
) -> list[tuple[int, list]]:
    """The API server's records delivered at their time, the engine's ``lag_ns`` later;
    with ``pause_at`` (ns into the run), the ``stalled`` side's (``engine`` or ``api``)
    from then on are held until the other's have run ``lag_ns`` on, then come in a burst
    (its exporter stalled)."""
    timed: list[tuple[int, int, list]] = []
    t0 = _generated()[0][0]
    for i, (t, recs) in enumerate(_generated()):
        api = [r for r in recs if _source(r).startswith("api-")]
        core = [r for r in recs if not _source(r).startswith("api-")]
        if pause_at is None:
            at = t + lag_ns
        else:  # a second behind before the stall (its exporter the slower one)
            at = t + S_NS if t < t0 + pause_at else max(t, t0 + pause_at + lag_ns)
        if stalled == "api":
            timed += [(at, i, api), (t, i, core)]
        else:
            timed += [(t, i, api), (at, i, core)]
    timed.sort(key=lambda x: (x[0], x[1]))
    return [(t, recs) for t, _, recs in timed if recs]


def _compositions(out: list[Observation]) -> dict[int, Composition]:
    return {o.step: o.composition for o in out if isinstance(o, StepObservation)}


@pytest.mark.parametrize("pause", [False, True], ids=["behind", "stalled"])
def test_an_engine_behind_the_fleets_data_but_still_sending_is_not_forgotten(
    pause: bool,
) -> None:
    """Behind: the engine's data three windows behind the fleet's all along. Stalled: its
    exporter sends nothing while the fleet's data runs three windows on, then catches up
    (``max_lateness_s`` of the fleet's data, not two windows, makes an engine gone)."""
    ref_j, ref = _replay(_lagged(0))
    ref_c = _compositions(ref)
    exact = {n for n, c in ref_c.items() if c is not Composition.AGGREGATES}
    assert len(ref_c) > 300 and len(exact) > 0.8 * len(ref_c)

    lag = int(3 * WINDOW_S * S_NS)
    j, out = _replay(_lagged(lag, int(15 * S_NS) if pause else None))
    got = _compositions(out)
    assert set(got) == set(ref_c)  # every step observed once
    # each step keeps its batch: none fell back to the summary's totals because its
    # engine was forgotten while its journeys were still on the way
    lost = {n for n in exact if got[n] is Composition.AGGREGATES}
    assert len(lost) <= 0.01 * len(exact), (len(lost), len(exact))
    assert j.metrics.outcomes[("step", "expired")] == ref_j.metrics.outcomes[("step", "expired")]


@pytest.mark.parametrize("stalled", ["engine", "api"])
def test_the_requests_of_a_stall_wait_for_the_stalled_sides_spans(stalled: str) -> None:
    """One side's exporter stalls while the other's data runs three windows on, then its
    backlog comes: each request of the stall waits for its other part (a source it was
    joined with before, behind the request's deadline) instead of expiring at a window
    of the clock of the part that came first. Before, 173-175 of 636 requests (27 %)
    expired, whichever side stalled (bench closedloop's dense learning: 100-450 of ~650,
    after: 28-74)."""
    ref_j, ref = _replay(_lagged(0))
    ref_r = _requests(ref)
    assert len(ref_r) > 400
    lag = int(3 * WINDOW_S * S_NS)
    j, out = _replay(_lagged(lag, int(15 * S_NS), stalled))
    got = _requests(out)
    assert len(got) >= 0.99 * len(ref_r), (len(got), len(ref_r))
    assert j.metrics.outcomes[("request", "expired")] <= (
        ref_j.metrics.outcomes[("request", "expired")] + 0.01 * len(ref_r)
    )


def _requests(out: list[Observation]) -> set[str]:
    return {o.request_id for o in out if isinstance(o, RequestObservation)}
