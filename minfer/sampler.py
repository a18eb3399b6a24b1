"""Turning logits into tokens for a batch whose rows each want something different.

Row ``i`` may be greedy, or sampled with its own temperature, top-k and top-p. All rows are filtered in
one batched pass (rows that asked for no filter keep every token). Randomness comes from the request's
own ``torch.Generator`` when it set a ``seed`` -- one draw per token, so its tokens do not depend on what
else shares the batch -- and from the engine's generator otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minfer.request import SamplingParams


def filter_logits(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Scale by temperature, then mask (to -inf) tokens outside each row's top-k and top-p set."""
    # BEGIN EXERCISE E12.1
    logits = logits / temperature[:, None]
    vocab = logits.shape[-1]
    if bool((top_k < vocab).any()) or bool((top_p < 1).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        drop = ranks >= top_k[:, None]  # top-k: keep the k best
        # top-p on what top-k kept, renormalized (as vLLM and Hugging Face do): keep until the mass reaches p
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits
    # END EXERCISE


def sample(logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           default: torch.Generator) -> list[int]:
    """One token per row of ``logits`` ``[S, vocab]`` (float32)."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        vocab = logits.shape[-1]
        sel = torch.tensor(rows, device=logits.device)
        temperature = torch.tensor([params[i].temperature for i in rows], device=logits.device)
        top_k = torch.tensor([params[i].top_k if params[i].top_k > 0 else vocab for i in rows],
                             device=logits.device)
        top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
        probs = filter_logits(logits[sel], temperature, top_k, top_p).softmax(dim=-1).cpu()
        # Inverse-CDF sampling with one uniform draw per token from the row's own stream.
        u = torch.stack([torch.rand((), generator=generators[i] or default) for i in rows])
        cdf = probs.cumsum(dim=-1)
        # the first token whose cumulative mass exceeds the draw (right=True: never a token of probability 0)
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1).clamp_(max=vocab - 1)
        tokens[sel] = picked.to(tokens.device)
    return tokens.tolist()
