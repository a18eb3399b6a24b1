"""The real SmolLM2-135M: minfer's model equals Hugging Face token for token (greedy) and logit for logit.

These prompts are arbitrary; any others should pass too.
"""

from __future__ import annotations

import pytest
import torch

from minfer.accelerate import accelerate
from minfer.kv.contiguous import ContiguousKVCache
from minfer.ops.linear import PACKED_BACKENDS, problem

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


@pytest.fixture(scope="module")
def references(smollm2, hf_smollm2) -> dict[str, tuple[list[int], list[int], torch.Tensor]]:
    """Hugging Face's answer for each prompt, computed once for every way of running minfer's model: prompt →
    (its token ids, HF's 32 greedy tokens, HF's logits at the prompt's last position)."""
    _, tok = smollm2
    out = {}
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}])
        with torch.inference_mode():
            x = torch.tensor([ids])  # explicit mask: HF would otherwise treat <|im_end|> (= pad id) as padding
            ref = hf_smollm2.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32,
                                      do_sample=False)[0, len(ids):].tolist()
            out[prompt] = (ids, ref, hf_smollm2(x).logits[0, -1])
    return out


@pytest.mark.parametrize(("linear_backend", "pointwise_backend"), [
    ("torch", "torch"), ("auto", "auto"),
    *(pytest.param(name, "torch", marks=pytest.mark.skipif(problem(name, torch.float32, "cpu") is not None,
                                                           reason=f"{problem(name, torch.float32, 'cpu')}"))
      for name in PACKED_BACKENDS)])
def test_greedy_and_logits_equal_hugging_face(smollm2, references, linear_backend, pointwise_backend):
    """Every way of running the model: the plain model (``x @ W``, PyTorch's operators; LLMEngine's default), every
    speed-up that runs here (LLM()'s default), and each packed product alone: minfer's C++ kernel and oneDNN."""
    plain, tok = smollm2
    model = accelerate(plain, linear_backend, pointwise_backend)
    for prompt, (ids, ref, ref_logits) in references.items():
        ours, logits = greedy_decode(model, ids, 32, tok.eos_token_id)
        assert ours == ref, f"{prompt!r}: minfer {tok.decode(ours)!r} != HF {tok.decode(ref)!r}"
        assert (logits - ref_logits).abs().max() < 1e-4, f"{prompt!r}: last-position logits differ"
