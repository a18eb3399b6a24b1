"""Chapter 08: prefix lookup and sharing (E8.1) and the tokens a shared prompt saves (E8.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import refused, sim_engine, tiny_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.kv.block_pool import BlockPool, chain_hashes
from minfer.request import SamplingParams


def cached_pool(bs: int = 4) -> tuple[BlockPool, list[int], list[int]]:
    """A pool where owner "a" holds 10 tokens (2 full blocks, cached, and a partial one)."""
    pool = BlockPool(8, bs)
    tokens = list(range(100, 110))
    hashes = chain_hashes(tokens, bs)
    pool.allocate("a", 0)
    pool.append_slots("a", len(tokens))
    pool.cache_blocks("a", hashes, len(tokens))
    return pool, tokens, hashes


def check_prefix_sharing(t: Tester) -> None:
    with t.case("lookup: the cached blocks of the longest matching prefix, and nothing taken",
                hint="walk the hashes in order through hash_to_block and stop at the first miss"):
        pool, _, hashes = cached_pool()
        table = pool.table("a")
        before = pool.snapshot()
        got = pool.lookup(hashes)
        assert got == table[:2], f"lookup of a's two hashes: {got}, expected {table[:2]}"
        assert pool.lookup(hashes[:1]) == table[:1], "lookup of the first hash alone: the first block"
        assert pool.lookup([]) == [], "lookup of no hashes: no blocks"
        assert pool.snapshot() == before, "lookup must take nothing: no references, no change to the free list"

    with t.case("lookup: a miss ends the prefix, even if later blocks are cached",
                hint="a block is reusable only with its whole prefix: after a miss, nothing further can match"):
        pool, _, hashes = cached_pool()
        got = pool.lookup([hashes[0], 12345, hashes[1]])
        assert got == pool.table("a")[:1], f"lookup(hit, miss, hit) returned {got}, expected only the first hit"
        assert pool.lookup([777, hashes[1]]) == [], "the first block missed: no hits at all"

    with t.case("share: a new table starts with the hits, each gaining a reference; their tokens count as held",
                hint="ref_counts[b] += 1 for each block, the owner's table is the list of blocks, num_tokens is "
                     "len(blocks) * block_size, num_hashed is len(blocks)"):
        pool, _, hashes = cached_pool()
        hits = pool.lookup(hashes)
        pool.share("b", hits)
        snap = pool.snapshot()
        assert snap.tables["b"] == hits and [snap.ref_counts[x] for x in hits] == [2, 2], snap.ref_counts
        assert snap.num_tokens["b"] == 8, f"b holds 2 full blocks = 8 tokens, not {snap.num_tokens['b']}"
        pool.check_invariants(owners=["a", "b"])
        pool.append_slots("b", 3)  # b's own tokens go into a new block of its own
        assert len(pool.table("b")) == 3 and pool.table("b")[2] not in pool.table("a"), (
            "b's own tokens (after the 8 shared) need a third block of its own")
        pool.check_invariants(owners=["a", "b"])

    with t.case("share: a hit on a free cached block takes it back out of the free list",
                hint="a block with ref count 0 sits in free_queue: remove it there before counting the reference"):
        pool, _, hashes = cached_pool()
        pool.free("a")
        free = pool.num_free_blocks
        hits = pool.lookup(hashes)
        assert len(hits) == 2, "freed blocks keep their hash"
        pool.share("c", hits)
        assert not set(hits) & set(pool.snapshot().free), "c's shared blocks are still in the free list"
        assert pool.num_free_blocks == free - 2, f"{pool.num_free_blocks} free blocks, expected {free - 2}"
        pool.check_invariants(owners=["c"])
        pool.allocate("d", pool.num_free_blocks)  # every other block: c's shared blocks must not be handed out
        assert not set(hits) & set(pool.table("d")), "a shared block was handed out again while c holds it"
        pool.check_invariants(owners=["c", "d"])

    with t.case("share: refuses an owner that already has a table, or a block that is not cached, and changes "
                "nothing", hint="check every block before changing any reference count"):
        pool, _, hashes = cached_pool()
        hits = pool.lookup(hashes)
        refused(pool, pool.share, "a", hits, why="a already holds a table")
        partial = pool.table("a")[2]  # a's third block holds 2 of 4 tokens: never cached
        refused(pool, pool.share, "b", [*hits, partial], why="its last block is partly filled and not cached")
        pool.check_invariants(owners=["a"])

    with t.case("the engine with prefix caching: identical tokens, exactly the full shared blocks reused, and "
                "every shared block full and cached",
                hint="only full, hashed blocks may be shared; the request still computes at least its last token"):
        shared = [3 + (5 * i) % 250 for i in range(40)]  # 2 full blocks of 16 and 8 tokens more
        prompts = {"a": shared + [7, 8, 9], "b": shared + [10, 11], "c": shared[:32], "d": shared[:32] + [4],
                   "e": shared[:20] + [1] * 30}
        outs, cached = {}, {}
        for caching in (False, True):
            engine = tiny_engine(block_size=16, num_blocks=40, enable_prefix_caching=caching)
            for rid, p in prompts.items():
                engine.add_request(rid, p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))

            def shared_blocks_are_full(step: int, engine=engine) -> None:
                snap = engine.block_pool.snapshot()
                for b, refs in enumerate(snap.ref_counts):
                    if refs > 1:
                        assert snap.cached[b] and snap.filled[b] == snap.block_size, (
                            f"before step {step}: block {b} is shared by {refs} requests but is "
                            f"{'not cached' if not snap.cached[b] else f'only {snap.filled[b]} of 16 full'}")

            final = t.run(engine, before_step=shared_blocks_are_full)
            outs[caching] = {k: o.outputs[0].token_ids for k, o in final.items()}
            cached[caching] = {k: o.metrics.num_cached_tokens for k, o in final.items()}
        assert outs[True] == outs[False], "prefix caching changed the generated tokens"
        want = {"a": 0, "b": 32, "c": 16, "d": 32, "e": 16}
        assert cached[True] == want, f"prompt tokens served from the cache: {cached[True]}, expected {want}"


def measure_cached_tokens() -> Measurement:
    prefix = [1000 + i for i in range(200)]
    engine = sim_engine(enable_prefix_caching=True, block_size=16)
    for i in range(6):
        engine.add_request(f"u{i}", prefix + [5000 + 40 * i + j for j in range(30)],
                           SamplingParams(max_tokens=8, ignore_eos=True))
    engine.run()
    served = sum(r.metrics.num_cached_tokens for r in engine.finished)
    return Measurement(
        served, "tokens", abs_tol=0,
        explain="The first request computes the whole prompt; its 12 full blocks of system prompt (192 tokens) are "
                "registered as soon as they are computed. Each of the five others shares those 12 blocks: "
                "5 x 192 = 960 tokens. The last 8 system-prompt tokens sit in block 13 together with each user's "
                "own tokens; that block's hash covers them too, so it never matches. 5 x 200 = 1,000 forgets that "
                "only whole blocks are shared.")


# ---- E8.4: eviction ---------------------------------------------------------------------------------------------
def check_eviction(t: Tester) -> None:
    with t.case("a fresh pool hands out blocks 0, 1, 2 ... each with one reference, and evicts nothing",
                hint="popitem(last=False) takes the head of free_queue; set ref_counts[block] = 1"):
        pool = BlockPool(6, 4)
        assert pool.allocate("a", 4) == [0, 1, 2, 3], "a fresh pool hands out its blocks in order"
        assert pool.snapshot().ref_counts == [1, 1, 1, 1, 0, 0]
        assert pool.num_evictions == 0, f"{pool.num_evictions} evictions counted, but no block was cached"
        pool.check_invariants(owners=["a"])

    with t.case("the least recently freed block is reused first",
                hint="new blocks come from the head of free_queue (freed blocks join its tail)"):
        pool = BlockPool(6, 4)
        pool.allocate("a", 2)
        pool.allocate("b", 2)
        pool.free("b")  # b's blocks 3, 2 join the tail, after 4 and 5
        pool.free("a")  # then a's 1, 0
        assert pool.allocate("c", 6) == [4, 5, 3, 2, 1, 0], (
            f"blocks taken in order {pool.table('c')}: expected the free list's order [4, 5, 3, 2, 1, 0]")
        pool.check_invariants(owners=["c"])

    with t.case("reusing a cached free block evicts it: its hash leaves the index, and the eviction is counted",
                hint="if block_hash[block] is not None: del hash_to_block[that hash], block_hash[block] = None, "
                     "num_evictions += 1"):
        pool, _, hashes = cached_pool()  # a's blocks 0, 1 cached; 2 partly filled
        pool.free("a")  # free list: 3..7, then 2, 1, 0 (tail first)
        pool.allocate("x", 6)  # blocks 3..7 and 2: nothing cached among them
        assert pool.num_evictions == 0 and pool.lookup(hashes) == [0, 1], "blocks not yet reused stay cached"
        pool.allocate("y", 1)  # block 1: a's second cached block
        assert pool.table("y") == [1], f"expected block 1, the head of the free list, got {pool.table('y')}"
        assert pool.num_evictions == 1, f"num_evictions is {pool.num_evictions}, expected 1"
        assert pool.num_cached_blocks == 1 and not pool.snapshot().cached[1], "block 1's hash is still indexed"
        assert pool.lookup(hashes) == [0], f"lookup after evicting block 1: {pool.lookup(hashes)}, expected [0]"
        pool.check_invariants(owners=["x", "y"])

    with t.case("an evicted block can be cached again under a new hash",
                hint="clear both sides of the index: block_hash[block] and hash_to_block[hash]"):
        pool, tokens, hashes = cached_pool()
        pool.free("a")
        pool.allocate("x", 8)  # every block: both cached ones evicted
        assert pool.num_evictions == 2 and pool.num_cached_blocks == 0 and pool.lookup(hashes) == []
        pool.free("x")
        pool.allocate("b", 0)
        pool.append_slots("b", 8)
        pool.cache_blocks("b", chain_hashes([t + 1 for t in tokens], 4), 8)
        assert pool.num_cached_blocks == 2, "b's two full blocks should be cached again"
        pool.check_invariants(owners=["b"])

    with t.case("the engine with prefix caching in a small pool: blocks are evicted and reused, and the tokens are "
                "exactly those without caching",
                hint="a block whose hash stays indexed after reuse lets a later request share overwritten K/V"):
        prompts = {f"u{i}": [3 + (7 * i + 5 * j) % 200 for j in range(24)] for i in range(6)}
        prompts |= {f"v{i}": prompts[f"u{i}"][:16] + [9, 9, 9] for i in range(6)}
        outs = {}
        for caching in (False, True):
            engine = tiny_engine(block_size=4, num_blocks=14, max_num_seqs=2, enable_prefix_caching=caching)
            for rid, p in prompts.items():
                engine.add_request(rid, p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
            outs[caching] = {k: o.outputs[0].token_ids for k, o in t.run(engine).items()}
            if caching:
                assert engine.block_pool.num_evictions > 0, "this case is meant to evict"
        assert outs[True] == outs[False], "prefix caching with eviction changed the generated tokens"
