"""The engine on the real SmolLM2-135M: greedy outputs equal Hugging Face ``generate`` token for token for
a mixed batch, under chunked prefill, heavy preemption, and one sequence at a time."""

from __future__ import annotations

import pytest
import torch

from conftest import run_checked
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.engine import OFFLINE_DEFAULTS

PROMPTS = [
    "Name the largest planet in our solar system.",
    "Write a short poem about a lighthouse keeper who befriends a seagull.",
    "What is the boiling point of water at sea level, in Celsius?",
    "Suggest a name for a bakery.",
    "Describe the taste of a lemon to someone who has never had one, in two sentences.",
    "How many legs does a spider have?",
    "Give one tip for learning a new language quickly.",
    "Summarise the plot of Romeo and Juliet.",
]
MAX_TOKENS = 40

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cases(smollm2, hf_smollm2):
    """Chat-templated prompt ids and Hugging Face's greedy continuation of each, generating through EOS
    (the model answers briefly; continuing past EOS keeps every request growing, so a small pool must
    preempt -- and it also checks the tokens after EOS, where nothing is special)."""
    _, tok = smollm2
    out = []
    for p in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}])
        with torch.inference_mode():
            x = torch.tensor([ids])
            # an explicit attention mask: without one, HF masks every <|im_end|> in the prompt as padding
            ref = hf_smollm2.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS,
                                      do_sample=False, eos_token_id=-1)  # -1: no token ends generation
        out.append((ids, ref[0, len(ids):].tolist()))
    return out


@pytest.mark.parametrize("kw", [
    {},
    OFFLINE_DEFAULTS,  # what LLM() builds
    {"attention_backend": "torch", "pointwise_backend": "torch"},  # the references, where "auto" finds no compiler
    {"chunked_prefill_size": 16},
    # the two that take ten seconds or more (hundreds of steps of one or two requests) run in make test-long
    pytest.param({"num_blocks": 12, "block_size": 8}, marks=pytest.mark.long),
    pytest.param({"max_num_seqs": 1}, marks=pytest.mark.long),
], ids=["defaults", "offline", "torch-references", "chunk16", "tiny-pool", "one-seq"])
def test_engine_equals_hugging_face(smollm2, cases, kw):
    model, tok = smollm2
    engine = LLMEngine(EngineConfig(**kw), model=model, tokenizer=tok)
    copies = 2 if "num_blocks" in kw else 1  # twice the requests for the small pool: more pressure
    for c in range(copies):
        for i, (ids, _) in enumerate(cases):
            engine.add_request(f"{c}-{i}", ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    outs = run_checked(engine)
    for c in range(copies):
        for i, (_, ref) in enumerate(cases):
            got = outs[f"{c}-{i}"].outputs[0].token_ids
            assert got == ref, f"{kw} prompt {i}: {tok.decode(got)!r} != {tok.decode(ref)!r}"
    preemptions = sum(len(t.preempted) for t in engine.trace)
    if "num_blocks" in kw:
        assert preemptions >= 10, f"only {preemptions} preemptions: the pool is not small enough to test them"
    if kw.get("chunked_prefill_size") == 16:
        assert max(t.num_prefill_tokens for t in engine.trace) <= 16
    if kw.get("max_num_seqs") == 1:
        assert max(t.batch_size for t in engine.trace) == 1


def test_offline_engine_sent_the_same_prompts_again_serves_them_from_its_prefix_cache(smollm2, cases):
    """What ``LLM()`` does when a script calls ``generate`` twice: the second turn's prompt blocks come from the
    prefix cache (on in ``OFFLINE_DEFAULTS``, as in vLLM's ``LLM``), and the tokens are still Hugging Face's."""
    model, tok = smollm2
    engine = LLMEngine(EngineConfig(**OFFLINE_DEFAULTS), model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    cached = []
    for turn in range(2):
        for i, (ids, _) in enumerate(cases):
            engine.add_request(f"{turn}-{i}", ids, params)
        outs = run_checked(engine)
        for i, (_, ref) in enumerate(cases):
            assert outs[f"{turn}-{i}"].outputs[0].token_ids == ref, f"turn {turn}, prompt {i}"
        cached.append(sum(outs[f"{turn}-{i}"].metrics.num_cached_tokens for i in range(len(cases))))
    block = engine.config.block_size  # turn 1: every full block of every prompt, short of the last prompt token
    assert cached[1] == sum((len(ids) - 1) // block * block for ids, _ in cases) > cached[0], cached
