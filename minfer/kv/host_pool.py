"""The host block pool: where a preempted request's KV blocks wait in host memory (swap preemption).

When the GPU's ``BlockPool`` runs dry, the scheduler preempts a request. With ``preemption_mode="recompute"`` its
K/V are simply dropped and computed again later. With ``preemption_mode="swap"`` they are *copied* to host memory
first -- one host block per device block -- and copied back when the request resumes, so nothing is recomputed.

Host memory is large but not free: the pool has a fixed number of blocks (``EngineConfig.swap_space``, as vLLM
v0's ``swap_space``). When a victim's blocks do not fit, the scheduler falls back to recompute for that victim.

This pool only does the bookkeeping -- which host blocks hold whose tokens. The bytes live in the executor's host
tensor (``kv/cache.py``); the scheduler tells the executor which blocks to copy, in each step's plan. Nothing here
is shared between requests (a swapped-out block belongs to one request), so there are no reference counts and no
prefix hashes: a table is simply taken whole and given back whole.

Host memory is often far larger than the device's KV pool (4 GiB holds a million blocks of the course's tiny
test model), so the pool does not list its free blocks up front: blocks above a high-water mark have never been
used, and given-back blocks are reused first. Checking it costs what has been used, not what could be.

Invariants (``check_invariants``): free + used = total; no block in two tables, or both in a table and given
back; every table holds exactly the blocks its tokens need.
"""

from __future__ import annotations

from collections.abc import Iterable

from minfer.units import ceil_div


class HostBlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"num_blocks must be >= 0 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.high_water = 0  # blocks high_water .. num_blocks - 1 have never been used
        self.given_back: list[int] = []  # used once and free again: reused first
        self.tables: dict[str, list[int]] = {}  # owner → its host blocks, in token order
        self.num_tokens: dict[str, int] = {}  # owner → tokens whose K/V its blocks hold

    @property
    def num_free_blocks(self) -> int:
        return len(self.given_back) + self.num_blocks - self.high_water

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def __contains__(self, owner: object) -> bool:
        return owner in self.tables

    def can_hold(self, num_tokens: int) -> bool:
        """Is there room for ``num_tokens`` tokens' K/V?"""
        return self.blocks_for(num_tokens) <= self.num_free_blocks

    def allocate(self, owner: str, num_tokens: int) -> list[int]:
        """Host blocks for ``owner``'s first ``num_tokens`` tokens (the swap-out's destinations)."""
        n = self.blocks_for(num_tokens)
        if owner in self.tables:
            raise ValueError(f"{owner!r} is already swapped out")
        if num_tokens < 1 or n > self.num_free_blocks:
            raise ValueError(f"{owner!r} needs {n} host blocks for {num_tokens} tokens; {self.num_free_blocks} free")
        reused = min(n, len(self.given_back))
        table = [self.given_back.pop() for _ in range(reused)]
        table += range(self.high_water, self.high_water + n - reused)
        self.high_water += n - reused
        self.tables[owner], self.num_tokens[owner] = table, num_tokens
        return table

    def free(self, owner: str) -> list[int]:
        """Give back ``owner``'s host blocks (after its swap-in, or when it ends while swapped out); returns them."""
        if owner not in self.tables:
            raise ValueError(f"{owner!r} holds no host blocks")
        blocks = self.tables.pop(owner)
        del self.num_tokens[owner]
        self.given_back.extend(reversed(blocks))  # popped from the end: its first block is reused first
        return blocks

    def check_invariants(self, owners: Iterable[str] | None = None) -> None:
        """Raise ``AssertionError`` if the bookkeeping is inconsistent. ``owners``: who the caller believes is
        swapped out (the scheduler passes its swapped-out waiting requests)."""
        used = [b for t in self.tables.values() for b in t]
        touched = used + self.given_back  # every block below the high-water mark, each once
        assert sorted(touched) == list(range(self.high_water)), (
            "a host block is in two tables, given back twice, or both, or lost")
        assert self.high_water <= self.num_blocks, "more host blocks used than the pool has"
        for owner, table in self.tables.items():
            assert len(table) == self.blocks_for(self.num_tokens[owner]), f"{owner!r}: host table size != its tokens"
        if owners is not None:
            assert set(owners) == set(self.tables), (
                f"host tables {sorted(self.tables)} differ from the swapped-out requests {sorted(owners)}"
            )
