"""Helpers shared by the daemon tests: simfleet telemetry as OTLP export requests."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from coeffd.simfleet import SampleRates, run


def fleet_requests(
    scenario: str = "steady", seconds: float = 5, seed: int = 1
) -> list[ExportTraceServiceRequest]:
    """The export requests simfleet's engines send in ``seconds`` of ``scenario``
    (every step and request sampled; a simulated run, about 0.1 s of CPU)."""
    out: list[ExportTraceServiceRequest] = []

    def keep(req: ExportTraceServiceRequest) -> None:
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(req)
        out.append(copy)

    run(scenario, seconds, seed, rates=SampleRates(1.0, 1.0, 0.02, 100), trace_sinks=[keep],
        drain_s=1)  # fmt: skip
    return out
