"""The tick budget (``pipeline.shed_tick_budget``) counts the pipeline worker's CPU time,
not wall time (issue 34): a tick stretched by waiting — for a core shared with vLLM, for
the GIL — is not work that shedding would save, and wall-clock ticks made a daemon on a
shared 2-core machine shed at about half a core."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.load import LoadController, LoadShedder
from coeffd.daemon.settings import load_settings


def test_a_tick_long_in_wall_time_but_short_in_cpu_time_sheds_nothing() -> None:
    cpu = [0.0]
    load = LoadController(
        shedder=LoadShedder(0.1, 0.5, 1 / 32, tick_budget_s=0.1),
        backlog=lambda: 0.0,
        cpu_clock=lambda: cpu[0],
    )
    for _ in range(5):  # ticks of 0.9 s wall, 0.05 s of the worker's CPU
        load.steer()
        cpu[0] += 0.05
        load.observe_tick(0.9)
    load.steer()
    assert load.shedder is not None and load.shedder.ratio == 1.0
    # the same wall time spent working: over budget, the share falls
    cpu[0] += 0.9
    load.observe_tick(0.9)
    load.steer()
    assert load.shedder.ratio < 0.5


def test_cpu_time_never_counts_more_than_the_wall_time() -> None:
    """A mark older than the tick (no steer opened it) is bounded by the tick's wall
    time: the share is never cut for work done outside the tick."""
    cpu = [0.0]
    load = LoadController(
        shedder=LoadShedder(0.1, 0.5, 1 / 32, tick_budget_s=0.1),
        backlog=lambda: 0.0,
        cpu_clock=lambda: cpu[0],
    )
    load.steer()
    cpu[0] += 5.0  # consumes since the steer
    load.observe_tick(0.01)
    load.steer()
    assert load.shedder is not None and load.shedder.ratio == 1.0


def test_the_learning_consumer_measures_its_ticks_in_cpu_time(tmp_path: Path) -> None:
    """Through the real consumer: ticks that wait 0.25 s (a sleep in publishing: no CPU)
    against a 0.05 s budget keep the share at 1; wall-clock ticks cut it to ~0.2."""
    settings = load_settings(
        overrides={
            "publish": {"snapshot_dir": str(tmp_path / "s")},
            "state": {"state_dir": ""},
            "pipeline": {"shed_tick_budget": 0.05, "tick_interval_seconds": 1.0},
        },
        environ={},
    )
    consumer, _ = build_consumer(settings, CollectorRegistry(), live=False)
    consumer.backlog = lambda: 0.0
    consumer.publisher.publish_due = lambda now, force=False: time.sleep(0.25)  # type: ignore[method-assign]
    shedder = consumer.shedder
    assert shedder is not None
    for _ in range(3):
        consumer.tick(0.0)
    consumer.consume([])  # steers: the ticks' share applies
    assert shedder.ratio == 1.0
    consumer.close()
