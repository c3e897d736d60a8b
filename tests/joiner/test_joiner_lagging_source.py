"""A replay (no receiver clock) whose engine's data lags the rest of the fleet's: an
engine whose exporter is slower than its API server's (a busier process, a bigger
queue) still sends, so it is not gone, however far the fleet's newest data runs ahead.

It was: in replay an engine two windows behind the fleet's newest data was forgotten
mid-stream, so a fast simulation over the wire (``bench closedloop``: the engine core's
spans 60-75 simulated s behind the API server's) lost ~3,100 held steps' compositions at
once (they left with their summaries' totals, 1,240-1,840 rows the learners then left
out), in one run of three.
"""

from __future__ import annotations

import functools

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.observations import Composition, Observation, StepObservation
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate

WINDOW_S = 5.0


@functools.cache
def _generated() -> tuple[Batch, ...]:
    batches, _ = generate(
        SynthConfig(
            duration_s=40, rate_per_s=15, step_rate=0.5, rich_rate=0.0, seed=13, same_host=False
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


def _lagged(lag_ns: int) -> list[tuple[int, list]]:
    """The API server's records delivered at their time, the engine's ``lag_ns`` later."""
    timed: list[tuple[int, int, list]] = []
    for i, (t, recs) in enumerate(_generated()):
        api = [r for r in recs if _source(r).startswith("api-")]
        core = [r for r in recs if not _source(r).startswith("api-")]
        timed += [(t, i, api), (t + lag_ns, i, core)]
    timed.sort(key=lambda x: (x[0], x[1]))
    return [(t, recs) for t, _, recs in timed if recs]


def _compositions(out: list[Observation]) -> dict[int, Composition]:
    return {o.step: o.composition for o in out if isinstance(o, StepObservation)}


def test_an_engine_behind_the_fleets_data_but_still_sending_is_not_forgotten() -> None:
    ref_j, ref = _replay(_lagged(0))
    ref_c = _compositions(ref)
    exact = {n for n, c in ref_c.items() if c is not Composition.AGGREGATES}
    assert len(ref_c) > 300 and len(exact) > 0.8 * len(ref_c)

    lag = int(3 * WINDOW_S * S_NS)  # the engine's data three windows behind the fleet's
    j, out = _replay(_lagged(lag))
    got = _compositions(out)
    assert set(got) == set(ref_c)  # every step observed once
    # each step keeps its batch: none fell back to the summary's totals because its
    # engine was forgotten while its journeys were still on the way
    lost = {n for n in exact if got[n] is Composition.AGGREGATES}
    assert len(lost) <= 0.01 * len(exact), (len(lost), len(exact))
    assert j.metrics.outcomes[("step", "expired")] == ref_j.metrics.outcomes[("step", "expired")]
