"""Property tests: no input makes the decoder raise; every event is accounted for."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_builders import core_span, journey, request, step_span, summary_attrs

from coeffd.receivers.otlp.decode import Decoder

values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.booleans(),
    st.none(),  # None = attribute removed
)
summary_keys = st.sampled_from(sorted(summary_attrs()))
journey_keys = st.sampled_from(sorted(journey()[1]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(summary_keys, values, max_size=4),
    st.dictionaries(journey_keys, values, max_size=4),
)
def test_any_attribute_values_never_raise(s_over: dict[str, Any], j_over: dict[str, Any]) -> None:
    s = summary_attrs(**{k.replace(".", "__"): v for k, v in s_over.items()})
    j = journey(**{k.replace(".", "__"): v for k, v in j_over.items()})
    res = Decoder().decode(
        request(("vllm.scheduler.step", [step_span(s)]), ("vllm.scheduler", [core_span(j)]))
    )
    # 2 spans + 2 events, each either a record or a rejection
    assert len(res.records) + res.rejected == 4
    assert res.rejected == sum(res.reasons.values())
    assert res.rejected <= 2 and res.rejected_spans == res.rejected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    try:
        res = Decoder().decode_bytes(data)
    except DecodeError:
        return
    assert len(res.records) + res.rejected + res.ignored >= 0
