"""The load-control room: what share of the telemetry is decoded, joined and learned when
the daemon cannot keep up with all of it.

* :mod:`.controller` — :class:`LoadController`, the one owner of the policy (its rules in
  one table), and :class:`LoadMetrics`;
* :mod:`.shedding` — :class:`LoadShedder`: the share of step and request observations
  learned;
* :mod:`.sampling` — :class:`EngineSampler`: the share of engines decoded and joined.

The signals come from elsewhere: the pipeline's backlog, the receivers' pool occupancy
(:mod:`coeffd.receivers.occupancy`), the tick durations and the joiner's shed tally.
"""

from coeffd.daemon.load.controller import (
    LoadController,
    LoadMetrics,
    engine_sampler,
    learning_shedder,
)
from coeffd.daemon.load.sampling import EngineSampler, engine_hash
from coeffd.daemon.load.shedding import LoadShedder, share_limit, spread

__all__ = [
    "EngineSampler",
    "LoadController",
    "LoadMetrics",
    "LoadShedder",
    "engine_hash",
    "engine_sampler",
    "learning_shedder",
    "share_limit",
    "spread",
]
