"""bench serve --sampling default renders requests by patching template bytes: the result
must be exactly what :func:`coeffd.simfleet.replica` makes (the engine name padded)."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench._fleetsize import DEFAULT_RATES, TAG_DIGITS, FleetSender, Template
from bench.serve import record
from coeffd.simfleet import replica


def _expected(req: ExportTraceServiceRequest, tag: int, shift: int) -> bytes:
    out = replica(req, tag, shift)
    for rs in out.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == "coeffd.engine":
                name = kv.value.string_value.rsplit("~", 1)[0]
                kv.value.string_value = f"{name}~{tag:0{TAG_DIGITS}d}"
    return out.SerializeToString()


def test_template_render_is_replica() -> None:
    rec = record("steady", 4.0, 3, DEFAULT_RATES)
    assert rec.requests
    for req in rec.requests:
        t = Template(req)
        for tag, shift in ((0, 0), (123_457, 10**12), (2**32 - 1, 7)):
            assert t.render(tag, shift) == _expected(req, tag, shift)


def test_engines_are_distinct_streams() -> None:
    rec = record("steady", 4.0, 3, DEFAULT_RATES)
    s = FleetSender(1, rec, [Template(r) for r in rec.requests])  # connects lazily
    try:
        s.grow(3)  # one recorded engine: three copies of it
        assert len(s.streams) == 1
        assert s.rate == 3 * rec.total / (s.duration_ns / 1e9)
        bodies = [s.next()[1] for _ in range(3 * len(rec.requests))]
        assert len(set(bodies)) == len(bodies)  # new ids per copy: nothing duplicated
    finally:
        s.close()
