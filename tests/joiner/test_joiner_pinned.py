"""Steps pinned by journeys (issue 14): at vLLM's default sampling (journey 1.0, step 0.01)
the unsampled steps become period observations, checked batch by batch against simfleet's
truth, and α0's loop wait needs no step summaries.

Tolerances come from the data: a span's period must be within the uncertainty the joiner
states for it; the mean α0 within four standard errors of the per-request estimates (plus
the log-normal noise's mean shift, exp(σ²/2) − 1, which the truth's median excludes).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import replace

import pytest
from joiner_fleet import FleetRun, batch_shape, run_fleet

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.observations import (
    PeriodMethod,
    RequestObservation,
    StepObservation,
)
from coeffd.simfleet.config import SampleRates
from coeffd.simfleet.scenarios import build

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

DEFAULT = SampleRates()  # vLLM: journey 1.0, step 0.01, rich 0.001, closure 100


def _run(async_scheduling: bool, duration: float, seed: int, **serving: object) -> FleetRun:
    specs = [
        replace(s, serving=replace(s.serving, async_scheduling=async_scheduling, **serving))
        for s in build("steady", duration)
    ]
    return run_fleet(specs, duration, seed=seed, rates=DEFAULT)


#: One run per scheduling mode, shared by the tests of this module (they only read it:
#: records are frozen, and each test joins the batches with its own Joiner).
LONG_S, LONG_SEED = 240.0, 7


class _LongRuns(dict[bool, FleetRun]):
    """async_scheduling → its run, simulated on first use."""

    def __missing__(self, async_scheduling: bool) -> FleetRun:
        fr = self[async_scheduling] = _run(async_scheduling, LONG_S, seed=LONG_SEED)
        return fr


@pytest.fixture(scope="module")
def long_runs() -> Iterator[dict[bool, FleetRun]]:
    runs = _LongRuns()
    yield runs
    runs.clear()  # free the records once the module is done


def _join(fr: FleetRun) -> tuple[Joiner, list]:
    j = Joiner(JoinerConfig())
    out: list = []
    for b in fr.batches:
        out += j.push_many(b)
    return j, out + j.flush()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_default_sampling_spans_match_truth_batch_by_batch(
    async_scheduling: bool, long_runs: dict[bool, FleetRun]
) -> None:
    fr = long_runs[async_scheduling]
    j, out = _join(fr)
    truth = fr.steps_truth()
    steps = [o for o in out if isinstance(o, StepObservation)]
    spans = [o for o in steps if o.period_method is PeriodMethod.JOURNEY_SPAN]
    summary = len(steps) - len(spans)
    covered = 0
    for o in spans:
        ts = [truth[(o.source.id, o.step + i)] for i in range(1 + len(o.more_batches))]
        for batch, t in zip((o.requests, *o.more_batches), ts, strict=True):
            assert t.tokens > 0
            assert batch_shape(batch) == batch_shape(t.blis), (o.step, batch, t.blis)
        err = abs(o.period_us - sum(t.period_us for t in ts))
        assert err <= o.period_uncertainty_us + 0.001, (o.step, err, o.period_uncertainty_us)
        covered += len(ts)
    # the summaries alone give a handful; the journeys pin a large share of all steps
    assert len(spans) >= 20 * max(summary, 1)
    assert covered >= 0.1 * len(truth)
    journey = j.metrics.journey_steps
    assert journey["joined"] == covered
    # prefix-cache hits are in no journey event: admissions are dropped, counted
    assert journey["prefill"] > 0


def test_prefill_steps_are_rebuilt_without_a_prefix_cache() -> None:
    fr = _run(False, 90.0, seed=6, prefix_caching=False)
    j, out = _join(fr)
    truth = fr.steps_truth()
    prefills = 0
    for o in out:
        if isinstance(o, StepObservation) and o.period_method is PeriodMethod.JOURNEY_SPAN:
            for i, batch in enumerate((o.requests, *o.more_batches)):
                t = truth[(o.source.id, o.step + i)]
                assert batch_shape(batch) == batch_shape(t.blis)
                prefills += sum(1 for r in batch if r.progress < r.input_len)
    assert prefills > 0
    # what is still dropped as a prefill is a chunked one (its chunks need the budget split)
    assert j.metrics.journey_steps["prefill"] < j.metrics.journey_steps["joined"]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_alpha0_from_journeys_alone_is_unbiased(
    async_scheduling: bool, long_runs: dict[bool, FleetRun]
) -> None:
    fr = long_runs[async_scheduling]
    j, out = _join(fr)
    reqs = [o for o in out if isinstance(o, RequestObservation)]
    est = [
        o.arrival_to_queued_us - o.queued_loop_wait_us
        for o in reqs
        if o.queued_loop_wait_us is not None
    ]
    assert len(est) >= 0.3 * len(reqs)
    assert j.metrics.loop_waits["busy"] > 0
    conf = fr.result.truth["configurations"][0]
    alpha0 = conf["coefficients"]["points"][0]["alpha"][0]
    sigma = conf["noise"]["alpha_sigma"]
    expected = alpha0 * math.exp(sigma * sigma / 2.0)  # mean of a median-α0 log-normal
    se = statistics.stdev(est) / math.sqrt(len(est))
    assert abs(statistics.fmean(est) - expected) <= 4.0 * se, (statistics.fmean(est), expected, se)
    # the waits removed are real waits: positive and shorter than a second
    assert all(
        0.0 <= o.queued_loop_wait_us < 1e6 for o in reqs if o.queued_loop_wait_us is not None
    )


def test_alpha0_stays_unbiased_when_export_batches_are_lost(
    long_runs: dict[bool, FleetRun],
) -> None:
    # an exporter drops a whole batch when the receiver pushes back: the journeys of the
    # requests around a QUEUED can be gone while its own arrives. Such a request is not
    # "idle" (wait 0, its whole loop wait learned into α0) but unseen.
    fr = long_runs[False]
    # a third of the export batches lost, three in a row at a time (taking them for idle
    # put the mean 5.5 standard errors high)
    lossy = replace(fr, batches=[b for i, b in enumerate(fr.batches) if (i // 3) % 3 != 1])
    j, out = _join(lossy)
    est = [
        o.arrival_to_queued_us - o.queued_loop_wait_us
        for o in out
        if isinstance(o, RequestObservation) and o.queued_loop_wait_us is not None
    ]
    conf = fr.result.truth["configurations"][0]
    alpha0 = conf["coefficients"]["points"][0]["alpha"][0]
    expected = alpha0 * math.exp(conf["noise"]["alpha_sigma"] ** 2 / 2.0)
    se = statistics.stdev(est) / math.sqrt(len(est))
    assert abs(statistics.fmean(est) - expected) <= 4.0 * se, (statistics.fmean(est), expected, se)
    assert j.metrics.loop_waits["unseen"] > 0
