"""Hidden cases of E8.1 (prefix lookup and share): hashes that chain, lookups and shares compared with the
reference on random pools (hypothesis), and whole schedules with prefix hits, preemption and recompute.

Chapter 08, hidden: eviction (E8.4) under 400 random operations, compared with the reference after each.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minfer import LLMEngine
from minfer.exercises.checks.common import cpu_sim_engine, greedy, tiny_engine
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_class, same_schedule_as_reference
from minfer.exercises.standin import StandIns
from minfer.kv.block_pool import BlockPool, BlockPoolError, chain_hashes

A, B, C = ([3 + (k * 37 + 5 * i) % 250 for i in range(16)] for k in range(3))  # three blocks of 16 tokens


def prefix_workload() -> LLMEngine:
    """Requests sharing a system prompt, preempted in a small pool: a preempted request that comes back looks its
    prefix up again, its answer so far included."""
    system = [7 + i % 50 for i in range(24)]
    e = cpu_sim_engine(block_size=4, num_blocks=20, max_num_seqs=4, chunked_prefill_size=12,
                       enable_prefix_caching=True)
    for i, (own, n) in enumerate([(5, 14), (9, 10), (2, 18), (7, 12), (12, 6)]):
        e.add_request(f"r{i}", system + [60 + i] * own, greedy(n))
    return e


def check_prefix_sharing(t: Tester) -> None:
    with t.case("hashes chain: the same block after a different prefix is a different block",
                hint="a block's hash covers its tokens *and* every block before it: chain_hashes(tokens, "
                     "block_size, known) -- a hash of the block's own tokens would reuse K/V computed after "
                     "another prefix"):
        outs, cached = {}, {}
        for caching in (False, True):
            engine = tiny_engine(block_size=16, num_blocks=24, enable_prefix_caching=caching)
            engine.add_request("first", A + B + [9, 9, 9], greedy(4))
            t.run(engine)  # A and B are cached now, B after A
            for rid, p in {"b-after-c": C + B + [8], "b-first": B + A + [8, 8], "a-again": A + C + [1]}.items():
                engine.add_request(rid, p, greedy(4))
            final = t.run(engine)
            outs[caching] = {k: o.outputs[0].token_ids for k, o in final.items()}
            cached[caching] = {k: o.metrics.num_cached_tokens for k, o in final.items()}
        want = {"b-after-c": 0, "b-first": 0, "a-again": 16}
        assert cached[True] == want, f"prompt tokens served from the cache: {cached[True]}, expected {want}"
        assert outs[True] == outs[False], "prefix caching changed the generated tokens"

    with t.case("random pools: lookup and share as the reference, refusals included",
                hint="lookup stops at the first miss and takes nothing; share refuses (changing nothing) an owner "
                     "with a table or a block without a hash, takes free cached blocks out of the free list and "
                     "adds one reference per block"):
        Reference = reference_class(BlockPool, "E8.1")

        @settings(max_examples=150, deadline=None, derandomize=True, database=None)
        @given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 13), st.booleans()),
                        min_size=1, max_size=5),
               st.lists(st.integers(0, 3), max_size=4), st.lists(st.integers(0, 11), max_size=3, unique=True))
        def same_sharing(owners: list[tuple[int, int, int, bool]], query: list[int], extra: list[int]) -> None:
            results = []
            for cls in (BlockPool, Reference):
                pool = cls(12, 4)
                for i, (first, second, n, freed) in enumerate(owners):  # prompts from 4 contents per block
                    tokens = ([first] * 4 + [second] * 4 + [first] * 4 + [9] * 4)[:n]
                    if pool.try_append_slots(f"o{i}", n) is None:
                        break
                    pool.cache_blocks(f"o{i}", chain_hashes(tokens, 4), n)
                    if freed:
                        pool.free(f"o{i}")
                hashes = chain_hashes([x for q in query for x in [q] * 4], 4)
                hits = pool.lookup(hashes)
                try:  # the hits and a few other blocks, cached or not (never a block twice)
                    pool.share("new", hits + [b for b in extra if b not in hits])
                    shared: object = pool.table("new")
                except BlockPoolError:
                    shared = BlockPoolError
                results.append((hits, shared, pool.snapshot(), dict(pool.num_hashed)))
            (hits, shared, snap, hashed), (ref_hits, ref_shared, ref_snap, ref_hashed) = results
            what = f"owners {owners}, lookup of {query}, share of the hits and {extra}"
            assert hits == ref_hits, f"{what}: lookup returned {hits}, expected {ref_hits}"
            assert shared == ref_shared, f"{what}: share gave {shared}, expected {ref_shared}"
            assert (snap, hashed) == (ref_snap, ref_hashed), f"{what}: the pool differs from the reference's"

        same_sharing()

    with t.case("the same decisions as the reference, step by step: a shared system prompt in a small pool "
                "(prefix hits, preemption, recompute)",
                hint="a preempted request's tokens include its answer so far: its hashes and its hits grow too"):
        same_schedule_as_reference(t, "E8.1", prefix_workload)


def random_run(seed: int) -> list[tuple]:
    """Owners come and go with prompts drawn from a few shared prefixes (so blocks are cached, shared, freed and
    evicted); after each operation, what the pool looks like, including its index and eviction count."""
    rng = random.Random(seed)
    pool, bs = BlockPool(12, 4), 4
    live: dict[str, list[int]] = {}
    prefixes = [[rng.randrange(3, 50) for _ in range(12)] for _ in range(3)]
    seen = []
    for i in range(400):
        if live and (rng.random() < 0.45 or pool.num_free_blocks < 4):
            owner = rng.choice(sorted(live))
            pool.free(owner)
            del live[owner]
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(4, 13)] + [rng.randrange(3, 50)]
            hashes = chain_hashes(tokens, bs)
            hits = pool.lookup(hashes[: (len(tokens) - 1) // bs])
            owner = f"o{i}"
            need = pool.blocks_for(len(tokens)) - len(hits) + sum(pool.ref_counts[b] == 0 for b in hits)
            if need > pool.num_free_blocks:
                continue
            if hits:
                pool.share(owner, hits)
            else:
                pool.allocate(owner, 0)
            pool.append_slots(owner, len(tokens) - len(hits) * bs)
            pool.cache_blocks(owner, hashes, len(tokens))
            live[owner] = tokens
        pool.check_invariants(owners=list(live))
        snap = pool.snapshot()
        seen.append((i, snap.tables, snap.free, snap.cached, sorted(pool.hash_to_block.values()), pool.num_evictions))
    return seen


def check_eviction(t: Tester) -> None:
    with t.case("400 random allocations, shares and frees: the same pool as the reference after every operation",
                hint="compare the free list, the cached flags and num_evictions at the operation named above"):
        for seed in (0, 1):
            mine = random_run(seed)
            with StandIns() as swaps:
                swaps.install(["E8.4"], always=True)
                ref = random_run(seed)
            for a, b in zip(mine, ref):
                assert a == b, (f"seed {seed}, operation {a[0]}: free list {a[2]}, evictions {a[5]}; the reference "
                                f"has free list {b[2]}, evictions {b[5]}")
            assert len(mine) == len(ref)
