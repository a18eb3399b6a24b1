"""Prefix caching in the scheduler: requests behind the same system prompt reuse its KV blocks. Hits are
counted in the metrics and the trace, shared blocks carry ref counts > 1, cached free blocks are evicted
least recently used -- and outputs are the same, token for token, with caching on or off."""

from __future__ import annotations

import pytest

from conftest import run_checked, tiny_engine
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.kv.block_pool import chain_hashes
from minfer.metrics import summarize

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
SYSTEM = [(7 * i + 3) % 300 + 10 for i in range(64)]  # 64 tokens: four full blocks of 16


def questions(n: int) -> list[list[int]]:
    """``n`` prompts: the shared system prompt, then a distinct question of 5 to 12 tokens."""
    return [SYSTEM + [20 + i + j for j in range(5 + i % 8)] for i in range(n)]


def run(tiny, prompts: list[list[int]], params: SamplingParams = GREEDY, **kw) -> tuple[LLMEngine, dict]:
    e = tiny_engine(tiny, **{"num_blocks": 128} | kw)
    for i, p in enumerate(prompts):
        e.add_request(f"q{i}", p, params)
    return e, run_checked(e)


def tokens(outs: dict) -> dict[str, list[int]]:
    return {rid: o.outputs[0].token_ids for rid, o in outs.items()}


def test_shared_system_prompt_hits_with_identical_outputs(tiny):
    prompts = questions(8)
    off, outs_off = run(tiny, prompts)
    on, outs_on = run(tiny, prompts, enable_prefix_caching=True)
    assert tokens(outs_on) == tokens(outs_off)

    # one prompt is admitted per step, after the previous one's prefill registered the system prompt's blocks
    cached = {rid: o.metrics.num_cached_tokens for rid, o in outs_on.items()}
    assert cached == {"q0": 0} | {f"q{i}": 64 for i in range(1, 8)}
    assert sum(t.num_cached_tokens for t in on.trace) == 7 * 64
    assert not any(t.num_cached_tokens for t in off.trace)
    prefill = [sum(t.num_prefill_tokens for t in e.trace) for e in (off, on)]
    assert prefill[0] - prefill[1] == 7 * 64, "every cached token is a prompt token not computed"

    summary = summarize(on.finished)
    assert summary.cached_prompt_tokens == 7 * 64
    assert summary.prefix_hit_rate == pytest.approx(7 * 64 / sum(map(len, prompts)))
    assert summarize(off.finished).prefix_hit_rate == 0.0
    assert max(t.num_cached_blocks for t in on.trace) >= 4


def test_shared_blocks_have_one_reference_per_holder(tiny):
    e = tiny_engine(tiny, enable_prefix_caching=True, num_blocks=128)
    for i, p in enumerate(questions(5)):
        e.add_request(f"q{i}", p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for _ in range(6):  # all five admitted, all still decoding
        e.step()
        e.scheduler.check_invariants()
    snap = e.block_pool.snapshot()
    assert len(snap.tables) == 5
    first_four = {tuple(t[:4]) for t in snap.tables.values()}
    assert len(first_four) == 1, "every request's table starts with the same four system-prompt blocks"
    for b in first_four.pop():
        assert snap.ref_counts[b] == 5 and sorted(snap.owners()[b]) == [f"q{i}" for i in range(5)]
        assert snap.cached[b]
    assert all(snap.ref_counts[t[-1]] == 1 for t in snap.tables.values()), "the questions' blocks are private"
    run_checked(e)


def test_a_fully_cached_prompt_still_computes_its_last_token(tiny):
    """The step must produce the logits of the last prompt token, so at least that token is computed."""
    e = tiny_engine(tiny, enable_prefix_caching=True, num_blocks=128)
    first = None
    for rid in ("a", "b"):  # the same 32-token prompt (two full blocks), one after the other
        e.add_request(rid, SYSTEM[:32], GREEDY)
        out = run_checked(e)[rid]
        first = first or out.outputs[0].token_ids
        assert out.outputs[0].token_ids == first
    steps_b = [t for t in e.trace if "b" in t.prefill_tokens]
    assert steps_b[0].num_cached_tokens == 16 and steps_b[0].prefill_tokens == {"b": 16}


def test_cached_free_blocks_are_evicted_least_recently_used(tiny):
    """A and B finish, leaving their prompt blocks cached in the free list; A's prompt is then used again,
    which makes its blocks the most recently used. A large request that must evict some cached blocks
    evicts B's -- not A's, although A's were cached first."""
    bs = 4
    e = tiny_engine(tiny, enable_prefix_caching=True, num_blocks=20, block_size=bs)
    pa, pb = [11] * 12, [12] * 12  # three full blocks each
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    for rid, prompt in (("a", pa), ("b", pb), ("a-again", pa + [13])):
        e.add_request(rid, prompt, one)
        run_checked(e)
    assert e.finished[-1].metrics.num_cached_tokens == 12, "A's blocks were reused"
    pool = e.block_pool
    ha, hb = chain_hashes(pa, bs), chain_hashes(pb, bs)
    assert len(pool.lookup(ha)) == len(pool.lookup(hb)) == 3 and pool.num_evictions == 0

    e.add_request("big", [14 + i % 200 for i in range(64)], one)  # 16 blocks: 3 cached ones must go
    run_checked(e)
    assert pool.num_evictions == 3
    assert len(pool.lookup(ha)) == 3 and pool.lookup(hb) == [], "the least recently used blocks (B's) went"


def test_preemption_with_prefix_caching_stays_exact(tiny):
    """A pool too small for everyone: preempted requests lose their blocks, are re-admitted -- taking back
    cached blocks, their own or the system prompt's -- and still produce exactly their tokens."""
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    prompts = questions(6)
    _, reference = run(tiny, prompts, params)
    e, outs = run(tiny, prompts, params, enable_prefix_caching=True, num_blocks=16, block_size=8)
    assert tokens(outs) == tokens(reference)
    preempted = {r for t in e.trace for r in t.preempted}
    assert preempted, "the pool should be too small for six requests"
    readmitted_with_hits = [t for t in e.trace if t.num_cached_tokens and set(t.admitted) & preempted]
    assert readmitted_with_hits, "a preempted request should find blocks in the cache when it comes back"


@pytest.mark.parametrize("kw", [dict(chunked_prefill_size=24), dict(max_prefill_chunks_per_step=4),
                                dict(enable_chunked_prefill=False), dict(admission="reserve", num_blocks=64)])
def test_caching_never_changes_tokens(tiny, kw):
    """Whatever the budgets, caching changes only what is computed, never what is generated. The first
    prompt holds the system prompt's first blocks at other positions: a hash that ignored the prefix would
    hand their K/V (computed at the wrong positions) to the others."""
    prompts = [[5] * 16 + SYSTEM[:32] + [6]] + questions(6) + [SYSTEM[:40] + [5] * 3, SYSTEM[:16]]
    _, off = run(tiny, prompts, **kw)
    e, on = run(tiny, prompts, enable_prefix_caching=True, **kw)
    assert tokens(on) == tokens(off)
    assert sum(t.num_cached_tokens for t in e.trace) > 0


@pytest.mark.slow
def test_real_model_shared_system_prompt(smollm2):
    """SmolLM2 behind one long system prompt: the same text with caching on and off, most prompt tokens
    served from the cache."""
    model, tok = smollm2
    system = ("You are a concise assistant for a railway company. Answer in one short sentence. Never invent "
              "timetables; if you do not know, say so. Be polite, avoid jargon, and prefer plain words. ")
    asks = ["When does the first train leave?", "Can I bring a bicycle?", "Is there wifi on board?",
            "How do I get a refund?"]
    prompts = [tok.apply_chat_template([{"role": "system", "content": system},
                                        {"role": "user", "content": q}]) for q in asks]
    params = SamplingParams(max_tokens=16, temperature=0)
    texts, summaries = {}, {}
    for caching in (False, True):
        e = LLMEngine(EngineConfig(model="smollm2-135m", num_blocks=64, enable_prefix_caching=caching),
                      model=model, tokenizer=tok)
        for i, p in enumerate(prompts):
            e.add_request(f"q{i}", p, params)
        outs = run_checked(e)
        texts[caching] = {rid: o.outputs[0].text for rid, o in outs.items()}
        summaries[caching] = summarize(e.finished)
    assert texts[True] == texts[False]
    assert summaries[True].prefix_hit_rate > 0.5, summaries[True].prefix_hit_rate
