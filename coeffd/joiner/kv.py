"""KV offload transfers: pair ``TransferInitiated`` with ``TransferCompleted``.

Both events come from the same publisher (one EngineCore), so their batch wall clocks
are one clock. Every TP worker reports the same transfer (rank-0 numbering), so copies
are deduplicated on ``(tag, transfer_id)`` per DP rank of a publisher (spec §5.8).
"""

from __future__ import annotations

from coeffd.records.events import KVTransfer
from coeffd.records.observations import KVTransferObservation

TransferKey = tuple[str, int, int]  # (publisher source id, dp rank, transfer id)


def transfer_key(t: KVTransfer) -> TransferKey:
    """Identity of a logical transfer."""
    return (t.batch.source.id, t.batch.dp_rank, t.transfer_id)


def is_store(t: KVTransfer) -> bool:
    """GPU→(CPU|other) is a store, anything→GPU a load.

    >>> from coeffd.records.events import KVBatchInfo, KVTransfer, Source
    >>> b = KVBatchInfo(Source("s", ()), "", 0, 0, 0)
    >>> is_store(KVTransfer(b, False, 1, "r", "GPU", "CPU", 2, 7))
    True
    """
    return t.dest_medium != "GPU"


def pair(init: KVTransfer, done: KVTransfer) -> KVTransferObservation:
    """The observation of one completed transfer (bytes left to the features stage)."""
    step = init.scheduler_step if init.scheduler_step is not None else done.scheduler_step
    return KVTransferObservation(
        source=init.batch.source,
        dp_rank=init.batch.dp_rank,
        transfer_id=init.transfer_id,
        store=is_store(init),
        block_count=init.block_count,
        duration_us=(done.batch.wall_ns - init.batch.wall_ns) / 1e3,
        step=step,
        success=bool(done.success) if done.success is not None else True,
    )
