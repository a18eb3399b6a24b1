"""The baselines do the same useful work as the engine: the same greedy tokens, and honest accounting."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import run_checked
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.baselines import hf_continuous_batching, hf_generate_static, static_batching
from minfer.model import ByteTokenizer, LlamaModel
from minfer.model.llama import fuse_hf_state_dict
from minfer.model.loader import tiny_random_config

PROMPTS = [[5 + i] * n for i, n in enumerate([12, 3, 30, 7, 19])]
MAX_TOKENS = [6, 15, 2, 9, 11]


@pytest.fixture(scope="module")
def pair():
    """A tiny random Hugging Face Llama and minfer's model with the same weights (no EOS in its config,
    so Hugging Face never stops or masks early)."""
    cfg = tiny_random_config(eos_token_ids=())
    torch.manual_seed(3)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.to_hf_dict()), dtype=torch.float32).eval()
    with torch.no_grad():  # spread the logits so greedy choices are clear-cut
        hf.lm_head.weight.mul_(30)
    ours = LlamaModel(cfg)
    ours.load_state_dict(fuse_hf_state_dict(cfg, hf.state_dict()))
    return hf, ours.eval()


def engine_tokens(model) -> list[list[int]]:
    e = LLMEngine(EngineConfig(model="tiny-random", num_blocks=64), model=model, tokenizer=ByteTokenizer())
    for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        e.add_request(str(i), p, SamplingParams(max_tokens=m, temperature=0, ignore_eos=True))
    outs = run_checked(e)
    return [outs[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))]


def test_static_batching_gives_the_engine_tokens_and_counts_its_waste(pair):
    _, model = pair
    result = static_batching(model, PROMPTS, MAX_TOKENS, batch_size=2)
    assert result.outputs == engine_tokens(model)
    assert result.output_tokens == sum(MAX_TOKENS)
    steps = result.steps
    assert sum(s["useful"] for s in steps) == sum(map(len, PROMPTS)) + sum(m - 1 for m in MAX_TOKENS)
    # batch (0, 1): prompts 12 and 3 padded to 12; decodes until 15 tokens although row 0 wanted 6
    assert steps[0] == {"batch_slots": 2, "useful": 15, "padding": 9, "idle_slots": 0, "bubbles": 0}
    assert sum(s["bubbles"] for s in steps) == (15 - 6) + (9 - 2) + 0  # finished rows kept computing
    assert steps[-1]["idle_slots"] == 1  # the last batch holds one request in two slots
    # a batch's first tokens come after every earlier batch has finished (each request's TTFT, in seconds)
    ttft = result.first_token_seconds
    assert len(ttft) == len(PROMPTS) and 0 < ttft[0] and ttft[0] <= ttft[1] < ttft[2] <= result.seconds


def test_hugging_face_baselines_match_the_engine(pair):
    hf, model = pair
    expected = engine_tokens(model)
    static = hf_generate_static(hf, PROMPTS, MAX_TOKENS, batch_size=2)
    assert static.outputs == expected and static.output_tokens == sum(MAX_TOKENS) and static.seconds > 0
    continuous = hf_continuous_batching(hf, PROMPTS, MAX_TOKENS)
    assert continuous.outputs == expected and continuous.seconds > 0
