"""Chapter 03: the BlockPool (E3.1) and a prediction about it (E3.2)."""

from __future__ import annotations

import random

from minfer.exercises.checks.common import refused, tiny_engine, unchanged
from minfer.exercises.harness import Measurement, Tester
from minfer.kv.block_pool import BlockPool
from minfer.request import SamplingParams


def grown(bs: int, tokens: dict[str, int], num_blocks: int = 64) -> BlockPool:
    pool = BlockPool(num_blocks, bs)
    for owner, n in tokens.items():
        pool.allocate(owner, 0)
        pool.append_slots(owner, n)
        pool.check_invariants(owners=list(tokens)[: list(tokens).index(owner) + 1])
    return pool


def appended(pool: BlockPool, owner: str, n: int) -> list[int]:
    """try_append_slots that must succeed: the blocks it took."""
    got = pool.try_append_slots(owner, n)
    assert got is not None, (f"try_append_slots({owner!r}, {n}) returned None with {pool.num_free_blocks} free "
                             f"blocks, enough for it")
    return got


def check_block_pool(t: Tester) -> None:
    with t.case("blocks_for: the blocks that hold n tokens (block_size 16 and 1, 7)",
                hint="a ceiling division: 16 tokens fill exactly one block, 17 need two, 0 need none"):
        for bs, cases in ((16, {0: 0, 1: 1, 15: 1, 16: 1, 17: 2, 32: 2, 33: 3, 1000: 63}),
                          (1, {0: 0, 1: 1, 5: 5}), (7, {6: 1, 7: 1, 8: 2, 49: 7, 50: 8})):
            pool = BlockPool(4, bs)
            for n, want in cases.items():
                got = pool.blocks_for(n)
                assert got == want, f"blocks_for({n}) with block_size={bs} is {got}, expected {want}"

    with t.case("allocate: blocks come from the head of the free list, in order, each with one reference",
                hint="take blocks with _take_free() (it pops the least recently freed); extend the owner's "
                     "table; a new owner starts with 0 tokens"):
        pool = BlockPool(8, 4)
        assert pool.allocate("a", 3) == [0, 1, 2], "a fresh pool hands out blocks 0, 1, 2 first"
        assert pool.allocate("a", 0) == [] and pool.table("a") == [0, 1, 2]
        assert pool.allocate("b", 2) == [3, 4]
        assert pool.allocate("a", 1) == [5] and pool.table("a") == [0, 1, 2, 5], "allocate appends to the table"
        snap = pool.snapshot()
        assert snap.ref_counts[:6] == [1] * 6 and snap.num_tokens == {"a": 0, "b": 0}
        assert snap.free == [6, 7], f"free list should be [6, 7], got {snap.free}"
        pool.check_invariants(owners=["a", "b"])

    with t.case("allocate: a new owner with n=0 gets an empty table", hint="create the table even for 0 blocks"):
        pool = BlockPool(4, 4)
        assert pool.allocate("x", 0) == []
        assert pool.table("x") == [] and pool.snapshot().num_tokens == {"x": 0}
        pool.check_invariants(owners=["x"])

    with t.case("allocate: too many blocks (or a negative number) raises BlockPoolError and changes nothing",
                hint="check before you take anything: popping from an empty free list half-way leaves blocks taken"):
        pool = BlockPool(4, 4)
        pool.allocate("a", 3)
        for owner, n in (("b", 2), ("a", 2), ("c", -1)):
            refused(pool, pool.allocate, owner, n, why="1 block is free")
        assert pool.allocate("b", 1) == [3], "exactly the free blocks can be taken"
        pool.check_invariants(owners=["a", "b"])

    with t.case("try_append_slots: one token at a time takes a block only at tokens 1, 17, 33 (block_size 16)",
                hint="blocks needed = blocks_for(tokens held + new tokens) - blocks already in the table"):
        pool = BlockPool(8, 16)
        pool.allocate("a", 0)
        new_at = [i + 1 for i in range(40) if pool.try_append_slots("a", 1)]
        assert new_at == [1, 17, 33], f"new blocks at tokens {new_at}, expected [1, 17, 33]"
        assert pool.snapshot().num_tokens["a"] == 40 and len(pool.table("a")) == 3
        pool.check_invariants(owners=["a"])

    with t.case("try_append_slots: many tokens at once, exact multiples, and a new owner",
                hint="a prefill appends a whole chunk: 40 tokens need 3 blocks of 16, then 8 more fit in the third"):
        pool = BlockPool(10, 16)
        assert len(appended(pool, "p", 40)) == 3, "40 tokens need 3 blocks"
        assert appended(pool, "p", 8) == [], "tokens 41..48 fit in the third block"
        assert len(appended(pool, "p", 1)) == 1, "token 49 needs a fourth block"
        assert len(appended(pool, "q", 16)) == 1 and len(appended(pool, "q", 16)) == 1, \
            "16 + 16 tokens: exactly one block each time"
        assert appended(pool, "r", 0) == [] and pool.table("r") == [], "a new owner gets a table"
        snap = pool.snapshot()
        assert snap.num_tokens == {"p": 49, "q": 32, "r": 0}, snap.num_tokens
        pool.check_invariants(owners=["p", "q", "r"])

    with t.case("blocks_needed: never negative, counts what the table already holds",
                hint="a table may hold more blocks than its tokens fill (admission='reserve' allocates ahead)"):
        pool = BlockPool(10, 16)
        pool.allocate("a", 4)  # reserved 64 slots, holds 0 tokens
        assert pool.blocks_needed("a", 10) == 0, "10 tokens fit in the 4 blocks it holds: 0 (not -3) new blocks"
        assert pool.blocks_needed("a", 50) == 0, "50 tokens fit in the 4 blocks it holds"
        assert pool.blocks_needed("a", 65) == 1
        assert pool.blocks_needed("new", 17) == 2, "an owner without a table needs blocks_for(17) = 2"
        assert appended(pool, "a", 10) == [] and appended(pool, "a", 54) == []
        assert pool.snapshot().num_tokens["a"] == 64
        pool.check_invariants(owners=["a"])

    with t.case("try_append_slots: when the pool is short it returns None and changes nothing",
                hint="compare with the number of free blocks *before* allocating; exactly enough is enough"):
        pool = BlockPool(4, 4)
        pool.allocate("a", 0)
        pool.append_slots("a", 5)  # 2 blocks, 2 free
        before = pool.snapshot()
        assert pool.try_append_slots("a", 12) is None, "needs 3 more blocks with 2 free: None"
        unchanged(pool, before, "a failed try_append_slots")
        assert pool.try_append_slots("new", 9) is None, "9 tokens need 3 blocks with 2 free: None"
        unchanged(pool, before, "a failed try_append_slots for a new owner")
        assert len(appended(pool, "a", 11)) == 2, "5 + 11 tokens need exactly the 2 free blocks"
        assert pool.num_free_blocks == 0 and appended(pool, "a", 0) == []
        pool.check_invariants(owners=["a"])

    with t.case("free: every block comes back, the table's last block first, at the tail of the free list",
                hint="walk the table in reverse; a block joins the free list only when its ref count reaches 0"):
        pool = BlockPool(6, 2)
        a, b = pool.allocate("a", 2), pool.allocate("b", 2)
        pool.free("b")
        pool.free("a")
        snap = pool.snapshot()
        assert snap.free == [4, 5] + b[::-1] + a[::-1], f"free list {snap.free}, expected {[4, 5] + b[::-1] + a[::-1]}"
        assert snap.tables == {} and snap.num_tokens == {}, "a freed owner must be forgotten entirely"
        assert pool.allocate("c", 6) == [4, 5] + b[::-1] + a[::-1], "reuse: least recently freed first"
        pool.check_invariants(owners=["c"])

    with t.case("free: a block shared by two tables stays in use until the second lets go",
                hint="decrement the ref count; only at 0 does the block return to the free list"):
        pool = grown(4, {"a": 8})
        pool.cache_blocks("a", [11, 22], 8)
        pool.share("b", pool.table("a"))
        pool.free("a")
        snap = pool.snapshot()
        assert [snap.ref_counts[x] for x in snap.tables["b"]] == [1, 1], "b still holds both blocks"
        assert not set(snap.free) & set(snap.tables["b"]), "a block still in b's table went to the free list"
        pool.check_invariants(owners=["b"])
        pool.free("b")
        assert pool.num_free_blocks == pool.num_blocks
        pool.check_invariants(owners=[])

    with t.case("free: an unknown or already freed owner raises BlockPoolError and changes nothing",
                hint="check that the owner holds a table before touching anything"):
        pool = grown(4, {"a": 5})
        pool.free("a")
        for owner in ("a", "nobody"):
            refused(pool, pool.free, owner)

    with t.case("300 random allocate / append / free operations, invariants after each",
                hint="run pool.check_invariants() yourself after each operation to find the first that breaks"):
        rng = random.Random(3)
        pool = BlockPool(12, 4)
        held: dict[str, int] = {}
        for i in range(300):
            op = rng.random()
            if op < 0.45:
                owner = rng.choice(sorted(held) or ["r0"]) if held and rng.random() < 0.7 else f"r{i}"
                n = rng.randrange(0, 12)
                free = pool.num_free_blocks
                need = max(0, -(-(held.get(owner, 0) + n) // 4) - len(pool.snapshot().tables.get(owner, [])))
                taken = pool.try_append_slots(owner, n)
                if need > free:
                    assert taken is None, f"op {i}: {owner} grew by {n} tokens needing {need} blocks with {free} free"
                else:
                    assert taken is not None and len(taken) == need, (
                        f"op {i}: {owner} growing by {n} tokens needs {need} new blocks ({free} free), got {taken}")
                    held[owner] = held.get(owner, 0) + n
            elif held:
                owner = rng.choice(sorted(held))
                pool.free(owner)
                del held[owner]
            pool.check_invariants(owners=held)
            assert pool.snapshot().num_tokens == held, f"op {i}: tokens held {pool.snapshot().num_tokens} != {held}"

    with t.case("the engine on your BlockPool: 6 requests, a pool of 10 blocks of 4 tokens (preemptions), "
                "invariants after every step", hint="the same tokens as in a roomy pool; no block may leak"):
        outs = {}
        for blocks in (10, 200):
            engine = tiny_engine(block_size=4, num_blocks=blocks, max_num_seqs=4, chunked_prefill_size=8)
            for i in range(6):
                engine.add_request(f"r{i}", [3 + (7 * i + j) % 300 for j in range(5 + 3 * i)],
                                   SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
            outs[blocks] = {k: o.outputs[0].token_ids for k, o in t.run(engine).items()}
            if blocks == 10:
                assert any(tr.preempted for tr in engine.trace), "this case is meant to preempt"
        assert outs[10] == outs[200], "a small pool (with preemption) changed the generated tokens"


def measure_blocks_after_step5() -> Measurement:
    engine = tiny_engine(block_size=16, num_blocks=32)
    engine.add_request("r", list(range(3, 48)), SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    for _ in range(5):
        engine.step()
    blocks = engine.trace[4].blocks["r"]
    return Measurement(
        blocks, "blocks", abs_tol=0,
        explain="Step 1 computes the 45 prompt tokens and samples token 46; each later step stores the K/V of the "
                "token sampled the step before and samples the next. After step 5 the cache holds 45 + 4 = 49 "
                "tokens, and 49 tokens need ceil(49 / 16) = 4 blocks: the fourth was taken in step 5, for token 49. "
                "The usual miss is 3 (counting 48 tokens, or forgetting that the newest token's K/V is stored only "
                "when it is fed back in the next step).")
