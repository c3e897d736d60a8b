"""Request (alpha) joins across processes and KV transfer pairing."""

from __future__ import annotations

import msgspec

from coeffd.joiner import Joiner, JoinerConfig
from coeffd.records.events import ApiEvent, ApiKind, KVBatchInfo, KVTransfer, Source
from coeffd.records.observations import KVTransferObservation, RequestObservation, StepObservation
from tests.support.synthetic_engine import SynthConfig, generate


def _all(batches, cfg: JoinerConfig | None = None) -> tuple[Joiner, list]:
    j = Joiner(cfg or JoinerConfig(window_s=60))
    out = []
    for _, recs in batches:
        out += j.push_many(recs)
    return j, out + j.flush()


def test_alpha_targets_equal_truth_on_one_host() -> None:
    batches, truth = generate(SynthConfig(duration_s=10, rate_per_s=20, step_rate=0.05, seed=7))
    _, out = _all(batches)
    reqs = [o for o in out if isinstance(o, RequestObservation)]
    assert len(reqs) == len(truth.alpha_us) > 100
    for r in reqs:
        a2q, f2d, ft2r = truth.alpha_us[r.request_id]
        assert abs(r.arrival_to_queued_us - a2q) <= 0.001 + 1e-6 * a2q  # ns-resolution clocks
        assert abs(r.finished_to_departed_us - f2d) <= 0.002
        if ft2r is not None:
            assert r.streaming is True
            assert abs(r.first_token_to_response_us - ft2r) <= 0.002
        else:
            assert r.first_token_to_response_us is None
        assert r.queue_wait_us is not None and r.queue_wait_us >= 0
        assert r.ttft_us is not None and r.e2e_us is not None and r.e2e_us > r.ttft_us


def test_different_hosts_are_rejected_not_compared() -> None:
    """API and EngineCore with different wall-mono offsets: mono times are not comparable."""
    batches, _ = generate(SynthConfig(duration_s=5, rate_per_s=10, same_host=False, seed=8))
    j, out = _all(batches)
    assert not [o for o in out if isinstance(o, RequestObservation)]
    assert j.metrics.reasons[("request", "rejected", "different_hosts")] > 10


def test_missing_api_span_expires_with_reason() -> None:
    batches, _ = generate(SynthConfig(duration_s=5, rate_per_s=10, seed=9))
    core_only = [(t, recs) for t, recs in batches if type(recs[0]).__name__ != "RequestSpan"]
    j, out = _all(core_only)
    assert not [o for o in out if isinstance(o, RequestObservation)]
    assert j.metrics.reasons[("request", "expired", "no_api_span")] > 10


def test_no_terminal_api_event_still_joins_at_expiry() -> None:
    """Some llm_request spans end without DEPARTED/ABORTED (spec §2.2)."""
    batches, _ = generate(SynthConfig(duration_s=5, rate_per_s=10, seed=10))
    stripped = []
    for t, recs in batches:
        recs = [r for r in recs if not (isinstance(r, ApiEvent) and r.kind is ApiKind.DEPARTED)]
        stripped.append((t, recs))
    _, out = _all(stripped)
    reqs = [o for o in out if isinstance(o, RequestObservation)]
    assert reqs
    assert all(r.finished_to_departed_us is None and r.e2e_us is None for r in reqs)


def test_late_span_counted() -> None:
    batches, _ = generate(SynthConfig(duration_s=20, rate_per_s=10, seed=12))
    first_api = next(
        i for i, (_, recs) in enumerate(batches) if type(recs[0]).__name__ == "RequestSpan"
    )
    late = batches[first_api]
    rest = batches[:first_api] + batches[first_api + 1 :]
    j = Joiner(JoinerConfig(window_s=2.0, max_lateness_s=5.0))  # the span is ~18 s late
    for _, recs in rest:
        j.push_many(recs)
    before = j.metrics.outcomes[("request", "late")]
    assert not [o for o in j.push_many(late[1]) if isinstance(o, RequestObservation)]
    assert j.metrics.outcomes[("request", "late")] == before + 1


def _kv(completed: bool, tid: int, wall: int, step: int, dp: int = 0, seq: int = 0) -> KVTransfer:
    b = KVBatchInfo(Source("kv", (("service.name", "e0"),)), "", seq, wall, dp)
    return KVTransfer(b, completed, tid, "r", "GPU", "CPU", 4, step, True if completed else None)


def test_kv_transfer_tp_copies_once_and_order_free() -> None:
    init = [_kv(False, 7, 1_000_000, 42)] * 4  # TP=4 identical copies
    done = [_kv(True, 7, 1_250_000, 42, seq=1)] * 4
    for order in (init + done, done + init):
        j = Joiner()
        out = j.push_many(order) + j.flush()
        (o,) = [x for x in out if isinstance(x, KVTransferObservation)]
        assert (o.store, o.block_count, o.step, o.duration_us, o.bytes) == (
            True,
            4,
            42,
            250.0,
            None,
        )
        assert j.metrics.outcomes[("kv_transfer", "duplicate")] == 6
    # another DP rank with the same transfer id is another transfer
    j = Joiner()
    out = j.push_many(
        [
            _kv(False, 7, 0, 1),
            _kv(True, 7, 5000, 1),
            _kv(False, 7, 0, 1, dp=1),
            _kv(True, 7, 9000, 1, dp=1),
        ]
    )
    assert len(out) == 2


def test_kv_transfers_attach_to_their_step() -> None:
    cfg = SynthConfig(duration_s=10, rate_per_s=20, step_rate=1.0, kv_offload=True, tp=2, seed=13)
    batches, truth = generate(cfg)
    _, out = _all(batches)
    kv = [o for o in out if isinstance(o, KVTransferObservation)]
    assert len(kv) == len(truth.kv_duration_us)
    for o in kv:
        assert abs(o.duration_us - truth.kv_duration_us[o.transfer_id]) < 0.01
    attached = [t for o in out if isinstance(o, StepObservation) for t in o.kv_transfers]
    assert attached and all(isinstance(t, KVTransferObservation) for t in attached)
    by_step = {o.step: o for o in out if isinstance(o, StepObservation)}
    for t in attached:
        assert t in by_step[t.step].kv_transfers
    assert msgspec.json.encode(attached)


def test_config_override_of_async_mode() -> None:
    batches, _ = generate(SynthConfig(duration_s=5, async_scheduling=False, step_rate=1.0, seed=14))
    _, out = _all(batches, JoinerConfig(window_s=60, async_scheduling=False))
    steps = [o for o in out if isinstance(o, StepObservation)]
    assert steps and not any(o.async_scheduling for o in steps)
