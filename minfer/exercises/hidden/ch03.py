"""Hidden cases of E3.1 (the BlockPool): nothing of a freed owner may linger, freed blocks keep their prefix-cache
hashes, and random sequences of operations leave the pool exactly as the reference's (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_class
from minfer.kv.block_pool import BlockPool, BlockPoolError, chain_hashes

OWNERS = st.sampled_from(["a", "b", "c", "d"])
OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("append"), OWNERS, st.integers(0, 13)),
    st.tuples(st.just("allocate"), OWNERS, st.integers(-1, 4)),
    st.tuples(st.just("free"), OWNERS, st.just(0)),
    st.tuples(st.just("cache"), OWNERS, st.integers(0, 2)),  # index its full blocks under one of three contents
    st.tuples(st.just("share"), OWNERS, st.integers(0, 2)),  # start a table with the cached blocks of a content
), max_size=30)


def state(pool: BlockPool) -> tuple[Any, ...]:
    """Everything a pool's behaviour depends on, including what a snapshot leaves out."""
    return (pool.snapshot(), dict(pool.num_hashed), dict(pool.hash_to_block), pool.num_evictions)


def apply(pool: BlockPool, op: str, owner: str, n: int) -> object:
    """One operation; its result, or the type of the error it raised."""
    hashes = chain_hashes([n] * 4 * pool.num_blocks, pool.block_size)
    try:
        if op == "append":
            return pool.try_append_slots(owner, n)
        if op == "allocate":
            return pool.allocate(owner, n)
        if op == "free":
            pool.free(owner)
            return None
        if op == "cache":
            if owner in pool.tables:
                pool.cache_blocks(owner, hashes, pool.num_tokens[owner])
            return None
        if owner not in pool.tables:  # share: what a scheduler does with a prefix hit
            pool.share(owner, pool.lookup(hashes))
        return None
    except BlockPoolError:
        return BlockPoolError


def check_block_pool(t: Tester) -> None:
    with t.case("a freed owner is forgotten entirely: the same id allocated again starts afresh, hashes included",
                hint="free must drop every record of the owner -- its table, its token count and its num_hashed "
                     "(how many of its blocks are indexed); a stale num_hashed stops cache_blocks indexing the "
                     "new owner's blocks"):
        pool = BlockPool(8, 4)
        for content in (1, 2):  # the same owner id twice, with different tokens
            hashes = chain_hashes([content] * 8, 4)
            pool.allocate("a", 0)
            pool.append_slots("a", 8)
            pool.cache_blocks("a", hashes, 8)
            assert pool.lookup(hashes) == pool.table("a"), (
                f"owner 'a' (allocated again after a free) computed 2 full blocks, but they were not indexed: "
                f"lookup found {pool.lookup(hashes)}, expected {pool.table('a')}")
            pool.free("a")
        pool.check_invariants(owners=[])

    with t.case("freed blocks keep their hashes: a later lookup finds them, until an allocation reuses them",
                hint="free only returns blocks to the free list; their hashes stay (that is the prefix cache) and "
                     "_take_free evicts a hash when the block is handed out again"):
        pool = BlockPool(4, 4)
        hashes = chain_hashes(list(range(8)), 4)
        pool.allocate("a", 0)
        pool.append_slots("a", 8)
        pool.cache_blocks("a", hashes, 8)
        blocks = list(pool.table("a"))
        pool.free("a")
        assert pool.lookup(hashes) == blocks, f"after free, lookup found {pool.lookup(hashes)}, expected {blocks}"
        pool.check_invariants(owners=[])

    with t.case("random sequences of append / allocate / free / cache / share: the reference's results and state",
                hint="compare your pool with the reference after each operation: tables, token counts, ref counts, "
                     "the free list in order, and num_hashed (free must forget the owner entirely)"):
        Reference = reference_class(BlockPool, "E3.1")

        @settings(max_examples=200, deadline=None, derandomize=True, database=None)
        @given(st.integers(1, 8), st.integers(1, 5), OPERATIONS)
        def same_pool(num_blocks: int, block_size: int, ops: list[tuple[str, str, int]]) -> None:
            mine, ref = BlockPool(num_blocks, block_size), Reference(num_blocks, block_size)
            for i, (op, owner, n) in enumerate(ops):
                got, want = apply(mine, op, owner, n), apply(ref, op, owner, n)
                where = f"BlockPool({num_blocks}, {block_size}), operations {ops[: i + 1]}"
                assert got == want, f"{where}: the last returned {got!r}, expected {want!r}"
                assert state(mine) == state(ref), f"{where}: the pool differs from the reference's"
                mine.check_invariants()

        same_pool()
