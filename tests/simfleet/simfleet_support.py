"""Helpers for the simfleet tests: captured runs in memory, runs to bytes."""

from __future__ import annotations

import io
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from coeffd import simfleet
from coeffd.simfleet.kv import MemoryKVSink


class Captured:
    """A run with every export request and KV batch kept in memory."""

    def __init__(self, **kw: Any) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.kv = MemoryKVSink()
        self.result = simfleet.run(trace_sinks=[self.requests.append], kv_sinks=[self.kv], **kw)

    def spans(self) -> list[tuple[str, Any, Any]]:
        """(scope name, resource, span) for every exported span."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        out.append((ss.scope.name, rs.resource, sp))
        return out


def run_to_bytes(**kw: Any) -> tuple[bytes, str]:
    out = io.BytesIO()
    kv = io.StringIO()
    res = simfleet.run(trace_out=out, kv_out=kv, **kw)
    truth = io.StringIO()
    simfleet.write_truth(res.truth, truth)
    return out.getvalue(), kv.getvalue() + truth.getvalue()
