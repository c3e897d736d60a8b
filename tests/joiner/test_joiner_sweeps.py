"""Sweeps between ticks visit only the engines fed since their last visit (issue 34):
what any other engine holds is due by a clock that has not moved since, so the
observations — and their order — must be those of sweeps that visit every engine.

Three synthetic engines interleaved by delivery time, pushed live with a tick a second
(sweeps also run every 200 ms of data between ticks), then idle ticks that finish what
they hold; and the same input replayed without a receiver clock.
"""

from __future__ import annotations

import functools
import heapq

import msgspec
import pytest

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.joiner import joiner as joiner_mod
from coeffd.records.observations import Observation, RequestObservation, StepObservation
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate

CFG = JoinerConfig(window_s=5.0, loop_wait_delay_s=2.0)


class EveryEngineJoiner(Joiner):
    """The joiner as it was: every sweep visits every engine."""

    def _sweep(self, now: int | None) -> None:
        self._swept_now = joiner_mod._UNSWEPT
        super()._sweep(now)


@functools.cache
def _fleet() -> tuple[Batch, ...]:
    runs = [
        generate(
            SynthConfig(
                duration_s=25, rate_per_s=8 + 4 * k, step_rate=0.1, engine_name=f"e{k}", seed=k
            )
        )[0]
        for k in range(3)
    ]
    return tuple(heapq.merge(*runs, key=lambda b: b[0]))


def _live(j: Joiner) -> list[Observation]:
    out: list[Observation] = []
    batches = _fleet()
    tick = batches[0][0]
    for t, recs in batches:
        out += j.push_many(recs)
        if t >= tick:
            out += j.tick(t)
            tick = t + S_NS
    for _ in range(12):  # the fleet falls silent: the clock finishes what is held
        tick += S_NS
        out += j.tick(tick)
    return out + j.flush()


def _replay(j: Joiner) -> list[Observation]:
    out: list[Observation] = []
    for _, recs in _fleet():
        out += j.push_many(recs)
    return out + j.flush()


@pytest.mark.parametrize("drive", [_live, _replay], ids=["live", "replay"])
def test_sweeps_of_the_fed_engines_build_what_sweeps_of_all_build(drive: object) -> None:
    run = drive  # type: ignore[assignment]
    got = run(Joiner(CFG))  # type: ignore[operator]
    want = run(EveryEngineJoiner(CFG))  # type: ignore[operator]
    steps = [o for o in want if isinstance(o, StepObservation)]
    waits = [o for o in want if isinstance(o, RequestObservation) and o.queued_loop_wait_us]
    assert len({o.source.id for o in steps}) == 3 and len(steps) >= 100 and waits
    assert msgspec.msgpack.encode(got) == msgspec.msgpack.encode(want)
