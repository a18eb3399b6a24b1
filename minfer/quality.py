"""What fewer bytes a weight cost in quality: each weight format measured against the model's own float weights.

Two measures, each for one format beside the reference (``weights="dtype"``, float32 on the CPU):

* **agreement**: the engine's greedy answers to a fixed set of prompts, compared token by token with the
  reference's; for each answer, the tokens before the first one that differs count as agreeing (after a divergence
  the two continue from different texts, so later matches mean nothing). The share of agreeing tokens over all
  answers: 1.0 is the same text everywhere.
* **perplexity** on a short held text shipped with the package (``minfer/quant/held_out.txt``, written for it):
  ``exp`` of the mean negative log-likelihood of each next token, the model reading the whole text at once. Lower
  is better; a format that costs nothing gives the reference's number.

The weights' bytes come beside them (``product_bytes``): what one decode step reads of the products' weights, the
bound that a memory-bound step moves with (``minfer/bench.py``'s ``decode_speed`` measures the time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from minfer.accelerate import PackedLinear, PackedLMHead, QuantizedProduct, accelerate
from minfer.config import SPEED_UPS, EngineConfig
from minfer.engine import OFFLINE_DEFAULTS, LLMEngine
from minfer.kv.contiguous import ContiguousKVCache
from minfer.model.llama import Linear, LlamaModel, LMHead
from minfer.model.loader import gguf_file, load_model_cached
from minfer.request import SamplingParams
from minfer.types import DType, WeightFormat

HELD_OUT = Path(__file__).with_name("quant") / "held_out.txt"
PROMPTS = (  # short chat questions of different kinds: facts, how-to, a list, code, a story, arithmetic
    "What is the capital of France?",
    "How do I boil an egg?",
    "Name three colours of the rainbow.",
    "Write a Python function that adds two numbers.",
    "Tell me a short story about a cat.",
    "What is 12 times 7?",
    "Why is the sky blue?",
    "Give me a tip for learning a new language.",
)
FORMATS: tuple[WeightFormat, ...] = ("dtype", "int8", "q4")


@dataclass(frozen=True, slots=True)
class Quality:
    """One weight format's quality beside the reference's, and its bytes."""

    weights: str  # the weight format, or the dtype of a model measured whole in another dtype ("bfloat16")
    agreement: float  # share of greedy tokens identical to the reference's before the first divergence
    perplexity: float  # on the held text
    product_bytes: int  # bytes of the products' weights one decode step reads


def held_text() -> str:
    return HELD_OUT.read_text()


def agreement(reference: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]) -> float:
    """Share of the reference's tokens that each answer repeats before its first differing token."""
    same = total = 0
    for ref, ans in zip(reference, answers, strict=True):
        first_difference = next((i for i, (a, b) in enumerate(zip(ref, ans)) if a != b), min(len(ref), len(ans)))
        same += first_difference
        total += len(ref)
    return same / total if total else 1.0


def greedy_answers(model: LlamaModel, tokenizer, name: str, weights: WeightFormat, prompts: Sequence[str],
                   max_tokens: int) -> list[list[int]]:
    """The engine's greedy tokens (``max_tokens`` each, EOS ignored so every answer has the same length) for each
    chat prompt, with ``LLM()``'s speed-ups and the given weight format, in ``model``'s dtype."""
    dtype = cast(DType, str(model.dtype).removeprefix("torch."))
    engine = LLMEngine(EngineConfig(model=name, weights=weights, dtype=dtype, **OFFLINE_DEFAULTS), model=model,
                       tokenizer=tokenizer)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{i}", tokenizer.apply_chat_template([{"role": "user", "content": prompt}]), params)
    done = {o.request_id: o.outputs[0].token_ids for o in engine.run()}
    return [list(done[f"p{i}"]) for i in range(len(prompts))]


@torch.inference_mode()
def perplexity(model: LlamaModel, token_ids: Sequence[int]) -> float:
    """``exp`` of the mean negative log-likelihood of each token after the first, the model reading them all in one
    pass over a contiguous KV cache."""
    ids = torch.tensor(list(token_ids))
    positions = torch.arange(len(ids))
    cache = ContiguousKVCache(model.config, 1, len(ids), dtype=model.dtype, device=model.device)
    hidden = model(ids, positions, cache.attention(torch.tensor([0]), positions[None]))
    logits = model.compute_logits(hidden[:-1])
    return math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))


def product_bytes(fast: LlamaModel) -> int:
    """Bytes of the products' weights in a model the speed-up layer built (quantized copies, packed copies or the
    plain weights): what a decode step reads of them. The LM head counts once, tied or not."""
    total = 0
    for m in fast.modules():
        if isinstance(m, QuantizedProduct):
            total += m.nbytes()
        elif isinstance(m, (Linear, PackedLinear)):
            total += m.weight.numel() * m.weight.element_size()
        elif isinstance(m, (LMHead, PackedLMHead)):
            total += fast.lm_head_weight.numel() * fast.lm_head_weight.element_size()
    return total


def weight_bytes(name: str = "smollm2-135m", dtype: str = "float32", weights: WeightFormat = "dtype") -> int:
    """What one decode step of ``LLM(name, dtype=dtype, weights=weights)`` reads of the products' weights on the
    CPU: ``product_bytes`` of the model the speed-up layer builds for it (a benchmark prices a row's roofline so)."""
    return product_bytes(accelerated(load_model_cached(name, "cpu", getattr(torch, dtype))[0], name, weights))


def accelerated(model: LlamaModel, name: str, weights: WeightFormat) -> LlamaModel:
    """``model`` with ``LLM()``'s speed-ups and ``weights``' copies swapped in, as an engine of ``name`` builds it."""
    return accelerate(model, SPEED_UPS["linear_backend"], SPEED_UPS["pointwise_backend"],  # type: ignore[arg-type]
                      weights, gguf_file(name) if weights == "q4" else None)


def measure(name: str = "smollm2-135m", formats: Sequence[WeightFormat] = FORMATS, prompts: Sequence[str] = PROMPTS,
            max_tokens: int = 32, dtypes: Sequence[str] = ()) -> list[Quality]:
    """Agreement and perplexity of each format, against ``weights="dtype"`` (float32 on the CPU), on one loaded
    copy of the model; then of the whole model in each of ``dtypes`` (e.g. ``"bfloat16"``: every weight and
    activation rounded to it), on a copy loaded in it."""
    model, tokenizer = load_model_cached(name)
    ids = tokenizer.encode(held_text())
    reference = greedy_answers(model, tokenizer, name, "dtype", prompts, max_tokens)
    results = []
    for weights in formats:
        answers = reference if weights == "dtype" else greedy_answers(model, tokenizer, name, weights, prompts,
                                                                      max_tokens)
        fast = accelerated(model, name, weights)
        results.append(Quality(weights, agreement(reference, answers), perplexity(fast, ids), product_bytes(fast)))
    for dtype in dtypes:
        other = load_model_cached(name, "cpu", getattr(torch, dtype))[0]
        answers = greedy_answers(other, tokenizer, name, "dtype", prompts, max_tokens)
        fast = accelerated(other, name, "dtype")
        results.append(Quality(dtype, agreement(reference, answers), perplexity(fast, ids), product_bytes(fast)))
    return results


def table(results: Sequence[Quality]) -> str:
    """The measurements as aligned text, one format a line."""
    lines = [f"{'weights':<9} {'agreement':>9} {'perplexity':>10} {'MB / step':>9}"]
    lines += [f"{q.weights:<9} {q.agreement:>9.3f} {q.perplexity:>10.3f} {q.product_bytes / 1e6:>9.1f}"
              for q in results]
    return "\n".join(lines)


if __name__ == "__main__":
    from minfer.ops.linear import whole_model_dtypes

    dtypes, why = whole_model_dtypes()  # bfloat16 where this CPU multiplies it natively, else said why not
    print(table(measure(dtypes=dtypes)))
    if why:
        print(f"(no bfloat16 row: {why})")
