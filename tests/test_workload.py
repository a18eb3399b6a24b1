"""Workload generators, JSON-lines round trips, and submitting a workload to an engine."""

from __future__ import annotations

import statistics

import pytest

from conftest import run_checked
from minfer import EngineConfig, LLMEngine
from minfer.workload import (
    WorkItem,
    bursts,
    fixed_mix,
    load_workload,
    long_prompt_spike,
    poisson,
    save_workload,
    scale_time,
    shared_prefix,
    submit,
    token_ids,
    token_prompts,
)


def test_generators_are_seeded():
    for make in (lambda s: fixed_mix(20, seed=s), lambda s: poisson(20, 5.0, seed=s),
                 lambda s: bursts(3, 4, 1.0, seed=s), lambda s: shared_prefix(6, 32, seed=s)):
        assert make(1) == make(1)
        assert make(1) != make(2)


def test_fixed_mix_is_mixed_and_arrives_at_once():
    items = fixed_mix(64, prompt_median=96, output_median=64, max_prompt=512, max_output=256, seed=0)
    assert all(w.arrival_time == 0 for w in items)
    prompts, outputs = [w.prompt_len for w in items], [w.output_len for w in items]
    assert max(prompts) <= 512 and min(prompts) >= 4 and max(outputs) <= 256
    assert max(prompts) > 3 * statistics.median(prompts), "long-tailed: a few prompts far above the median"
    assert 60 < statistics.median(prompts) < 140


def test_poisson_rate_and_order():
    items = poisson(4000, rate=20.0, seed=1)
    times = [w.arrival_time for w in items]
    assert times == sorted(times) and times[0] > 0
    assert len(items) / times[-1] == pytest.approx(20.0, rel=0.05)
    with pytest.raises(ValueError, match="rate"):
        poisson(3, rate=0)


def test_bursts_and_spike():
    items = bursts(3, 5, interval=2.0, seed=0)
    assert [w.arrival_time for w in items] == [0.0] * 5 + [2.0] * 5 + [4.0] * 5
    spiked = long_prompt_spike(items, at=3.0, count=2, prompt_len=3000)
    assert len(spiked) == 17 and [w.arrival_time for w in spiked] == sorted(w.arrival_time for w in spiked)
    long = [w for w in spiked if w.prompt_len == 3000]
    assert len(long) == 2 and all(w.arrival_time == 3.0 for w in long)


def test_shared_prefix_shares_tokens():
    items = shared_prefix(9, prefix_len=64, num_prefixes=3, seed=0)
    for i, w in enumerate(items):
        same = items[i % 3]
        assert w.prompt[:64] == same.prompt[:64] and w.prompt_len == len(w.prompt) > 64
    assert items[0].prompt[:64] != items[1].prompt[:64]
    assert all(w.arrival_time == 0 for w in items)
    timed = shared_prefix(5, prefix_len=16, rate=10.0, seed=0)
    times = [w.arrival_time for w in timed]
    assert times == sorted(times) and times[-1] > 0


def test_save_and_load_round_trip(tmp_path):
    text = WorkItem(1.0, 5, 3, prompt="hi", priority=2, tenant="t")
    items = poisson(10, 3.0, seed=4) + shared_prefix(3, 16, seed=4) + [text]
    path = tmp_path / "w.jsonl"
    save_workload(items, path)
    assert load_workload(path) == items
    assert len(path.read_text().splitlines()) == len(items)


def test_work_item_validation():
    with pytest.raises(ValueError, match="output_len"):
        WorkItem(0.0, 10, 0)
    with pytest.raises(ValueError, match="arrival_time"):
        WorkItem(-1.0, 10, 4)
    assert WorkItem(0.0, 99, 4, prompt=[5, 6, 7]).prompt_len == 3, "token ids decide the prompt length"


def test_scale_time():
    items = poisson(5, 1.0, seed=0)
    fast = scale_time(items, 0.5)
    assert [w.arrival_time for w in fast] == pytest.approx([w.arrival_time / 2 for w in items])
    assert [w.prompt_len for w in fast] == [w.prompt_len for w in items]


def test_token_prompts_are_reproducible():
    items = fixed_mix(5, seed=0)
    a, b = token_prompts(items, 320, seed=1), token_prompts(items, 320, seed=1)
    assert a == b and [len(p) for p in a] == [w.prompt_len for w in items]
    assert all(1 <= t < 320 for p in a for t in p)


def test_prompts_share_their_int_objects_and_are_the_ids_a_range_would_give():
    """Drawn from ``token_ids``, a prompt's ids are references to ints made once (no 28-byte int per token), and
    they are the very ids ``random.choices`` draws from ``range(1, vocab_size)`` with the same seed: every
    benchmark's prompts stayed what they were."""
    import random

    items = fixed_mix(6, seed=0)
    prompts = token_prompts(items, 32000, seed=3)
    rng = random.Random(3)
    assert prompts == [rng.choices(range(1, 32000), k=w.prompt_len) for w in items]
    pool = token_ids(32000)
    assert all(t is pool[t - 1] for p in prompts for t in p)


def test_submit_to_the_real_engine(tiny):
    model, tok = tiny
    items = [WorkItem(0.0, 12, 5, tenant="a"), WorkItem(0.01, 30, 3, priority=1),
             WorkItem(0.02, 4, 6, prompt="hello"), WorkItem(0.5, 8, 2, prompt=[7, 8, 9])]
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=64), model=model, tokenizer=tok)
    ids = submit(engine, items)
    out = run_checked(engine)
    assert ids == ["r0", "r1", "r2", "r3"]
    for rid, w in zip(ids, items):
        o = out[rid]
        assert len(o.outputs[0].token_ids) == w.output_len and o.outputs[0].finish_reason == "length"
        assert o.metrics.arrival_time == pytest.approx(w.arrival_time)
    assert len(out["r0"].prompt_token_ids) == 12 and out["r3"].prompt_token_ids == [7, 8, 9]
    by_id = {r.request_id: r for r in engine.finished}
    assert by_id["r0"].tenant == "a" and by_id["r1"].priority == 1


def test_submit_to_the_simulator():
    # a small pool: check_invariants (after every step) walks every block
    config = EngineConfig(executor="sim", model="llama-3-8b", hardware="A100-80GB", num_blocks=4000)
    engine = LLMEngine(config)
    items = poisson(30, 10.0, max_output=256, seed=2)
    submit(engine, items)
    out = run_checked(engine)
    assert sorted(len(o.outputs[0].token_ids) for o in out.values()) == sorted(w.output_len for w in items)
