"""The joiner's engine table at ``joiner.max_engines``: bounded, the stalest forgotten,
and not one pass over every engine per new engine (issue 34: a fleet with more live
identities than the cap made each new engine, so each of its spans, O(engines))."""

from __future__ import annotations

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.events import BatchSummary, Source, SpanInfo, StepSpan

S = 1_000_000_000


def _step_span(engine: int, wall_ns: int) -> StepSpan:
    """One ``scheduler_steps`` span (steps 1..100) of engine ``engine`` ending at
    ``wall_ns``: enough for the joiner to hold state for that engine."""
    src = Source(f"engine-{engine}", (("coeffd.engine", f"engine-{engine}"),))
    info = SpanInfo(
        engine.to_bytes(16, "big"),
        (10**6 + engine).to_bytes(8, "big"),
        b"",
        "scheduler_steps",
        "vllm.scheduler.step",
        src,
        wall_ns - S,
        wall_ns,
    )
    return StepSpan(info, 1, 1, 100, 100)


def _summary(span: StepSpan, step: int) -> BatchSummary:
    t = span.span.end_wall_ns
    return BatchSummary(
        span.span, t, step, t, t + 250_000, 250, 4, 1, 1, 3, 100, 64, 3, 0, 0, 0.3, 8192, 5000
    )


def test_at_the_cap_the_stalest_engines_go_and_the_table_stays_bounded() -> None:
    cap = 64
    j = Joiner(JoinerConfig(max_engines=cap, window_s=3600.0, max_lateness_s=3600.0))
    t0 = 1_000 * S
    for e in range(400):
        sp = _step_span(e, t0 + e * S)  # engine e last heard at t0 + e s
        j.push_many([sp, _summary(sp, 50)])
        assert len(j._engines) <= cap
    held = sorted(int(sid.rsplit("-", 1)[1]) for sid in j._engines)
    # what is held is the engines heard from last, however many passes it took
    assert held == list(range(400 - len(held), 400)), held
    assert len(held) > cap - cap // 16 - 1
    # each pass forgets a 16th of the cap: (400 - 64) / 4 passes, not 336
    assert j.evictions == (400 - cap + (cap // 16) - 1) // (cap // 16)
    # their pending steps were counted, not lost silently
    assert j.metrics.reasons[("step", "expired", "engine_capacity")] == 400 - len(held)


def test_an_evicted_engine_that_speaks_again_is_joined_afresh() -> None:
    j = Joiner(JoinerConfig(max_engines=16, window_s=3600.0, max_lateness_s=3600.0))
    t0 = 1_000 * S
    for e in range(40):
        j.push_many([_step_span(e, t0 + e * S)])
    assert "engine-0" not in j._engines
    j.push_many([_step_span(0, t0 + 100 * S)])
    assert "engine-0" in j._engines and len(j._engines) <= 16


def test_the_default_cap_holds_a_thousand_engine_fleet_through_restarts() -> None:
    """1,000 engines, then each replaced once by a pod under a new identity (a rolling
    restart; the old identities are kept for max_lateness_s): nothing evicted."""
    j = Joiner()
    t0 = 1_000 * S
    for e in range(2_000):
        j.push_many([_step_span(e, t0 + e * 10_000_000)])  # all within 20 s
    assert len(j._engines) == 2_000 and j.evictions == 0


def test_the_inlined_anchor_table_agrees_with_anchor_type() -> None:
    """EngineState.add_anchor types journey events by a table (once per event); it must
    give what starts.anchor_type says for every kind and finish status."""
    from coeffd.joiner import engine, starts
    from coeffd.records.events import JourneyEvent, JourneyKind

    info = _step_span(1, 10 * S).span
    eng = engine.EngineState(info.source, JoinerConfig())
    for kind in JourneyKind:
        for status in ("stopped", "aborted", "length", None):
            ev = JourneyEvent(
                info, kind, 10 * S, 5 * S, 40, "DECODE", 8, 8, 1, 4, 0, finish_status=status
            )  # type: ignore[arg-type]
            typ = starts.anchor_type(ev)
            before = [dict(d) for d in eng.anchors]
            eng.add_anchor(ev)
            got = [t for t in range(3) if eng.anchors[t] != before[t]]
            assert got == ([] if typ is None else [typ]), (kind, status, got, typ)
            for d in eng.anchors:
                d.clear()
