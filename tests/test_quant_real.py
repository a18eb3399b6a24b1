"""The weight formats on the real SmolLM2: the GGUF's blocks are exactly minfer's float32 weights, and each format's
agreement and perplexity stay within stated bounds of float32's (``minfer/quality.py``)."""

from __future__ import annotations

import pytest
import torch

from minfer import quality
from minfer.accelerate import accelerate
from minfer.model.loader import gguf_file, load_model_cached
from minfer.ops import quant_linear
from minfer.quant.gguf import read_blocks

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(quant_linear.cpp_problem(torch.float32, "cpu") is not None,
                                 reason="the quantized C++ kernel does not build here")]
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def real():
    return load_model_cached(NAME)


@pytest.fixture(scope="module")
def float32_answers(real):
    model, tok = real
    return quality.greedy_answers(model, tok, NAME, "dtype", quality.PROMPTS, 32)


def held_ids(real) -> list[int]:
    return real[1].encode(quality.held_text())


def test_the_float32_weights_are_the_gguf_blocks_dequantized(real):
    """minfer's float32 checkpoint is the GGUF's exact dequantization, bit for bit: every layer matrix from its
    Q4_1 blocks, the tied embedding from its Q8_0 blocks. So q4 multiplies the same numbers float32 does."""
    model, _ = real
    blocks = read_blocks(gguf_file(NAME), model.config)
    params = dict(model.named_parameters())
    assert len(blocks) == 1 + 4 * model.config.num_layers  # the embedding, and qkv, o, gate/up, down per layer
    for name, w in blocks.items():
        expected = params[name].t() if name == "embed_tokens.weight" else params[name]
        assert torch.equal(w.dequantize(), expected), name


@pytest.mark.long
def test_q4_agrees_with_float32_up_to_the_order_of_its_sums(real, float32_answers):
    """Same numbers, summed in another order: logits within 1e-3 of float32's over the whole held text (measured:
    7e-5, as far as minfer's float32 kernel is from PyTorch's product), the same perplexity to 1e-4, and the same
    greedy answers -- allowing one of the eight to part at a near-tie (a last-bit difference can flip a choice
    between two almost equal logits; measured: none did)."""
    model, tok = real
    ids = torch.tensor(held_ids(real))
    plain, q4 = accelerate(model, weights="dtype"), accelerate(model, weights="q4", gguf=gguf_file(NAME))
    logits = [m.compute_logits(hidden_states(m, ids)) for m in (plain, q4)]
    assert float((logits[0] - logits[1]).abs().max()) < 1e-3
    ppl = [quality.perplexity(m, ids.tolist()) for m in (plain, q4)]
    assert ppl[1] == pytest.approx(ppl[0], rel=1e-4)
    answers = quality.greedy_answers(model, tok, NAME, "q4", quality.PROMPTS, 32)
    assert quality.agreement(float32_answers, answers) >= 7 / 8


def test_int8_stays_close_to_float32(real, float32_answers):
    """int8 rounds every weight (to within half a step of 1/254 of its group's largest): perplexity within 1% of
    float32's (measured: +0.1%), and at least three quarters of the greedy tokens agree (measured: all; groups of 64
    agreed on 72%, one scale per column on 50% -- why groups of 32)."""
    model, tok = real
    ids = held_ids(real)
    ppl32 = quality.perplexity(accelerate(model, weights="dtype"), ids)
    ppl8 = quality.perplexity(accelerate(model, weights="int8"), ids)
    assert abs(ppl8 / ppl32 - 1) < 0.01
    answers = quality.greedy_answers(model, tok, NAME, "int8", quality.PROMPTS, 32)
    assert quality.agreement(float32_answers, answers) >= 0.75


def test_the_whole_model_in_bfloat16_keeps_its_perplexity_not_its_greedy_tokens(real):
    """``quality.measure``'s dtype rows: the model loaded in bfloat16 (weights, activations and KV cache rounded to
    it) reads the held text as well as float32 does -- perplexity within 2% (measured: -0.3%) -- but its greedy
    answers part from float32's early (measured: 59% of tokens before the first divergence, on a Xeon with AMX),
    which is why ``LLM()`` stays float32 on the CPU. Its products read half of float32's bytes."""
    reference, bf16 = quality.measure(NAME, formats=("dtype",), dtypes=("bfloat16",))
    assert (reference.weights, bf16.weights) == ("dtype", "bfloat16") and reference.agreement == 1.0
    assert abs(bf16.perplexity / reference.perplexity - 1) < 0.02
    assert 0 < bf16.agreement < 1
    assert bf16.product_bytes * 2 == reference.product_bytes


@torch.inference_mode()
def hidden_states(model, ids: torch.Tensor) -> torch.Tensor:
    from minfer.kv.contiguous import ContiguousKVCache

    positions = torch.arange(len(ids))
    cache = ContiguousKVCache(model.config, 1, len(ids))
    return model(ids, positions, cache.attention(torch.tensor([0]), positions[None]))
