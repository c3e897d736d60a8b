"""Issue 32 item 4 against a live daemon's KV subscriber: 100 valid batches, one forged
frame numbered 2⁶² (stamped in the future), then 2,000 valid batches, published over
ZMQ to the daemon's bound KV endpoint; the counts are read back from ``/metrics``.

Before the fix the forged number became the stream's baseline and all 2,000 later
batches were rejected as duplicates. Target: every valid batch accepted (2,100), the
forged one counted as a sequence jump, no duplicate and no gap. Used by ``bench soak``
and ``bench dos``; run it while nothing else publishes on the endpoint, so that the
counters' deltas are this stream's alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from coeffd.simfleet.kv import encode_batch

__all__ = ["ForgedFrameResult", "forged_frame"]

BEFORE, AFTER = 100, 2000
#: A data-parallel rank no other sender of the benches uses: the stream is new.
RANK = 5000


@dataclass(frozen=True)
class ForgedFrameResult:
    """Deltas of the daemon's KV counters over the run."""

    accepted: float
    jumps: float
    duplicates: float
    gaps: float

    @property
    def ok(self) -> bool:
        """Every valid batch accepted, the forged one a jump, nothing else."""
        return (self.accepted, self.jumps, self.duplicates, self.gaps) == (
            BEFORE + AFTER,
            1,
            0,
            0,
        )

    def __str__(self) -> str:
        return (
            f"{BEFORE} valid, seq 2^62, {AFTER} valid: {self.accepted:,.0f} of "
            f"{BEFORE + AFTER:,} accepted, {self.jumps:.0f} jump, {self.duplicates:.0f} "
            f"duplicates, {self.gaps:.0f} gap batches"
        )


#: ``total(metric name, **labels)``: the daemon's counter summed over matching series.
Total = Callable[..., float]


def _counts(total: Total) -> tuple[float, float, float, float]:
    return (
        total("coeffd_kv_batches_total"),
        total("coeffd_kv_sequence_jumps_total"),
        total("coeffd_events_rejected_total", receiver="kv", reason="duplicate"),
        total("coeffd_kv_sequence_gaps_total"),
    )


def forged_frame(total: Total, endpoint: str, zctx: zmq.Context[Any]) -> ForgedFrameResult:
    """Publish the three parts to ``endpoint`` (the daemon binds it) and wait until the
    daemon counted every batch it accepted (at most 30 s); ``total`` reads its metrics."""
    before = _counts(total)
    sock = zctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    time.sleep(0.5)  # PUB/SUB: the subscription must arrive before the first batch
    t0 = time.time()

    def send(seq: int, ts: float) -> None:
        payload = encode_batch(ts, [("BlockRemoved", [seq + 1], "GPU")], RANK)
        sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    for seq in range(BEFORE):
        send(seq, t0 + seq * 1e-3)
    send(2**62, t0 + 1e6)
    for seq in range(BEFORE, BEFORE + AFTER):
        send(seq, t0 + seq * 1e-3)
    sock.close(5000)
    deadline = time.monotonic() + 30
    seen = 0.0
    while time.monotonic() < deadline:
        now = _counts(total)
        settled = now[0] + now[2] - before[0] - before[2]  # accepted + duplicates
        if settled >= BEFORE + AFTER or (settled == seen and settled > 0):
            break
        seen = settled
        time.sleep(1.0)
    after = _counts(total)
    return ForgedFrameResult(*(a - b for a, b in zip(after, before, strict=True)))
