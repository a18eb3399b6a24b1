"""Self-speculation by early exit (LayerSkip's idea): the draft model is the target's own first layers.

A draft model must be much cheaper than the target and agree with it often. The course has one offline model,
so its draft is a part of it: the first ``n`` decoder layers, then the model's final norm and LM head, as if the
network ended there. No second set of weights, and -- the point of this design -- no second KV cache: the draft's
layer ``l`` *is* the target's layer ``l``, fed the same tokens at the same positions, so the K/V it needs for the
text so far are already in the target's cache, and the K/V it writes for its own guesses land in the very slots
the verification pass then overwrites (the scheduler reserved them: its lookahead slots). Nothing to copy, nothing
to free.

Drafting is sequential: guess ``j + 1`` needs guess ``j`` as input, so ``k`` guesses are ``k`` small forward passes
(one token per speculating request, through ``n`` layers and the LM head). That is the cost speculation must earn
back: with SmolLM2's 49k-word LM head, a quarter of the layers plus the head is about a third of a full decode
step, per guess. LayerSkip trains its models so that early layers predict well; an off-the-shelf model's early
exit guesses poorly, and chapter 13 measures by how much.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from minfer.executor import Query
from minfer.ops.attention import AttentionMetadata
from minfer.plan import ScheduledChunk

if TYPE_CHECKING:
    from minfer.kv.cache import PagedKVCache
    from minfer.model.llama import LlamaModel
    from minfer.ops.attention import Attention

# the runner's batch builder: queries (the first num_decodes one-token decodes) → input ids, positions, metadata
Prepare = Callable[..., tuple[Tensor, Tensor, AttentionMetadata]]


@torch.inference_mode()
def early_exit_forward(model: LlamaModel, num_layers: int, input_ids: Tensor, positions: Tensor,
                       attention: Attention) -> Tensor:
    """``LlamaModel.forward`` stopped after its first ``num_layers`` layers: final hidden states ``[T, hidden]``."""
    x = model.embed_tokens(input_ids)
    cos, sin = model.rotary(positions, x.dtype)
    for layer in model.layers[:num_layers]:
        x = layer(x, cos, sin, attention)
    return model.norm(x)


class EarlyExitProposer:
    """Guesses from the first ``num_layers`` layers of the engine's own model, greedily, through its KV cache."""

    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, prepare: Prepare, num_layers: int) -> None:
        total = len(model.layers)
        if not 1 <= num_layers < total:
            raise ValueError(f"num_draft_layers must be in [1, {total - 1}] for this {total}-layer model, "
                             f"got {num_layers}")
        self.model, self.kv_cache, self.prepare, self.num_layers = model, kv_cache, prepare, num_layers

    def propose(self, chunks: list[ScheduledChunk]) -> dict[str, list[int]]:
        """``chunk.lookahead`` guesses for each decode in ``chunks``: one draft forward pass per guess, all requests
        together, each feeding its previous guess back in."""
        guesses: dict[str, list[int]] = {c.request.request_id: [] for c in chunks}
        last = [c.request.token_ids(c.start, c.start + 1)[0] for c in chunks]
        for j in range(max(c.lookahead for c in chunks)):
            active = [i for i, c in enumerate(chunks) if c.lookahead > j]
            queries = [Query([last[i]], chunks[i].start + j, chunks[i].block_table) for i in active]
            input_ids, positions, meta = self.prepare(queries, len(queries))
            attention = self.kv_cache.attention(meta)
            hidden = early_exit_forward(self.model, self.num_layers, input_ids, positions, attention)
            best = self.model.compute_logits(hidden).argmax(dim=-1).tolist()
            for i, token in zip(active, best):
                guesses[chunks[i].request.request_id].append(token)
                last[i] = token
        return guesses
