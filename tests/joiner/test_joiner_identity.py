"""The joiner's output for a fixed input is pinned: a change of its cost (issue 34's
cheaper estimates of step starts, say) must not change a single observation.

The input is one simfleet engine at sparse step sampling (journeys 1.0, steps 0.1: as
at vLLM's default 0.01, loop waits and journey spans estimate most step starts, with
more of them in a short run) for a fixed seed, through the real OTLP decode; the digest
covers every observation in order. When the joiner's
output changes on purpose, the new digest goes in with the reason in the commit.
"""

from __future__ import annotations

import collections
import hashlib

import msgspec

from coeffd.joiner import Joiner
from coeffd.simfleet import SampleRates
from tests.joiner.joiner_fleet import run_fleet

DIGEST = "2343af853d6344cf29fea5808bbb04703388735be9f903a4bdfb57467dd7706c"


def test_observations_unchanged_for_a_fixed_input() -> None:
    fr = run_fleet("steady", 30.0, seed=5, rates=SampleRates(1.0, 0.1, 0.001, 100))
    j = Joiner()
    out = [o for b in fr.batches for o in j.push_many(b)]
    out += j.flush()
    kinds = collections.Counter(type(o).__name__ for o in out)
    waits = j.metrics.loop_waits  # the estimates of step starts: found and not found
    assert kinds["StepObservation"] >= 100 and waits["busy"] >= 10, (kinds, waits)
    assert waits["unpinned"] >= 10 and waits["uncalibrated"] >= 10, waits
    digest = hashlib.sha256(msgspec.msgpack.encode(out)).hexdigest()
    assert digest == DIGEST, (len(out), digest)
