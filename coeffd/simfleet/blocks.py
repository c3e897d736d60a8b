"""Paged KV block pool with prefix caching, as vLLM v1's ``BlockPool`` behaves.

Block 0 is the null block and never allocated, so ``total = num_blocks - 1``. Free blocks
sit in an LRU queue that also holds *evictable cached* blocks: a freed block keeps its
hash (prefix-cache content) until it is reused, at which point a ``BlockRemoved`` event is
queued. Committing a full block queues ``BlockStored`` (spec §5.4).
"""

from __future__ import annotations

from collections import OrderedDict

from coeffd.simfleet.kv import KVEvent

MASK64 = (1 << 64) - 1


_ROOT = 0x9E3779B97F4A7C15  # parent of a first block (hash(None) is per-process in 3.11)


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Chained u64 hash of one full block.

    Deterministic across processes: tuples of ints hash without the per-process salt that
    str/bytes get, and the missing parent is a constant rather than ``None``.
    """
    return hash((_ROOT if parent is None else parent, tokens)) & MASK64


class BlockPool:
    """GPU KV blocks: allocation, refcounts, prefix-cache lookup, event queueing."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self.events: list[KVEvent] = []

    @property
    def total(self) -> int:
        """``kv.blocks_total_gpu``: blocks excluding the null block."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """``kv.blocks_free_gpu``: free-queue length, including evictable cached blocks."""
        return len(self._free)

    def usage(self) -> float:
        """``kv.usage_gpu_ratio`` = ``1 - free/(num_gpu_blocks-1)``."""
        return 1.0 - len(self._free) / self.total

    def lookup(self, hashes: list[int], limit: int) -> list[int]:
        """Blocks of the longest cached prefix of ``hashes`` (at most ``limit`` blocks)."""
        if not self.caching:
            return []
        out: list[int] = []
        cached = self._cached
        for h in hashes[:limit]:
            b = cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks (removing them from the free queue)."""
        for b in blocks:
            if self._ref[b] == 0:
                self._free.pop(b, None)
            self._ref[b] += 1

    def num_idle(self, blocks: list[int]) -> int:
        """How many of ``blocks`` sit in the free queue (touching them shrinks it)."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the LRU head, evicting their cached content."""
        if n > len(self._free):
            raise RuntimeError("allocate beyond free blocks")
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
                self.events.append(("BlockRemoved", [h], "GPU"))
            self._ref[b] = 1
            out.append(b)
        return out

    def free(self, blocks: list[int]) -> None:
        """Drop a reference; freed blocks join the LRU tail last-block-first (as vLLM)."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def commit(
        self,
        blocks: list[int],
        hashes: list[int],
        parent: int | None,
        token_ids: list[int],
    ) -> None:
        """Mark full blocks as cached and queue one ``BlockStored`` for them."""
        if not self.caching or not blocks:
            return
        for b, h in zip(blocks, hashes, strict=True):
            self._hash[b] = h
            self._cached.setdefault(h, b)
        self.events.append(
            ("BlockStored", list(hashes), parent, token_ids, self.block_size, None, "GPU", None)
        )

    def take_events(self) -> list[KVEvent]:
        ev, self.events = self.events, []
        return ev

    def check(self) -> None:
        """Invariants (tests): refcounts vs the free queue, cache map consistency."""
        for b in range(1, self.num_blocks):
            assert self._ref[b] >= 0, b
            assert (self._ref[b] == 0) == (b in self._free), b
        for h, b in self._cached.items():
            assert self._hash[b] == h
