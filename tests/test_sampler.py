"""The sampler's filters on hand-made distributions, where the right answer can be worked out by hand."""

from __future__ import annotations

import math

import torch

from minfer.request import SamplingParams
from minfer.sampler import filter_logits, sample

PROBS = torch.tensor([[0.3, 0.3, 0.2, 0.1, 0.1]])


def kept(top_k: int, top_p: float, probs: torch.Tensor = PROBS) -> list[int]:
    out = filter_logits(probs.log(), torch.tensor([1.0]), torch.tensor([top_k]), torch.tensor([top_p]))
    return [i for i, x in enumerate(out[0].tolist()) if x != -math.inf]


def test_top_k_and_top_p_alone():
    assert kept(2, 1.0) == [0, 1]
    assert kept(5, 0.5) == [0, 1]  # 0.3 < 0.5, 0.3 + 0.3 >= 0.5
    assert kept(5, 0.3) == [0]
    assert kept(5, 1.0) == [0, 1, 2, 3, 4]


def test_top_p_applies_to_what_top_k_kept_renormalized():
    # after top-k=2 the two tokens weigh 0.5 each: the first alone reaches top_p=0.5 (vLLM, Hugging Face)
    assert kept(2, 0.5) == [0]
    assert kept(3, 0.5) == [0, 1]  # 0.375, 0.375, 0.25: the first is short of 0.5


def test_a_draw_of_zero_never_picks_a_token_of_probability_zero(monkeypatch):
    logits = torch.tensor([[-math.inf, 0.0, 0.0]])  # token 0 has probability 0
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.tensor(0.0))  # the smallest draw there is
    gen = torch.Generator()
    assert sample(logits, [SamplingParams(temperature=1.0)], [gen], gen) == [1]
