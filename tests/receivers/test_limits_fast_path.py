"""``check_request``'s size bound (issue 34): a request whose ScopeSpans are small enough
that no limit can be crossed is not walked span by span (the walk cost ~0.5 µs an event,
a quarter of decoding it), and every request gets the same answer, message included, as
the exact walk."""

from __future__ import annotations

import pytest

from coeffd.receivers.otlp import limits as lim_mod
from coeffd.receivers.otlp.limits import LimitExceeded, RequestLimits, check_request
from tests.receivers.corpus_inputs import (
    big_resource,
    big_scope,
    empty_events,
    empty_resource_spans,
    empty_spans,
    nested_any_value,
)
from tests.receivers.otlp_builders import core_span, journey, request, step_span, summary_attrs

SMALL = RequestLimits(
    max_resource_spans=2,
    max_scope_spans=2,
    max_spans=3,
    max_span_items=4,
    max_items=5,
    max_resource_bytes=64,
)


def _vllm_request() -> bytes:
    core = core_span(*(journey(k) for k in ("QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED")))
    steps = step_span(summary_attrs(1042), summary_attrs(1043))
    return request(("vllm.scheduler", [core]), ("vllm.scheduler.step", [steps])).SerializeToString()


def _exact(data: bytes, limits: RequestLimits) -> tuple[str, str] | None:
    try:
        lim_mod._check(data, limits)
    except LimitExceeded as e:
        return e.limit, str(e)
    except (lim_mod._Stop, IndexError):
        return None
    return None


def _bodies() -> list[bytes]:
    real = _vllm_request()
    out = [
        real,
        real * 3,  # three ResourceSpans
        empty_resource_spans(5),
        empty_resource_spans(20_000),
        empty_spans(5),
        empty_spans(150_000),
        empty_events(10),
        big_resource(100),
        big_resource(70_000),
        big_scope(40),
        nested_any_value(30),
    ]
    # truncated and corrupted copies: malformed bytes are the parser's, unless a limit
    # is crossed before them
    out += [real[:cut] for cut in range(0, len(real), max(1, len(real) // 40))]
    out += [b[: len(b) // 2] for b in out[1:11]]
    out += [real[:10] + b"\xff" + real[11:], real + b"\x0a"]
    return out


@pytest.mark.parametrize("limits", [RequestLimits(), SMALL], ids=["default", "small"])
def test_same_answer_as_the_exact_walk(limits: RequestLimits) -> None:
    for body in _bodies():
        got = check_request(body, limits)
        want = _exact(body, limits)
        assert (None if got is None else (got.limit, str(got))) == want, body[:40]


def test_a_vllm_request_is_not_walked_span_by_span(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(data: bytes, limits: RequestLimits) -> None:
        raise AssertionError("walked span by span")

    monkeypatch.setattr(lim_mod, "_check", walked)
    assert check_request(_vllm_request() * 2, RequestLimits()) is None
    # over a bound the size alone cannot clear it: the exact walk decides
    with pytest.raises(AssertionError):
        check_request(empty_spans(150_000), RequestLimits())
