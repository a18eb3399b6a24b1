"""BlockPool: allocation, growth, sharing, LRU reuse, the prefix-hash index -- and its invariants under
random operation sequences."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minfer.kv.block_pool import BlockPool, BlockPoolError, chain_hashes
from minfer.units import ceil_div


def test_appending_one_slot_takes_a_block_only_when_the_last_is_full():
    pool = BlockPool(8, 4)
    pool.allocate("a", 0)
    taken = [len(pool.append_slots("a", 1)) for _ in range(9)]
    assert taken == [1, 0, 0, 0, 1, 0, 0, 0, 1]  # a new block at tokens 1, 5 and 9
    assert pool.num_tokens["a"] == 9 and len(pool.table("a")) == 3
    snap = pool.snapshot()
    assert [snap.filled[b] for b in pool.table("a")] == [4, 4, 1]
    assert snap.internal_waste == 3  # only the last, partly filled block wastes slots
    pool.check_invariants(owners=["a"])


def test_freed_blocks_are_reused_least_recently_freed_first():
    pool = BlockPool(6, 2)
    a, b = pool.allocate("a", 2), pool.allocate("b", 2)
    pool.free("b")
    pool.free("a")
    remaining = [x for x in range(6) if x not in a + b]
    # the never-used blocks first, then b's (freed before a's), each request's tail block first
    assert pool.allocate("c", 6) == remaining + b[::-1] + a[::-1]


def test_bad_requests_raise_and_change_nothing():
    pool = BlockPool(4, 2)
    pool.allocate("a", 3)
    before = pool.snapshot()
    with pytest.raises(BlockPoolError, match="only 1 are free"):
        pool.allocate("b", 2)
    with pytest.raises(BlockPoolError, match="owns no blocks"):
        pool.free("nobody")
    pool.free("a")
    with pytest.raises(BlockPoolError, match="already freed"):
        pool.free("a")
    assert pool.num_free_blocks == 4
    assert before.num_used == 3
    pool.check_invariants(owners=[])
    # a growth the pool cannot hold leaves no trace, not even an empty table for a new owner
    assert pool.try_append_slots("x", 100) is None and "x" not in pool.tables
    pool.check_invariants(owners=[])


def test_prefix_hits_share_blocks_and_survive_in_the_free_list_until_evicted():
    bs = 4
    pool = BlockPool(6, bs)
    prompt = list(range(10))  # two full blocks + 2 tokens
    hashes = chain_hashes(prompt, bs)
    assert len(hashes) == 2
    pool.allocate("a", 0)
    pool.append_slots("a", len(prompt))
    pool.cache_blocks("a", hashes, num_computed_tokens=len(prompt))
    hits = pool.lookup(hashes)
    assert hits == pool.table("a")[:2]
    pool.share("b", hits)  # b reuses a's two full blocks
    assert [pool.ref_counts[h] for h in hits] == [2, 2]
    pool.check_invariants(owners=["a", "b"])
    pool.free("a")
    pool.free("b")
    assert pool.lookup(hashes) == hits  # free, but still cached
    pool.share("c", hits)  # a hit on free cached blocks takes them out of the free list
    assert pool.num_free_blocks == 4
    pool.free("c")
    pool.allocate("d", 6)  # needs every block: cached ones are evicted
    assert pool.lookup(hashes) == [] and pool.num_cached_blocks == 0
    pool.check_invariants(owners=["d"])


def test_hash_chain_depends_on_the_whole_prefix():
    bs = 2
    a = chain_hashes([1, 2, 3, 4], bs)
    b = chain_hashes([9, 9, 3, 4], bs)
    assert a[1] != b[1]  # same tokens in block 1, different prefix
    assert chain_hashes([1, 2, 3, 4, 5], bs, known=a[:1]) == a  # extends incrementally


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / grow / share / cache / free sequences; invariants checked after every step."""

    @initialize(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 4, 16]))
    def setup(self, num_blocks, block_size):
        self.pool = BlockPool(num_blocks, block_size)
        self.tokens: dict[str, list[int]] = {}  # owner → the token ids it holds
        self.next_id = 0

    def _new_owner(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    @rule(n=st.integers(0, 40), vocab=st.integers(1, 3))
    def admit(self, n, vocab):
        owner = self._new_owner()
        ids = [i % vocab for i in range(n)]  # small vocabularies make prefix hits likely
        hashes = chain_hashes(ids, self.pool.block_size)
        hits = self.pool.lookup(hashes[: max(0, n - 1) // self.pool.block_size])
        fresh = sum(self.pool.ref_counts[b] == 0 for b in hits)
        need = ceil_div(n, self.pool.block_size) - len(hits)
        if need + fresh > self.pool.num_free_blocks:
            with pytest.raises(BlockPoolError):
                if hits:
                    self.pool.share(owner, hits)
                    self.pool.append_slots(owner, n - len(hits) * self.pool.block_size)
                else:
                    self.pool.allocate(owner, need)
            if owner in self.pool.tables:  # share() succeeded before append_slots failed: undo it
                self.pool.free(owner)
            return
        if hits:
            self.pool.share(owner, hits)
        else:
            self.pool.allocate(owner, 0)
        self.pool.append_slots(owner, n - len(hits) * self.pool.block_size)
        self.pool.cache_blocks(owner, hashes, n)
        self.tokens[owner] = ids

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), k=st.integers(1, 20))
    def grow(self, data, k):
        owner = data.draw(st.sampled_from(sorted(self.tokens)))
        free_before = self.pool.num_free_blocks
        need = self.pool.blocks_needed(owner, k)
        if need > free_before:
            before = self.pool.snapshot()
            with pytest.raises(BlockPoolError):
                self.pool.append_slots(owner, k)
            assert self.pool.snapshot() == before  # a failed request changes nothing
            return
        taken = self.pool.append_slots(owner, k)
        assert len(taken) == need and self.pool.num_free_blocks == free_before - need
        self.tokens[owner] += [7] * k

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        owner = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.free(owner)
        del self.tokens[owner]

    @invariant()
    def consistent(self):
        if hasattr(self, "pool"):
            self.pool.check_invariants(owners=self.tokens)
            for owner, ids in self.tokens.items():
                assert self.pool.num_tokens[owner] == len(ids)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
