"""Speculative decoding: guesses from prompt lookup or the model's first layers, verified in the step's one pass.

Greedy outputs must be token for token those of plain decoding, however the step is cut (chunked prefill,
preemption by recompute or swap, prefix caching, stop strings, streaming, aborts); sampled outputs must follow the
target's distribution (rejection sampling) and repeat under a seed. Every engine step is checked against the
scheduler's and the pool's invariants (``run_checked``), which include: the pool holds exactly the computed slots
-- the rejected guesses' slots were rolled back.
"""

from __future__ import annotations

import pytest
import torch

from conftest import run_checked, tiny_engine
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.metrics import SpecDecodeStats
from minfer.spec import SpeculativeConfig, propose_ngram
from minfer.spec.verify import accept_greedy, accept_sampled, draw

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
EARLY_EXIT = {"method": "early_exit", "num_speculative_tokens": 3, "num_draft_layers": 1}
# prompts that repeat themselves (prompt lookup finds guesses), and one that does not
PROMPTS = ["abcabcabcabcabcabc", "the cat sat on the mat and the cat sat on the", "hello world " * 4, "xyz",
           "0123456789" * 3]


def step(e: LLMEngine, n: int) -> None:
    """``n`` engine steps, each checked."""
    for _ in range(n):
        e.step()
        e.scheduler.check_invariants()


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def generate(tiny, spec, params=None, prompts=PROMPTS, **config) -> tuple[dict[str, list[int]], LLMEngine]:
    e = tiny_engine(tiny, speculative_config=spec, **{"num_blocks": 64, **config})
    for i, p in enumerate(prompts):
        e.add_request(f"r{i}", p, params or greedy())
    outs = run_checked(e)
    return {rid: o.outputs[0].token_ids for rid, o in outs.items()}, e


# ---- the pieces --------------------------------------------------------------------------------------------------

def test_prompt_lookup_takes_the_longest_match_and_its_latest_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert propose_ngram(tokens, 3, 1, 2) == [8, 2, 5]  # "5 6" last seen at 4: what followed it there
    assert propose_ngram([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 2, 2, 3) == [9, 2]  # "1 2 3" (n=3) beats the later "2 3"
    assert propose_ngram([1, 2, 3, 4], 4, 1, 3) == []  # nothing repeats
    assert propose_ngram([4, 4], 5, 1, 3) == [4]  # only what the text holds after the match
    assert propose_ngram([7], 2, 1, 3) == []


def test_greedy_acceptance_keeps_guesses_up_to_the_first_disagreement():
    assert accept_greedy([1, 2, 3], [1, 2, 3, 4]) == [1, 2, 3, 4]  # all kept, and the bonus token
    assert accept_greedy([1, 9, 3], [1, 2, 3, 4]) == [1, 2]  # the target's token replaces the first wrong guess
    assert accept_greedy([9, 2, 3], [1, 2, 3, 4]) == [1]  # nothing kept: still one token, as without guesses
    assert accept_greedy([], [5]) == [5]


def test_rejection_sampling_gives_the_target_distribution_whatever_the_guess():
    """Two positions, fixed guesses: the first token must follow p0, and the second (when the first guess was
    kept) p1 -- including for a guess the target thinks unlikely."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    n = 40_000
    for guesses in ([0, 3], [3, 0], [2, 2]):
        gen = torch.Generator().manual_seed(7)
        first, second = torch.zeros(4), torch.zeros(4)
        for _ in range(n):
            kept = accept_sampled(guesses, p, gen)
            assert 1 <= len(kept) <= len(guesses) + 1
            assert kept[:-1] == guesses[: len(kept) - 1], "kept tokens before the last must be the guesses"
            first[kept[0]] += 1
            if len(kept) > 1:
                second[kept[1]] += 1
        # 5 standard deviations of a binomial share: fails by chance once in millions of runs
        for counts, target in ((first, p[0]), (second, p[1])):
            total = counts.sum()
            sd = (target * (1 - target) / total).sqrt()
            assert ((counts / total - target).abs() <= 5 * sd + 1e-9).all(), (guesses, counts / total, target)


def test_a_rejected_guess_is_never_the_replacement_and_draws_repeat_under_a_seed():
    p = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]])
    for seed in range(200):
        kept = accept_sampled([0], p, torch.Generator().manual_seed(seed))
        assert kept in ([1], [0, 2]), kept  # rejected 0 → 1, the only other token; kept 0 → bonus from row 1
        again = accept_sampled([0], p, torch.Generator().manual_seed(seed))
        assert kept == again
    assert draw(torch.tensor([0.0, 0.0, 3.0]), torch.Generator().manual_seed(0)) == 2


def test_speculative_config_is_checked_when_the_engine_config_is_built():
    assert EngineConfig(speculative_config=NGRAM).speculative == SpeculativeConfig(**NGRAM)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        EngineConfig(speculative_config={"method": "medusa"})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="no field"):
        EngineConfig(speculative_config={"method": "ngram", "k": 3})
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        EngineConfig(speculative_config={"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2})
    with pytest.raises(ValueError, match="dict"):
        EngineConfig(speculative_config="ngram")  # type: ignore[arg-type]


def test_early_exit_needs_fewer_draft_layers_than_the_model_has(tiny):
    with pytest.raises(ValueError, match="num_draft_layers"):
        tiny_engine(tiny, speculative_config={"method": "early_exit", "num_draft_layers": 2})  # the model has 2


# ---- exact in the engine -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain(tiny):
    return generate(tiny, None)[0]


@pytest.mark.parametrize("spec", [NGRAM, EARLY_EXIT], ids=["ngram", "early_exit"])
@pytest.mark.parametrize("config", [
    {}, {"chunked_prefill_size": 16}, {"num_blocks": 12}, {"num_blocks": 12, "preemption_mode": "swap"},
    {"enable_prefix_caching": True}, {"max_num_seqs": 2}, {"admission": "reserve", "num_blocks": 40},
    {"block_size": 4, "num_blocks": 40, "chunked_prefill_size": 8, "enable_prefix_caching": True},
], ids=["default", "chunk16", "preempt", "swap", "prefix_cache", "two_seqs", "reserve", "small_blocks"])
def test_greedy_outputs_equal_plain_decoding(tiny, plain, spec, config):
    outs, e = generate(tiny, spec, **config)
    assert outs == plain
    stats = SpecDecodeStats.of(e.trace)
    assert stats.num_accepted_tokens > 0, "no guess was ever kept: the test would not test speculation"
    assert stats.num_draft_tokens > stats.num_accepted_tokens, "no guess was ever rejected: no rollback tested"
    if config.get("num_blocks") == 12:
        assert any(t.preempted for t in e.trace), "the small pool was meant to force preemption"


def test_lookahead_respects_max_tokens_and_the_model_length(tiny):
    e = tiny_engine(tiny, speculative_config=NGRAM, num_blocks=64, max_model_len=30)
    e.add_request("short", "abababababab", greedy(max_tokens=3))
    e.add_request("long", "abababababab", greedy(max_tokens=100))
    outs = run_checked(e)
    assert len(outs["short"].outputs[0].token_ids) == 3
    assert len(outs["long"].prompt_token_ids) + len(outs["long"].outputs[0].token_ids) == 30
    for t in e.trace:  # never more guesses than the tokens a request may still produce, less the one it always gets
        assert all(n <= 4 for n in t.draft_tokens.values())


def test_guesses_take_only_leftover_budget_and_free_blocks(tiny):
    """A guess never preempts anyone and never shrinks a prompt's chunk."""
    e = tiny_engine(tiny, speculative_config=NGRAM, num_blocks=64, max_num_batched_tokens=20, chunked_prefill_size=16)
    e.add_request("a", "abababababab", greedy(max_tokens=30))
    step(e, 3)  # a decodes, guessing
    e.add_request("b", "x" * 40, greedy(max_tokens=2))
    step(e, 1)
    t = e.trace[-1]
    assert t.prefill_tokens["b"] == 16, "the prompt chunk got its full budget"
    assert t.draft_tokens.get("a", 0) <= 20 - 16 - 1, "guesses used only the leftover token budget"
    outs, e2 = generate(tiny, NGRAM, num_blocks=12)
    assert all(d.cause == "pool_full" for t in e2.trace for d in t.decisions if d.kind == "preempted")


def test_rejected_guesses_never_reach_the_prefix_cache(tiny, plain):
    """Every hashed block must hold the tokens its hash names: a second run of the same prompts hits the cache and
    still gives plain decoding's tokens."""
    e = tiny_engine(tiny, speculative_config=NGRAM, num_blocks=128, enable_prefix_caching=True, block_size=4)
    for rnd in range(2):
        for i, p in enumerate(PROMPTS):
            e.add_request(f"{rnd}-r{i}", p, greedy())
        outs = run_checked(e)
        assert {rid.split("-", 1)[1]: o.outputs[0].token_ids for rid, o in outs.items()} == plain
    assert e.trace and sum(t.num_cached_tokens for t in e.trace) > 0


def test_stop_strings_and_stop_tokens_end_at_the_same_token(tiny):
    """A step may bring several tokens: the request ends at the one that completes a stop string or is a stop token,
    and the tokens after it are dropped, as if they had come one at a time."""
    for kw in ({"stop": ["bc"]}, {"stop": ["ca", "zz"]}, {"stop_token_ids": [ord("c")]}):
        params = greedy(max_tokens=40, **kw)
        want, _ = generate(tiny, None, params, prompts=["abcabcabcabcabcabc", "abababab"])
        got, e = generate(tiny, NGRAM, params, prompts=["abcabcabcabcabcabc", "abababab"])
        assert got == want, kw


def test_streamed_tokens_add_up_to_the_output(tiny):
    e = tiny_engine(tiny, speculative_config=NGRAM, num_blocks=64)
    for i, p in enumerate(PROMPTS):
        e.add_request(f"r{i}", p, greedy(stop=["zz"]))
    streamed: dict[str, list[int]] = {}
    final = {}
    while e.has_unfinished_requests():
        for o in e.step():
            streamed.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                final[o.request_id] = o
        e.scheduler.check_invariants()
    assert any(n > 0 for t in e.trace for n in t.accepted_tokens.values())
    for rid, o in final.items():
        assert streamed[rid] == o.outputs[0].token_ids
        assert len(o.metrics.token_times) == len(o.outputs[0].token_ids)


def test_abort_while_speculating_frees_everything(tiny):
    e = tiny_engine(tiny, speculative_config=NGRAM, num_blocks=64)
    for i, p in enumerate(PROMPTS):
        e.add_request(f"r{i}", p, greedy())
    step(e, 4)
    e.abort_request("r0")
    run_checked(e)
    assert e.block_pool.num_free_blocks == 64


def test_seeded_sampling_repeats_and_follows_each_request(tiny):
    params = SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=11, ignore_eos=True)
    one, _ = generate(tiny, NGRAM, params)
    two, _ = generate(tiny, NGRAM, params, max_num_seqs=2, chunked_prefill_size=16)  # other batches, same tokens
    assert one == two


def sim_run(spec):
    """Four 100-token prompts, 64 tokens each, on a simulated H100 with ``speculative_config=spec``."""
    e = LLMEngine(EngineConfig(model="llama-3.1-8b", executor="sim", hardware="H100-SXM", debug_checks=True,
                               speculative_config=spec))
    for i in range(4):
        e.add_request(f"r{i}", [1] * 100, SamplingParams(max_tokens=64, ignore_eos=True))
    run_checked(e)
    return e


@pytest.mark.parametrize("rate", [0.0, 0.7, 1.0])
def test_the_simulator_prices_verification_and_keeps_guesses_at_the_acceptance_rate(rate):
    plain, spec = sim_run(None), sim_run({"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": rate})
    stats = SpecDecodeStats.of(spec.trace)
    assert all(len(r.output_token_ids) == 64 for r in spec.finished)
    if rate == 0.0:
        assert stats.num_accepted_tokens == 0 and spec.now > plain.now  # every guess wasted: slower
    elif rate == 1.0:
        assert stats.acceptance_rate == 1.0 and spec.now < plain.now / 3  # 5 tokens a step
    else:
        assert 0.55 < stats.acceptance_rate < 0.85  # drawn at 0.7, cut at the first wrong guess of each step
        assert spec.now < plain.now
    with pytest.raises(ValueError, match="acceptance_rate"):
        sim_run({"method": "ngram"})



def test_the_simulator_prices_early_exit_drafts_by_the_layers_they_run():
    """The same guesses at the same acceptance, made by prompt lookup (free) and by early exit: the draft's passes
    cost time, more with more layers, and a step's extra time is its k passes of the cut model."""
    from minfer.sim.cost import RooflineCost, StepShape
    from minfer.sim.executor import draft_spec
    from minfer.sim.hardware import get_hardware
    from minfer.sim.models import get_model_spec

    guesses = {"num_speculative_tokens": 4, "acceptance_rate": 0.7}
    ngram = sim_run({"method": "ngram", **guesses})
    shallow = sim_run({"method": "early_exit", "num_draft_layers": 4, **guesses})
    deep = sim_run({"method": "early_exit", "num_draft_layers": 16, **guesses})
    assert [t.accepted_tokens for t in ngram.trace] == [t.accepted_tokens for t in deep.trace]  # the same draws
    assert ngram.now < shallow.now < deep.now
    # one step by hand: the same schedule with and without the draft's cost, so the two runs' step times differ by
    # exactly the draft passes -- pass j one token of each request that guessed more than j, at its position + j
    model, hardware = get_model_spec("llama-3.1-8b"), get_hardware("H100-SXM")
    draft = RooflineCost(draft_spec(model, SpeculativeConfig("early_exit", num_draft_layers=16)), hardware,
                         hardware.dtype)
    step = next(i for i, t in enumerate(deep.trace) if t.draft_tokens)
    guessed, at = deep.trace[step].draft_tokens, deep.trace[step].positions
    assert guessed == ngram.trace[step].draft_tokens and set(guessed.values()) == {4}
    passes = [StepShape() for _ in range(4)]
    for rid, k in guessed.items():
        for j in range(k):
            passes[j].add(at[rid] + j, 1, True, True)
    by_hand = sum(draft.step_time(shape) for shape in passes)
    assert deep.trace[step].duration - ngram.trace[step].duration == pytest.approx(by_hand, rel=1e-9)
    with pytest.raises(ValueError, match="num_draft_layers"):
        draft_spec(model, SpeculativeConfig("early_exit", num_draft_layers=model.config.num_layers))

# ---- on the real model -------------------------------------------------------------------------------------------

COPY = ("Copy this text exactly, word for word:\n\nThe quick brown fox jumps over the lazy dog. Pack my box with "
        "five dozen liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.")


@pytest.mark.long  # three prompts decoded on the real model with and without speculation: over ten seconds
@pytest.mark.parametrize("spec", [NGRAM, {"method": "early_exit", "num_speculative_tokens": 2,
                                          "num_draft_layers": 20}], ids=["ngram", "early_exit"])
def test_real_model_greedy_outputs_equal_plain_decoding(smollm2, spec):
    model, tok = smollm2
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}]) for c in
               (COPY, "What is the capital of France?", "List the days of the week.")]

    def run(s, **config):
        e = LLMEngine(EngineConfig(model="smollm2-135m", speculative_config=s, debug_checks=True, **config),
                      model=model, tokenizer=tok)
        for i, p in enumerate(prompts):
            e.add_request(f"r{i}", p, SamplingParams(max_tokens=24, temperature=0))
        return {rid: o.outputs[0].token_ids for rid, o in run_checked(e).items()}, e

    want, _ = run(None)
    configs = [{}, {"chunked_prefill_size": 16}] if spec is NGRAM else [{}]  # early exit: k draft passes a step
    for config in configs:
        got, e = run(spec, **config)
        assert got == want, config
        assert SpecDecodeStats.of(e.trace).num_accepted_tokens > 0
