"""The prefix cache's host tier (``minfer/kv/host_cache.py``): evicted prefix blocks wait in host memory and come
back on a later hit. Its bookkeeping alone; the pool that spills into it; the engine on multi-turn chats, whose
greedy outputs are the same with the tier, without it and without any prefix cache, while it computes fewer prompt
tokens; and the simulator, which prices the copies over the host link."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import run_checked, tiny_engine
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.kv.block_pool import chain_hashes
from minfer.kv.host_cache import HostPrefixCache, TieredBlockPool
from minfer.metrics import summarize
from minfer.sim import HARDWARE
from minfer.workload import WorkItem, multi_turn_chat, submit


# ---- the host cache's bookkeeping ------------------------------------------------------------------------------
def test_store_lookup_and_lru_eviction():
    cache = HostPrefixCache(2, first_block=5)  # host blocks 5 and 6, after five swap blocks
    assert cache.store(11) == 5 and cache.store(12) == 6
    assert cache.store(11) is None, "a hash held already needs no copy"
    assert cache.lookup([11, 12, 13]) == [5, 6] and cache.lookup([12, 11]) == [6, 5] and cache.lookup([13, 11]) == []
    cache.end_step()
    assert cache.store(13) == 5, "full: the least recently used hash (11) gives up its block"
    assert cache.lookup([11]) == [] and cache.lookup([12, 13]) == [6, 5]
    assert (cache.num_stored, cache.num_dropped) == (3, 1)
    cache.check_invariants()


def test_reading_makes_recent_and_protects_this_step():
    cache = HostPrefixCache(2)
    cache.store(1), cache.store(2)
    assert cache.read([1]) == [0], "read: 1 becomes the most recently used"
    assert cache.store(3) == 1, "so 2 is dropped, not 1"
    cache.read([3])
    assert cache.store(4) is None, "the least recently used block (0, hash 1) is read this step: no room"
    assert cache.lookup([1]) == [0]
    cache.end_step()
    assert cache.store(4) == 0
    assert cache.num_loaded == 2
    cache.check_invariants()


def test_an_empty_host_cache_stores_nothing():
    cache = HostPrefixCache(0)
    assert cache.store(1) is None and cache.lookup([1]) == [] and len(cache) == 0
    with pytest.raises(ValueError):
        HostPrefixCache(-1)


def test_invariants_catch_a_block_holding_two_hashes():
    cache = HostPrefixCache(4)
    cache.store(1), cache.store(2)
    cache.blocks[2] = cache.blocks[1]
    with pytest.raises(AssertionError, match="two hashes"):
        cache.check_invariants()


# ---- the pool that spills into it ------------------------------------------------------------------------------
def test_tiered_pool_spills_evicted_cached_blocks_only():
    host = HostPrefixCache(8, first_block=2)
    pool = TieredBlockPool(3, 4, host)
    tokens = list(range(8))
    hashes = chain_hashes(tokens, 4)
    pool.allocate("a", 2)
    pool.append_slots("a", 8)
    pool.cache_blocks("a", hashes, 8)  # blocks 0 and 1 cached
    pool.free("a")
    assert pool.take_spills() == [], "nothing evicted yet"
    pool.allocate("b", 1)  # block 2: never cached, no eviction
    assert pool.take_spills() == []
    pool.allocate("b", 1)  # the LRU free block: the prompt's tail, block 1, evicted
    assert pool.take_spills() == [(1, 2)] and host.lookup(hashes) == [] and host.lookup(hashes[1:]) == [2]
    assert pool.num_evictions == 1 and pool.lookup(hashes) == [0], "the pool's own eviction is unchanged"
    pool.check_invariants(owners=["b"])
    host.check_invariants()


# ---- the engine on multi-turn chats ----------------------------------------------------------------------------
SYSTEM = [(5 * i + 2) % 200 + 10 for i in range(40)]


def chat(tiny, turns: int = 4, chats: int = 6, **config) -> tuple[dict[str, list[int]], LLMEngine]:
    """``chats`` conversations of ``turns`` turns on a small device pool; each turn is the conversation so far (its
    real answers included) and a new question, and all chats' turn k run together. Greedy tokens per request."""
    e = tiny_engine(tiny, num_blocks=24, max_num_seqs=3, **config)
    history = [list(SYSTEM) for _ in range(chats)]
    tokens: dict[str, list[int]] = {}
    for turn in range(turns):
        for c in range(chats):
            history[c] += [30 + c * 7 + turn * 3 + j for j in range(6 + (c + turn) % 5)]
            e.add_request(f"c{c}t{turn}", list(history[c]), SamplingParams(max_tokens=8, temperature=0,
                                                                         ignore_eos=True))
        for rid, out in run_checked(e).items():
            tokens[rid] = out.outputs[0].token_ids
            history[int(rid[1:rid.index("t")])] += out.outputs[0].token_ids
    return tokens, e


def prompt_tokens_computed(e: LLMEngine) -> int:
    return sum(t.num_prefill_tokens for t in e.trace)


def test_host_tier_keeps_outputs_and_saves_prompt_compute(tiny):
    plain, no_cache = chat(tiny)
    cached, device_only = chat(tiny, enable_prefix_caching=True)
    tiered, with_tier = chat(tiny, enable_prefix_caching=True, host_cache_blocks=64)
    assert cached == plain and tiered == plain
    assert device_only.block_pool.num_evictions > 0, "the device pool is meant to be too small for the chats"
    spilled = sum(t.spilled_blocks for t in with_tier.trace)
    loaded = sum(n for t in with_tier.trace for n in t.loaded_blocks.values())
    assert spilled > 0 and loaded > 0
    saved = prompt_tokens_computed(device_only) - prompt_tokens_computed(with_tier)
    assert saved == loaded * 16, "every block copied back is a block of prompt not computed again"
    summary = summarize(with_tier.finished)
    assert summary.prefix_hit_rate > summarize(device_only.finished).prefix_hit_rate
    host = with_tier.scheduler.host_cache
    assert host.num_loaded == loaded and host.num_stored == spilled
    assert with_tier.trace[-1].num_host_cached_blocks == len(host) > 0
    assert sum(t.swap_bytes for t in with_tier.trace) == (spilled + loaded) * with_tier.kv_block_bytes


@pytest.mark.parametrize("host_blocks", [1, 2, 5])
def test_a_tiny_host_tier_under_pressure_stays_exact(tiny, host_blocks):
    """A host tier of a few blocks drops and refills all the time, and a block read in a step may not take a spill:
    outputs stay the same, invariants hold after every step."""
    plain, _ = chat(tiny)
    tiered, e = chat(tiny, enable_prefix_caching=True, host_cache_blocks=host_blocks)
    assert tiered == plain
    host = e.scheduler.host_cache
    assert host.num_dropped > 0 and host.num_loaded > 0, "the tier is meant to overflow, and still serve hits"


def test_host_tier_with_swap_preemption_uses_separate_host_blocks(tiny):
    plain, _ = chat(tiny)
    tiered, e = chat(tiny, enable_prefix_caching=True, host_cache_blocks=32, preemption_mode="swap",
                     num_swap_blocks=16)
    assert tiered == plain and e.scheduler.host_cache.num_loaded > 0
    assert e.scheduler.host_cache.first_block == 16
    assert e.kv_cache is not None and e.kv_cache.host_kv.shape[0] == 16 + 32


def test_host_cache_blocks_needs_prefix_caching():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(model="tiny-random", host_cache_blocks=8)
    with pytest.raises(ValueError, match="host_cache_blocks"):
        EngineConfig(model="tiny-random", enable_prefix_caching=True, host_cache_blocks=-1)


# ---- the simulator prices the copies ---------------------------------------------------------------------------
def sim_chat(host_blocks: int, hardware: str | object = "H100-SXM") -> LLMEngine:
    e = LLMEngine(EngineConfig(executor="sim", model="llama-3-8b", hardware=hardware, num_blocks=400,
                               enable_prefix_caching=True, host_cache_blocks=host_blocks, debug_checks=True))
    submit(e, multi_turn_chat(40, turns=4, system_len=512, user_median=64, answer_len=64, rate=4.0, seed=3))
    run_checked(e)
    return e


def test_simulated_host_tier_cuts_ttft_and_prices_copies_over_the_host_link():
    without, with_tier = sim_chat(0), sim_chat(1000)
    s0, s1 = summarize(without.finished), summarize(with_tier.finished)
    assert s1.prefix_hit_rate > s0.prefix_hit_rate
    assert s1.ttft.mean < s0.ttft.mean and s1.ttft.p50 <= s0.ttft.p50
    copies = sum(t.swap_bytes for t in with_tier.trace)
    assert copies > 0
    link = HARDWARE["H100-SXM"].host_link_bandwidth
    assert with_tier.executor.swap_time(1) == pytest.approx(with_tier.kv_block_bytes / link)


def test_simulated_host_tier_needs_a_host_link():
    no_link = dataclasses.replace(HARDWARE["H100-SXM"], host_link_bandwidth=None)
    with pytest.raises(ValueError, match="host_link_bandwidth"):
        sim_chat(100, hardware=no_link)


def test_multi_turn_chat_prompts_extend_the_previous_turn():
    items = multi_turn_chat(3, turns=3, system_len=16, answer_len=5, think_time=2.0, seed=1)
    assert items == sorted(items, key=lambda w: w.arrival_time)
    by_chat: dict[str | None, list[WorkItem]] = {}
    for w in items:
        by_chat.setdefault(w.tenant, []).append(w)
    assert len(by_chat) == 3
    for turns in by_chat.values():
        assert [w.arrival_time - turns[0].arrival_time for w in turns] == pytest.approx([0.0, 2.0, 4.0])
        for prev, nxt in zip(turns, turns[1:]):
            assert isinstance(prev.prompt, list) and isinstance(nxt.prompt, list)
            assert nxt.prompt[: len(prev.prompt)] == prev.prompt, "a turn resends the conversation so far"
            assert len(nxt.prompt) > len(prev.prompt) + 5
        assert all(w.prompt[:16] == items[0].prompt[:16] for w in turns), "one system prompt for every chat"
    assert multi_turn_chat(3, turns=3, seed=1) == multi_turn_chat(3, turns=3, seed=1)


def test_tier_sweep_on_the_simulator_counts_what_the_trace_shows():
    from minfer.kv_tier import TABLE_HEADER, format_sweep, on_a_gpu, sweep

    config, _, _ = on_a_gpu()
    items = multi_turn_chat(24, turns=3, system_len=512, user_median=64, answer_len=64, rate=4.0, seed=3)
    none, small, big = sweep(config, [0, 100, 2000], items)
    assert none.host_hit_rate == 0 and none.copied_bytes == 0
    assert none.evictions > 0, "the device pool is meant to overflow"
    assert big.host_hit_rate > 0 and big.prefix_hit_rate > none.prefix_hit_rate
    assert none.prompt_tokens_computed > big.prompt_tokens_computed
    assert small.prompt_tokens_computed >= big.prompt_tokens_computed
    table = format_sweep([none, big]).splitlines()
    assert table[0] == TABLE_HEADER and table[2].split()[0] == "2000"


def test_tier_sweep_outputs_digest_is_equal_across_sizes_on_the_tiny_model(tiny):
    from minfer.kv_tier import sweep

    model, tok = tiny
    items = multi_turn_chat(6, turns=3, system_len=40, user_median=24, answer_len=6, rate=None, think_time=600.0,
                            vocab_size=320)
    config = EngineConfig(model="tiny-random", num_blocks=24, max_num_seqs=3, debug_checks=True)
    points = sweep(config, [0, 3, 64], items, model, tok)
    assert len({p.outputs_digest for p in points}) == 1, "the same tokens with any tier size"
    assert points[0].evictions > 0 and points[2].host_hit_rate > 0
    assert points[2].prompt_tokens_computed < points[0].prompt_tokens_computed
