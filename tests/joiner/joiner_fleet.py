"""Drive ``simfleet`` in process and collect the joiner's input records plus the truth.

Spans go through the real OTLP path (SDK → ``ExportTraceServiceRequest`` →
``receivers.otlp.decode``) and KV batches through ``receivers.kv.decode``, exactly as the
daemon receives them. Each export request / KV message is one delivery batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from coeffd.receivers.kv.decode import decode_kv_message
from coeffd.receivers.otlp.decode import Decoder, decode_request
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import Record


@dataclass
class FleetRun:
    batches: list[list[Record]] = field(default_factory=list)
    result: Any = None

    def steps_truth(self) -> dict[tuple[str, int], Any]:
        """(engine source id, step) -> simfleet StepRecord."""
        out: dict[tuple[str, int], Any] = {}
        for conf, eng in zip(self.result.truth["configurations"], self.result.engines, strict=True):
            sid = source_from_attributes(conf["resource"]).id
            for s in eng.steps:
                out[(sid, s.step)] = s
        return out


class _KVSink:
    def __init__(self, run: FleetRun) -> None:
        self.run = run

    def publish(self, topic: bytes, seq: int, payload: bytes, source: Mapping[str, Any]) -> None:
        recs, reason = decode_kv_message(
            [topic, seq.to_bytes(8, "big"), payload], source_from_attributes(source)
        )
        assert reason is None, reason
        self.run.batches.append(list(recs))

    def close(self) -> None:
        pass


def run_fleet(scenario: Any, duration_s: float, seed: int = 1, **kw: Any) -> FleetRun:
    """Run a scenario with ``record_steps`` and collect every delivery batch in order."""
    from coeffd.simfleet.run import run

    fr = FleetRun()
    dec = Decoder()

    def sink(req: ExportTraceServiceRequest) -> None:
        res = decode_request(req, dec)
        fr.batches.append(list(res.records))

    fr.result = run(
        scenario,
        duration_s,
        seed,
        trace_sinks=[sink],
        kv_sinks=[_KVSink(fr)],
        record_steps=True,
        drain_s=5.0,
        **kw,
    )
    return fr


def batch_shape(reqs: Any) -> list[tuple[int, int, bool, int]]:
    """A batch as BLIS's features see it, in a fixed order: a prefill through its input
    length and new tokens (its progress is BLIS's 0 at admission in a reconstruction,
    vLLM's cached count in simfleet's truth), a decode through its context too."""
    return sorted(
        (
            r.input_len,
            r.new_tokens,
            r.progress >= r.input_len,
            r.progress if r.progress >= r.input_len else -1,
        )
        for r in reqs
    )
