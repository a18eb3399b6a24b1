"""Verification: which guesses a request keeps, given the target model's logits at every guessed position.

One forward pass over a request's last token and its ``k`` guesses ``g1 .. gk`` gives ``k + 1`` rows of logits:
row ``i`` is the target model's next-token distribution after the text *and* ``g1 .. gi``. Guesses are kept in
order while the target agrees with them; at the first disagreement the target's own token replaces the guess
and everything after it is thrown away (it was computed after a wrong token). If all ``k`` are kept, the last
row gives one more token for free. So a step yields between 1 and ``k + 1`` tokens, never fewer than decoding
without guesses would.

**Greedy** (temperature 0): the target agrees with ``gi`` when ``gi`` is the argmax of row ``i - 1``. The output
is token for token the output of plain greedy decoding.

**Sampling**: rejection sampling (Leviathan et al. 2023; Chen et al. 2023) makes the output *distribution* the
target's, whatever the guesses. A draft that proposes ``g`` with probability ``q(g)`` has ``g`` accepted with
probability ``min(1, p(g) / q(g))``; on rejection, the token is drawn from ``max(0, p - q)``, renormalized. minfer's
drafts are deterministic -- prompt lookup, or the draft model's argmax -- so ``q`` is one-hot at ``g``: accept with
probability ``p(g)``; on rejection draw from ``p`` with ``g`` removed. (Then each position's token is ``g`` with
probability ``p(g)`` and any other token ``x`` with probability ``(1 - p(g)) p(x) / (1 - p(g)) = p(x)``: exactly
``p``.) Each draw uses the request's own random stream, so a seeded request gives the same tokens on every run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minfer.request import SamplingParams
from minfer.sampler import filter_logits


def accept_greedy(guesses: list[int], target: list[int]) -> list[int]:
    """The tokens kept: the guesses that equal the target's choice at their position, up to the first that does
    not, then the target's own token there (``target`` has ``len(guesses) + 1`` entries: each row's argmax)."""
    # BEGIN EXERCISE E13.1
    kept = []
    for guess, best in zip(guesses, target):
        if guess != best:
            break
        kept.append(guess)
    kept.append(target[len(kept)])  # the correction, or the bonus token after k accepted guesses
    return kept
    # END EXERCISE


def accept_sampled(guesses: list[int], probs: Tensor, generator: torch.Generator) -> list[int]:
    """Rejection sampling against deterministic guesses: each guess is kept with the target's probability for it;
    the first rejected one is replaced by a draw from the target with that token removed; if none is rejected, one
    more token is drawn from the last row. ``probs``: ``[len(guesses) + 1, vocab]`` target probabilities (rows sum
    to 1, on the CPU)."""
    # BEGIN EXERCISE E13.1
    kept = []
    for i, guess in enumerate(guesses):
        if float(torch.rand((), generator=generator)) < float(probs[i, guess]):
            kept.append(guess)
            continue
        residual = probs[i].clone()
        residual[guess] = 0.0  # max(0, p - q) with q one-hot at the guess
        kept.append(draw(residual, generator))
        return kept
    kept.append(draw(probs[len(guesses)], generator))
    return kept
    # END EXERCISE


def draw(weights: Tensor, generator: torch.Generator) -> int:
    """One token drawn in proportion to ``weights`` (need not sum to 1): inverse CDF with one uniform draw."""
    cdf = weights.cumsum(dim=-1)
    u = torch.rand((), generator=generator) * cdf[-1]
    return int(torch.searchsorted(cdf, u[None], right=True).clamp_(max=len(weights) - 1))


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The target's sampling distribution at each row of ``logits`` ``[rows, vocab]``: the request's temperature,
    top-k and top-p applied exactly as the sampler applies them, on the CPU."""
    rows, vocab = logits.shape
    full = torch.full((rows,), 1.0, device=logits.device)
    top_k = params.top_k if params.top_k > 0 else vocab
    return filter_logits(logits, full * params.temperature, (full * top_k).long(), full * params.top_p
                         ).softmax(dim=-1).cpu()


def verify(logits: Tensor, guesses: list[int], params: SamplingParams, generator: torch.Generator) -> list[int]:
    """The tokens one request keeps from a verification pass: ``logits`` ``[len(guesses) + 1, vocab]`` are the target's
    rows at its last token and at each guess."""
    if params.greedy:
        return accept_greedy(guesses, logits.argmax(dim=-1).tolist())
    return accept_sampled(guesses, target_probs(logits, params), generator)
