"""Shared short simfleet runs (simulated seconds, not wall seconds)."""

from __future__ import annotations

import pytest
from simfleet_support import Captured

from coeffd import simfleet


@pytest.fixture(scope="session")
def steady_full() -> Captured:
    """Steady scenario, every step summarised and snapshotted (closure 10, no event cap)."""
    return Captured(
        scenario="steady",
        duration_s=6.0,
        seed=11,
        rates=simfleet.SampleRates(1.0, 1.0, 1.0, 10),
        max_events=100_000,
        drain_s=20.0,
        record_steps=True,
    )
