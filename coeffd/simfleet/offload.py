"""The CPU offload tier of one simulated engine (vLLM's offloading KV connector).

An LRU of block hashes on the CPU: full blocks are stored there as they are committed
(submitted with the next step's batch, tagged with that step: spec §5.6), a waiting
request whose prefix the tier holds is loaded back before it is admitted, and each
transfer completes after ``kv_base_us + bytes / bandwidth``. Everything the connector
reports — the scheduler's commits and evictions, the workers' transfer events (one per
TP worker, spec §5.8), the CPU tier's ``BlockStored``/``BlockRemoved`` — is queued here
and handed to the engine's next KV publish (:meth:`OffloadTier.publish_into`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from coeffd.simfleet.kv import KVEvent
from coeffd.simfleet.state import Batch, Entry, Req, Transfer

__all__ = ["OffloadTier"]


class OffloadTier:
    """CPU tier state, planned stores and loads, and transfers in flight."""

    def __init__(
        self,
        cpu_blocks: int,
        block_size: int,
        tp: int,
        duration_ns: Callable[[bool, int, int], int],
    ) -> None:
        self.cpu_blocks = cpu_blocks  # 0: no tier
        self.bs = block_size
        self.tp = max(1, tp)
        # (store, blocks, t) -> ns; the engine's, so noise draws keep its random stream
        self._duration_ns = duration_ns
        self.tier: OrderedDict[int, None] = OrderedDict()
        self._pending_stores: list[Transfer] = []
        self._pending_loads: list[Transfer] = []
        self._inflight: list[Transfer] = []
        self._tid = 0
        self._sched_events: list[KVEvent] = []
        self._cpu_events: list[KVEvent] = []
        self.num_transfers = 0

    def held(self, hashes: Iterable[int]) -> int:
        """How many of ``hashes``, from the first, the tier holds."""
        c = 0
        for h in hashes:
            if h not in self.tier:
                break
            c += 1
        return c

    def take_deferred(self) -> list[Transfer]:
        """Stores planned in earlier steps: they go out with the step being scheduled."""
        deferred, self._pending_stores = self._pending_stores, []
        return deferred

    def plan_stores(self, entries: list[Entry], n_step: int) -> None:
        """Connector metadata of step ``n_step``: new full blocks go to the CPU tier."""
        for e in entries:
            r = e.req
            if r.committed <= r.cpu_stored:
                continue
            new = [h for h in r.hashes[r.cpu_stored : r.committed] if h not in self.tier]
            r.cpu_stored = r.committed
            if not new:
                continue
            over = len(self.tier) + len(new) - self.cpu_blocks
            if over > 0:
                evicted = [
                    self.tier.popitem(last=False)[0] for _ in range(min(over, len(self.tier)))
                ]
                self._sched_events.append(
                    ("CacheEviction", "CPU", len(evicted), "lru", n_step, None)
                )
                self._cpu_events.append(
                    ("BlockRemoved", [h.to_bytes(8, "big") for h in evicted], "CPU")
                )
            new = new[: self.cpu_blocks]
            for h in new:
                self.tier[h] = None
            self._sched_events.append(
                ("CacheStoreCommitted", r.internal_id, "CPU", len(new), n_step)
            )
            self._tid += 1
            self._pending_stores.append(
                Transfer(self._tid, r.internal_id, True, len(new), new, 0, 0)
            )

    def start_load(self, r: Req, blocks: int, n_step: int) -> None:
        """Load ``blocks`` of ``r``'s prefix back; it waits (``loading``) until done."""
        # created while admitting, before the connector learns the new step: N-1 (spec §5.6)
        self._sched_events.append(("CacheLoadCommitted", r.internal_id, "CPU", blocks, n_step - 1))
        r.loading = True
        self._tid += 1
        tr = Transfer(self._tid, r.internal_id, False, blocks, [], n_step, 0, r)
        self._pending_loads.append(tr)

    def submit(self, b: Batch, deferred: list[Transfer]) -> None:
        """Send the deferred stores and this step's loads with batch ``b``."""
        if not (deferred or self._pending_loads):
            return
        jobs = deferred + self._pending_loads
        self._pending_loads = []
        for tr in jobs:
            tr.step = b.step if tr.store else tr.step
            tr.done_ns = b.dispatch_ns + self._duration_ns(tr.store, tr.blocks, b.dispatch_ns)
            src, dst = ("GPU", "CPU") if tr.store else ("CPU", "GPU")
            ev = ("TransferInitiated", tr.tid, tr.req_id, src, dst, tr.blocks, tr.step)
            b.worker_events.extend([ev] * self.tp)  # every TP worker reports it (spec §5.8)
            b.transfers.append(tr)
            self.num_transfers += 1

    def publish_into(self, events: list[KVEvent], b: Batch, t: int) -> None:
        """Append what the connector reports with batch ``b``'s output at ``t``."""
        if self._sched_events:
            events.extend(self._sched_events)
            self._sched_events = []
        if self._cpu_events:
            events.extend(self._cpu_events)
            self._cpu_events = []
        # completions are polled from jobs reported in earlier outputs, then this batch's
        # submissions join them (a job never completes in the output that submits it)
        if self._inflight:
            events.extend(self._completed(t))
        events.extend(b.worker_events)
        self._inflight.extend(b.transfers)

    def _completed(self, t: int) -> list[KVEvent]:
        out: list[KVEvent] = []
        keep = []
        for tr in self._inflight:
            if tr.done_ns <= t:
                src, dst = ("GPU", "CPU") if tr.store else ("CPU", "GPU")
                ev = ("TransferCompleted", tr.tid, tr.req_id, src, dst, tr.blocks, True, tr.step)
                out.extend([ev] * self.tp)
                if tr.store:
                    self._cpu_events.append(
                        (
                            "BlockStored",
                            [h.to_bytes(8, "big") for h in tr.hashes],
                            None,
                            [],
                            self.bs,
                            None,
                            "CPU",
                            None,
                        )
                    )
                elif tr.req is not None:
                    tr.req.loading = False
                    tr.req.cpu_loaded = True
            else:
                keep.append(tr)
        self._inflight = keep
        return out
