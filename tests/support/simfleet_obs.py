"""Join observations of a short simfleet run, decoded as the receivers decode them: the
input of the learner tests that need realistic steps or finished requests."""

from __future__ import annotations

from coeffd.joiner import Joiner
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import Record
from coeffd.records.observations import Observation
from coeffd.simfleet import SampleRates, run


def simfleet_observations(
    seconds: float,
    seed: int,
    rates: SampleRates,
    *,
    scenario: str = "steady",
    max_events: int = 100_000,
) -> list[Observation]:
    """Every observation the joiner builds from ``seconds`` of ``scenario`` (then flushed)."""
    dec = Decoder()
    records: list[Record] = []
    run(
        scenario,
        seconds,
        seed,
        rates=rates,
        trace_sinks=[lambda req: records.extend(dec.decode(req).records)],
        max_events=max_events,
    )
    j = Joiner()
    return j.push_many(records) + j.flush()
