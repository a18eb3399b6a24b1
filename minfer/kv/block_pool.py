"""The BlockPool: a fixed set of KV blocks, lent to requests and taken back.

A request owns a *block table*: the list of block ids that hold its tokens, in order. Blocks are
handed out only when a request's last block is full, so a request wastes at most one partly filled
block -- instead of reserving ``max_len`` slots up front, as a contiguous cache must.

Three ideas carry the rest:

* **Reference counts.** A block may sit in several tables at once (requests sharing a prompt prefix).
  It returns to the free list only when the last table lets go.
* **A free list in LRU order.** Freed blocks join the tail; new blocks come from the head, so the block
  freed longest ago is reused first.
* **A prefix-hash index.** A *full* block can be named by a hash chain -- the hash of its parent's hash
  and its own token ids -- which identifies the block's whole prefix. Freed blocks keep their hash while
  they wait in the free list, so a later request with the same prefix takes them back (a cache hit)
  until a new allocation evicts them.

Invariants (``check_invariants``): free + in use = total; a block is free exactly when its ref count
is 0; each ref count equals the number of tables holding the block; the hash index and the per-block
hashes agree; every table is long enough for the tokens it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from minfer.units import ceil_div


class BlockPoolError(ValueError):
    """Raised for a request the pool cannot honour; the pool is left unchanged."""


def hash_block(parent: int | None, token_ids: Sequence[int]) -> int:
    """The hash chain: a block's key depends on its tokens *and* every block before it."""
    return hash((parent, tuple(token_ids)))


def chain_hashes(token_ids: Sequence[int], block_size: int, known: list[int] | None = None) -> list[int]:
    """Hashes of every full block of ``token_ids``, extending the already-known prefix ``known``."""
    hashes = list(known or [])
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


@dataclass(slots=True)
class PoolSnapshot:
    """Plain data of the pool at one moment: what widgets draw and tests assert on."""

    num_blocks: int
    block_size: int
    tables: dict[str, list[int]]  # owner → its block ids, in token order
    num_tokens: dict[str, int]  # owner → token slots it fills
    ref_counts: list[int]  # per block
    filled: list[int]  # per block: slots holding tokens (for a shared block, the fullest use)
    cached: list[bool]  # per block: has a prefix hash (reusable by a later request)
    free: list[int]  # free block ids, next to be reused first

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def utilization(self) -> float:
        """Fraction of blocks in use."""
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    @property
    def internal_waste(self) -> int:
        """Empty slots inside blocks in use: at most one partly filled block per request."""
        return sum(self.block_size - f for f, r in zip(self.filled, self.ref_counts) if r > 0)

    def owners(self) -> list[list[str]]:
        """Per block, the owners holding it (more than one: a shared prefix block)."""
        out: list[list[str]] = [[] for _ in range(self.num_blocks)]
        for owner, table in self.tables.items():
            for b in table:
                out[b].append(owner)
        return out


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head = LRU
        self.tables: dict[str, list[int]] = {}
        self.num_tokens: dict[str, int] = {}  # slots filled per owner
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.num_hashed: dict[str, int] = {}  # leading blocks of each table that carry a hash
        self.num_evictions = 0

    # ---- plain allocation -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: the ceiling of ``num_tokens / block_size``."""
        # BEGIN EXERCISE E3.1
        return ceil_div(num_tokens, self.block_size)
        # END EXERCISE

    def blocks_needed(self, owner: str, num_new_tokens: int) -> int:
        """New blocks ``owner`` must take to hold ``num_new_tokens`` more tokens."""
        # BEGIN EXERCISE E3.1
        need = self.blocks_for(self.num_tokens.get(owner, 0) + num_new_tokens) - len(self.tables.get(owner, ()))
        return need if need > 0 else 0  # a table may hold more than it fills (admission="reserve")
        # END EXERCISE

    def allocate(self, owner: str, n: int) -> list[int]:
        """Append ``n`` fresh blocks to ``owner``'s table (empty: they hold no tokens yet)."""
        # BEGIN EXERCISE E3.1
        if n < 0:
            raise BlockPoolError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self.free_queue):
            raise BlockPoolError(f"{owner!r} asked for {n} blocks but only {len(self.free_queue)} are free")
        blocks = [self._take_free() for _ in range(n)]
        self.tables.setdefault(owner, []).extend(blocks)
        self.num_tokens.setdefault(owner, 0)
        self.num_hashed.setdefault(owner, 0)
        return blocks
        # END EXERCISE

    def try_append_slots(self, owner: str, num_new_tokens: int = 1) -> list[int] | None:
        """Grow ``owner`` by ``num_new_tokens`` token slots, taking a block only when the last is full.
        Returns the blocks taken (usually none: 15 of 16 decode steps fit in the last block), or ``None``,
        changing nothing, if the pool has too few free blocks."""
        # BEGIN EXERCISE E3.1
        filled = self.num_tokens.get(owner, 0) + num_new_tokens
        table = self.tables.get(owner)
        if table is not None and filled <= len(table) * self.block_size:  # most decode steps: the last block has room
            self.num_tokens[owner] = filled
            return []
        need = self.blocks_needed(owner, num_new_tokens)
        if need > len(self.free_queue):
            return None
        blocks = self.allocate(owner, need)  # a new owner gets its table here, even with need == 0
        self.num_tokens[owner] = filled
        return blocks
        # END EXERCISE

    def append_slots(self, owner: str, num_new_tokens: int = 1) -> list[int]:
        """``try_append_slots``, raising ``BlockPoolError`` (and changing nothing) if the pool is short."""
        blocks = self.try_append_slots(owner, num_new_tokens)
        if blocks is None:
            raise BlockPoolError(f"{owner!r} needs {self.blocks_needed(owner, num_new_tokens)} more blocks "
                                 f"but only {len(self.free_queue)} are free")
        return blocks

    def rollback_slots(self, owner: str, num_tokens: int) -> None:
        """Shrink ``owner`` back to its first ``num_tokens`` slots: speculative decoding's rejected guesses, whose K/V
        were computed after a wrong token. The blocks stay in its table, for the next steps' tokens to fill (vLLM
        keeps them too); none of the dropped slots was in a hashed block -- hashing stops at computed tokens."""
        if not 0 <= num_tokens <= self.num_tokens[owner]:
            raise BlockPoolError(f"{owner!r} holds {self.num_tokens[owner]} slots: cannot roll back to {num_tokens}")
        if num_tokens < self.num_hashed[owner] * self.block_size:
            raise BlockPoolError(f"{owner!r}: rolling back to {num_tokens} slots would cut into a hashed block")
        self.num_tokens[owner] = num_tokens

    def free(self, owner: str) -> None:
        """Give back every block of ``owner``. The tail goes to the free list first, so that when cached
        blocks are evicted, a prompt's last blocks go before its first (which more requests share)."""
        # BEGIN EXERCISE E3.1
        if owner not in self.tables:
            raise BlockPoolError(f"{owner!r} owns no blocks (never allocated, or already freed)")
        for b in reversed(self.tables.pop(owner)):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None
        del self.num_tokens[owner], self.num_hashed[owner]
        # END EXERCISE

    def table(self, owner: str) -> list[int]:
        return self.tables[owner]

    def _take_free(self) -> int:
        """The block freed longest ago, with one reference. A block still cached is evicted here: its hash leaves
        the index, since the new owner is about to overwrite its K/V."""
        # BEGIN EXERCISE E8.4
        block, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:  # evict: its cached content is about to be overwritten
            del self.hash_to_block[h]
            self.block_hash[block] = None
            self.num_evictions += 1
        self.ref_counts[block] = 1
        return block
        # END EXERCISE

    # ---- prefix caching --------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Cached blocks of the longest prefix of ``hashes`` (a request's hash chain); takes nothing."""
        # BEGIN EXERCISE E8.1
        hits = []
        for h in hashes:
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits
        # END EXERCISE

    def share(self, owner: str, blocks: Sequence[int]) -> None:
        """Start ``owner``'s table with cached ``blocks`` (from ``lookup``): their tokens count as computed."""
        # BEGIN EXERCISE E8.1
        if owner in self.tables:
            raise BlockPoolError(f"{owner!r} already holds blocks; share() starts a table")
        for b in blocks:
            if self.block_hash[b] is None:
                raise BlockPoolError(f"block {b} is not cached; only cached full blocks can be shared")
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]  # a hit on a free cached block takes it back out of the free list
            self.ref_counts[b] += 1
        self.tables[owner] = list(blocks)
        self.num_tokens[owner] = len(blocks) * self.block_size
        self.num_hashed[owner] = len(blocks)
        # END EXERCISE

    def cache_blocks(self, owner: str, hashes: Sequence[int], num_computed_tokens: int) -> None:
        """Index ``owner``'s full blocks whose K/V are computed (the first ``num_computed_tokens``)."""
        table = self.tables[owner]
        upto = min(len(hashes), num_computed_tokens // self.block_size, len(table))
        for i in range(self.num_hashed[owner], upto):
            b, h = table[i], hashes[i]
            if self.block_hash[b] is None and h not in self.hash_to_block:
                self.block_hash[b] = h
                self.hash_to_block[h] = b
        self.num_hashed[owner] = max(self.num_hashed[owner], upto)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    # ---- views and checks ------------------------------------------------------------------------
    def snapshot(self) -> PoolSnapshot:
        filled = [0] * self.num_blocks
        for owner, table in self.tables.items():
            left = self.num_tokens[owner]
            for b in table:
                n = min(left, self.block_size)
                filled[b] = max(filled[b], n)
                left -= n
        return PoolSnapshot(
            num_blocks=self.num_blocks, block_size=self.block_size,
            tables={o: list(t) for o, t in self.tables.items()}, num_tokens=dict(self.num_tokens),
            ref_counts=list(self.ref_counts), filled=filled,
            cached=[h is not None for h in self.block_hash], free=list(self.free_queue),
        )

    def check_invariants(self, owners: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` if the pool's bookkeeping is inconsistent. ``owners``: the ids the
        caller believes hold blocks (the scheduler passes its running requests)."""
        n = self.num_blocks
        used = [b for b in range(n) if self.ref_counts[b] > 0]
        assert len(self.free_queue) + len(used) == n, "free + used != total"
        assert all(self.ref_counts[b] == 0 for b in self.free_queue), "a free block has references"
        assert all(r >= 0 for r in self.ref_counts), "negative ref count"
        held = [0] * n
        for owner, table in self.tables.items():
            assert len(set(table)) == len(table), f"{owner!r} lists a block twice"
            for b in table:
                held[b] += 1
            assert len(table) >= self.blocks_for(self.num_tokens[owner]), f"{owner!r} holds tokens past its blocks"
            assert self.num_hashed[owner] <= len(table), f"{owner!r} hashed blocks it does not hold"
        assert held == self.ref_counts, "ref counts differ from the number of tables holding each block"
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h, f"hash index points to block {b}, which carries another hash"
        assert sum(h is not None for h in self.block_hash) == len(self.hash_to_block), "stray block hash"
        if owners is not None:
            assert set(owners) == set(self.tables), (
                f"block tables {sorted(self.tables)} differ from the owners {sorted(owners)}"
            )
