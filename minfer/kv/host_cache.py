"""A second tier for the prefix cache: full KV blocks the device pool evicts wait in host memory, by hash.

The device's ``BlockPool`` keeps a freed block's prefix hash until a new allocation reuses the block: then the
cached K/V are gone, and a later request with that prefix computes them again. Host memory is larger and
cheaper, so a serving engine can copy an evicted block there first, and copy it back on a later hit -- a copy
over the host link instead of a recompute. vLLM does this with its CPU offloading connector, SGLang with HiCache;
a multi-turn chat, whose every turn repeats the whole conversation so far, is the traffic that gains most.

Two pieces, and the scheduler joins them:

* ``HostPrefixCache``: host blocks named by prefix hash, in LRU order, with a fixed capacity
  (``EngineConfig.host_cache_blocks``). ``lookup`` finds the host blocks that continue a request's device hits;
  ``read`` takes them for this step's copies back; ``store`` gives a host block to an evicted device block.
* ``TieredBlockPool``: the device ``BlockPool`` with one addition -- each cached block it evicts is stored in the
  host cache at once, and the copy is listed for the step's plan (``take_spills``). The pool's own logic is
  untouched: this layer is chosen once, when the engine is built with a host cache.

The bytes move where swap preemption moves them: the host blocks live in the executor's host tensor after the
swap blocks (ids ``first_block ..``), the plan lists the copies (``SchedulerOutput.spill`` and ``.load``), and
the executor makes them before the forward pass, device-to-host first. That order is what keeps the tier
correct within one step: an evicted block is copied out before its new owner writes it (or a load refills
it), and a host block read this step is never chosen to hold a new spill (``reading``).

Invariants (``check_invariants``): every stored hash has one host block and no block holds two hashes; blocks in
use and free ones together are each block ever used, once; a block being read this step is stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from minfer.kv.block_pool import BlockPool


class HostPrefixCache:
    def __init__(self, num_blocks: int, first_block: int = 0) -> None:
        if num_blocks < 0 or first_block < 0:
            raise ValueError(f"num_blocks and first_block must be >= 0, got {num_blocks}, {first_block}")
        self.num_blocks, self.first_block = num_blocks, first_block
        self.blocks: OrderedDict[int, int] = OrderedDict()  # prefix hash → host block, least recently used first
        self.high_water = first_block  # blocks from here on have never been used (no free list built up front)
        self.given_back: list[int] = []  # used once and free again
        self.reading: set[int] = set()  # host blocks this step's plan copies back: not to be overwritten before
        self.num_stored = self.num_loaded = self.num_dropped = 0  # blocks spilled, copied back, evicted from here

    def __len__(self) -> int:
        return len(self.blocks)

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Host blocks of the longest prefix of ``hashes`` held here (a request's hash chain after its device
        hits); takes nothing."""
        found = []
        for h in hashes:
            block = self.blocks.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def read(self, hashes: Sequence[int]) -> list[int]:
        """The host blocks of ``hashes`` (all held: from ``lookup``), taken for this step's copies back: they become
        the most recently used, and no spill may overwrite them before the copies run."""
        blocks = []
        for h in hashes:
            self.blocks.move_to_end(h)
            blocks.append(self.blocks[h])
        self.reading.update(blocks)
        self.num_loaded += len(blocks)
        return blocks

    def store(self, h: int) -> int | None:
        """A host block to copy an evicted device block of hash ``h`` into; None if it is held already (the copy
        is not needed) or there is no room: the cache is empty-sized, or its least recently used block is being
        read this step."""
        if h in self.blocks or self.num_blocks == 0:
            return None
        if self.given_back or self.high_water < self.first_block + self.num_blocks:  # a free block
            block = self.given_back.pop() if self.given_back else self._fresh()
        else:  # full: the least recently used block makes room, unless this step reads it
            oldest, block = next(iter(self.blocks.items()))
            if block in self.reading:
                return None
            del self.blocks[oldest]
            self.num_dropped += 1
        self.blocks[h] = block
        self.num_stored += 1
        return block

    def _fresh(self) -> int:
        self.high_water += 1
        return self.high_water - 1

    def end_step(self) -> None:
        """The step's copies are planned: nothing is being read any more for the next plan."""
        self.reading.clear()

    def check_invariants(self) -> None:
        used = list(self.blocks.values())
        assert len(set(used)) == len(used), "a host block holds two hashes"
        touched = sorted(used + self.given_back)
        assert touched == list(range(self.first_block, self.high_water)), "a host block is lost or counted twice"
        assert len(used) <= self.num_blocks, "more blocks stored than the host cache has"
        assert self.reading <= set(used), "a block being read is not stored"


class TieredBlockPool(BlockPool):
    """A ``BlockPool`` whose evicted cached blocks go to a ``HostPrefixCache``: each eviction stores the block's hash
    there, and the device-to-host copy waits in ``spills`` for the step's plan."""

    def __init__(self, num_blocks: int, block_size: int, host_cache: HostPrefixCache) -> None:
        super().__init__(num_blocks, block_size)
        self.host_cache = host_cache
        self.spills: list[tuple[int, int]] = []  # (device block, host block): copies this step's plan must make

    def _take_free(self) -> int:
        head = next(iter(self.free_queue))
        h = self.block_hash[head]  # the pool's own _take_free evicts it, if cached ...
        block = super()._take_free()
        if h is not None and (host := self.host_cache.store(h)) is not None:  # ... after a copy to host memory
            self.spills.append((block, host))
        return block

    def take_spills(self) -> list[tuple[int, int]]:
        """The copies to host memory of the blocks evicted since the last call (the scheduler's plan takes them)."""
        spills, self.spills = self.spills, []
        return spills
