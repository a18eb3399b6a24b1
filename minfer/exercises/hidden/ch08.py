"""Chapter 08, hidden: eviction (E8.4) under 400 random operations, compared with the reference after each."""

from __future__ import annotations

import random

from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns
from minfer.kv.block_pool import BlockPool, chain_hashes


def random_run(seed: int) -> list[tuple]:
    """Owners come and go with prompts drawn from a few shared prefixes (so blocks are cached, shared, freed and
    evicted); after each operation, what the pool looks like, including its index and eviction count."""
    rng = random.Random(seed)
    pool, bs, live = BlockPool(12, 4), 4, {}
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
