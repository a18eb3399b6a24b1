"""Speculative decoding: guess several next tokens cheaply, check them all in one pass of the real model.

A decode step reads every weight of the model to produce one token per request; at small batch that read, not
the arithmetic, sets its time (chapter 01's roofline). Computing ``k + 1`` positions instead of one reads the
same weights once, so it costs little more -- and if ``k`` guessed tokens were right, the step produced ``k + 1``
tokens. Chapter 13 builds it in three pieces, one file each (its settings, ``SpeculativeConfig``, sit with
every other knob in ``minfer/config.py``):

* ``ngram.py`` -- prompt lookup: guesses copied from earlier in the request's own text (no model);
* ``early_exit.py`` -- self-speculation: the model's first layers as its own draft, sharing its KV cache;
* ``verify.py`` -- which guesses to keep: exactly greedy's tokens, or rejection sampling for the target's
  distribution.

The rest lives where each layer's job is. The scheduler reserves ``k`` *lookahead* slots after each decode's
token (``ScheduledChunk.lookahead``: from free blocks and the step's leftover budget only; guesses never preempt
anyone). The runner asks the proposer for guesses, runs them with the rest of the batch in its one forward pass,
and verifies them (``ModelOutput.accepted``). The scheduler's ``update`` then keeps the accepted tokens' K/V and
rolls the rejected slots back before any block is hashed, so a wrong guess never reaches the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from minfer.config import SPECULATIVE_METHODS, SpeculativeConfig
from minfer.plan import ScheduledChunk
from minfer.spec.ngram import propose_ngram

if TYPE_CHECKING:
    from minfer.kv.cache import PagedKVCache
    from minfer.model.llama import LlamaModel
    from minfer.spec.early_exit import Prepare

__all__ = ["PROPOSERS", "SPECULATIVE_METHODS", "NgramProposer", "Proposer", "SpeculativeConfig", "make_proposer",
           "propose_ngram"]


class Proposer(Protocol):
    def propose(self, chunks: list[ScheduledChunk]) -> dict[str, list[int]]:
        """Guesses for each decode in ``chunks`` (request id → at most ``chunk.lookahead`` tokens; fewer, or none,
        when it has no good guess)."""
        ...


class NgramProposer:
    """Prompt lookup for every speculating request: a search in its own tokens, no model."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, chunks: list[ScheduledChunk]) -> dict[str, list[int]]:
        return {c.request.request_id: propose_ngram(c.request.all_token_ids(), c.lookahead, self.min_n, self.max_n)
                for c in chunks}


def _early_exit(config: SpeculativeConfig, model: LlamaModel, kv_cache: PagedKVCache, prepare: Prepare) -> Proposer:
    from minfer.spec.early_exit import EarlyExitProposer

    return EarlyExitProposer(model, kv_cache, prepare, config.draft_layers(len(model.layers)))


# method → (config, the model as the engine runs it, its KV cache, the runner's batch builder) → proposer
PROPOSERS: dict[str, Callable[[SpeculativeConfig, LlamaModel, PagedKVCache, Prepare], Proposer]] = {
    "ngram": lambda config, model, kv_cache, prepare: NgramProposer(config),
    "early_exit": _early_exit,
}


def make_proposer(config: SpeculativeConfig, model: LlamaModel, kv_cache: PagedKVCache, prepare: Prepare) -> Proposer:
    """The proposer ``config.method`` names, for ``model`` and its KV cache."""
    return PROPOSERS[config.method](config, model, kv_cache, prepare)
