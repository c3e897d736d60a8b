"""A request's loop wait before the anchor types are calibrated (``joiner.
loop_wait_min_calibration``): at vLLM's 1 % step sampling ``min_calibration`` coincidences
of a summary and an anchor take minutes of an engine, and a loop wait only needs the
schedule start to ``loop_wait_max_uncertainty_us``, so it takes an anchor type's mean
offset from fewer.

The engine here is synchronous, steps 10 ms apart, and every QUEUED anchor sits 100 µs
before the start it pins; a request QUEUED at step ``Q`` waited half the iteration
(5 ms) from the drain before ``S(Q)``.
"""

from __future__ import annotations

import pytest

from coeffd.joiner import JoinerConfig
from coeffd.joiner.composition import Life
from coeffd.joiner.loopwait import loop_wait
from coeffd.joiner.starts import COMPL, QUEUED, SCHED, Anchors, StepStarts
from coeffd.records.events import BatchSummary, Source, SpanInfo

PERIOD = 10_000_000
OFFSET = 100_000  # S(n) - t of a QUEUED(n-1) anchor
Q = 1000  # far from the calibration's summaries: only the anchor before it pins S(Q)
INFO = SpanInfo(b"\0" * 16, b"\1" * 8, b"", "s", "vllm.scheduler.step", Source("e", ()), 0, 0)


def _start(n: int) -> int:
    return n * PERIOD


def _summary(n: int) -> BatchSummary:
    s = _start(n)
    return BatchSummary(INFO, s, n, s, s + 200_000, 200, 4, 0, 0, 4, 4, 0, 4, 0, 0, 0.1, 100, 90)


def _starts(coincidences: int, config: JoinerConfig) -> StepStarts:
    """An engine whose QUEUED anchors coincided with a summary ``coincidences`` times, a
    request running across ``Q``, and another request QUEUED just before ``S(Q)``."""
    summaries: dict[int, BatchSummary] = {}
    anchors: Anchors = ({}, {}, {})
    for k in range(coincidences):
        n = 100 + 10 * k
        summaries[n] = _summary(n)
        anchors[QUEUED][n - 1] = (_start(n) - OFFSET,)
    anchors[QUEUED][Q - 1] = (_start(Q) - OFFSET,)
    lives = {Q >> 6: [Life(Q - 20, Q - 19, Q + 20, 10, 40, False)]}
    st = StepStarts(summaries, anchors, lives, config, async_mode=False)
    for n in list(summaries):
        st.calibrate(n, 0)
    return st


QUEUED_AT = _start(Q + 1) - OFFSET  # the request's own QUEUED(Q): just before S(Q+1)


@pytest.mark.parametrize("coincidences", [4, 5, 7])
def test_a_loop_wait_is_decided_from_loop_wait_min_calibration_coincidences(
    coincidences: int,
) -> None:
    st = _starts(coincidences, JoinerConfig())  # min_calibration 8, loop wait's 4
    calibrated = [list(d) for d in st.cal.deltas]
    wait, how = loop_wait(st, QUEUED_AT, Q)
    assert how == "busy"
    assert wait == pytest.approx(PERIOD / 2, abs=1.0)
    # an answer only: nothing calibrated or cross-calibrated by it, nothing cached
    assert [list(d) for d in st.cal.deltas] == calibrated
    assert all(len(c) == 0 for c in st.cal.cross)
    assert st._usable == [False, False, False]


@pytest.mark.parametrize("coincidences", [0, 1, 3])
def test_no_loop_wait_below_loop_wait_min_calibration(coincidences: int) -> None:
    st = _starts(coincidences, JoinerConfig())
    assert loop_wait(st, QUEUED_AT, Q) == (None, "unpinned")


def test_before_the_setting_four_coincidences_left_the_wait_unpinned() -> None:
    # loop_wait_min_calibration = min_calibration is the joiner before the setting
    old = JoinerConfig(loop_wait_min_calibration=8)
    assert loop_wait(_starts(4, old), QUEUED_AT, Q) == (None, "unpinned")
    assert loop_wait(_starts(8, old), QUEUED_AT, Q)[1] == "busy"


def test_the_lower_threshold_is_asked_only_while_it_could_answer_otherwise() -> None:
    # a type with 4..7 coincidences is the only one whose offset the threshold changes
    st = _starts(5, JoinerConfig())
    assert st.answers_differ(4)
    st.cal.deltas[QUEUED].extend([float(OFFSET)] * 3)
    assert not st.answers_differ(4)  # QUEUED calibrated, the others seen by neither
    st.cal.deltas[SCHED].extend([float(OFFSET)] * 4)
    assert st.answers_differ(4)
    st.cal.deltas[SCHED].extend([float(OFFSET)] * 4)
    # cross-calibrated offsets count from 4x the coincidences: 16 of them at 4
    st.cal.cross[COMPL].extend([float(OFFSET)] * 16)
    assert st.answers_differ(4)
    st.cal.cross[COMPL].extend([float(OFFSET)] * 16)
    assert not st.answers_differ(4)
