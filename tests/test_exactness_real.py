"""The real SmolLM2-135M: minfer's model equals Hugging Face token for token (greedy) and logit for logit.

These prompts are arbitrary; any others should pass too.
"""

from __future__ import annotations

import pytest
import torch

from minfer.kv.contiguous import ContiguousKVCache
from minfer.ops.linear import PACKED_BACKENDS, supports

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
    "Explain photosynthesis in one sentence.",
    "Translate 'thank you very much' into German.",
    "What is 17 multiplied by 23?",
    "Give me a name for a friendly robot.",
    "Why do cats purr?",
]


@torch.inference_mode()
def greedy_decode(model, ids: list[int], n: int, eos: int) -> tuple[list[int], torch.Tensor]:
    """The plainest decode loop over minfer's contiguous KV cache; also returns the prompt's last logits."""
    cache = ContiguousKVCache(model.config, 1, len(ids) + n)
    slot = torch.tensor([0])
    pos = torch.arange(len(ids))
    logits = model.compute_logits(model(torch.tensor(ids), pos, cache.attention(slot, pos[None]))[-1:])
    first_logits = logits[0]
    out: list[int] = []
    p = len(ids)
    while len(out) < n:
        token = int(logits.argmax())
        out.append(token)
        if token == eos:
            break
        pos = torch.tensor([p])
        logits = model.compute_logits(model(torch.tensor([token]), pos, cache.attention(slot, pos[None])))
        p += 1
    return out, first_logits


@pytest.mark.parametrize("linear_backend", [
    "torch", *(pytest.param(name, marks=pytest.mark.skipif(supports(name, torch.float32, "cpu") is not None,
                                                           reason=f"{supports(name, torch.float32, 'cpu')}"))
               for name in PACKED_BACKENDS)])
def test_greedy_and_logits_equal_hugging_face(smollm2, hf_smollm2, linear_backend):
    """Every way of running the products: ``x @ W``, minfer's C++ kernel (the CPU's default) and oneDNN, both on
    packed weights."""
    model, tok = smollm2
    model.use_linear_backend(linear_backend)
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}])
        ours, logits = greedy_decode(model, ids, 32, tok.eos_token_id)
        with torch.inference_mode():
            x = torch.tensor([ids])  # explicit mask: HF would otherwise treat <|im_end|> (= pad id) as padding
            ref = hf_smollm2.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32,
                                      do_sample=False)[0, len(ids):].tolist()
            ref_logits = hf_smollm2(torch.tensor([ids])).logits[0, -1]
        assert ours == ref, f"{prompt!r}: minfer {tok.decode(ours)!r} != HF {tok.decode(ref)!r}"
        assert (logits - ref_logits).abs().max() < 1e-4, f"{prompt!r}: last-position logits differ"
