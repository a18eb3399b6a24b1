"""ModelRunner: one SchedulerOutput in, one sampled token per finishing chunk out.

It flattens the step's chunks into the tensors the model and the paged KV cache need:

* ``input_ids``, ``positions``: every new token of every scheduled request, one flat list;
* ``slot_mapping``: where each new token's K/V goes (``block_table[pos // B] * B + pos % B``);
* ``block_tables``, ``seq_lens``, ``query_start_loc``: what each request's queries may read.

Requests with one new token go first (decodes; the attention reference batches them, longest first),
then prefill chunks. The model runs once; logits are computed only for the last token of chunks that reach the
end of their request -- a mid-prompt chunk samples nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from minfer.kv.block_pool import BlockPool
from minfer.kv.cache import PagedKVCache
from minfer.model.llama import LlamaModel
from minfer.ops.paged_attention import AttentionMetadata
from minfer.sampler import sample
from minfer.scheduler.scheduler import ScheduledChunk, SchedulerOutput


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, pool: BlockPool, seed: int = 0) -> None:
        self.model, self.kv_cache, self.pool = model, kv_cache, pool
        self.device = model.device
        self.generator = torch.Generator().manual_seed(seed)
        # forward(input_ids, positions, meta) -> hidden; the CUDA path swaps in a graph-replaying version
        self.forward: Callable[[Tensor, Tensor, AttentionMetadata], Tensor] = self.eager_forward

    def eager_forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata) -> Tensor:
        return self.model(input_ids, positions, self.kv_cache.attention(meta))

    def prepare(self, chunks: list[ScheduledChunk]) -> tuple[Tensor, Tensor, AttentionMetadata]:
        """Flat token ids and positions, and the attention metadata, for ``chunks`` in the given order."""
        bs = self.pool.block_size
        tables = [self.pool.tables[c.request.request_id] for c in chunks]
        query_lens = np.fromiter((c.num_tokens for c in chunks), dtype=np.int64, count=len(chunks))
        starts = np.fromiter((c.start for c in chunks), dtype=np.int64, count=len(chunks))
        query_start_loc = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        seq_lens = starts + query_lens
        # each token's position: its chunk's start plus its offset inside the chunk
        owner = np.repeat(np.arange(len(chunks)), query_lens)
        positions = starts[owner] + np.arange(int(query_start_loc[-1])) - query_start_loc[owner]
        block_tables = np.zeros((len(chunks), max(map(len, tables))), dtype=np.int64)
        for i, t in enumerate(tables):
            block_tables[i, : len(t)] = t
        slot_mapping = block_tables[owner, positions // bs] * bs + positions % bs
        ids = [t for c in chunks for t in c.request.token_ids(c.start, c.start + c.num_tokens)]

        def to(x: np.ndarray | list, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.as_tensor(x, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=to(slot_mapping), query_start_loc=to(query_start_loc), seq_lens=to(seq_lens),
            block_tables=to(block_tables, torch.int32),
            num_decodes=int((query_lens == 1).sum()),  # the one-token chunks, all at the front
            max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
        )
        return to(ids), to(positions), meta

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, int], float | None]:
        """Run the step; returns the sampled token per request id (and ``None``: time it by the wall clock)."""
        if self.device.type == "cuda":  # Triton launches on the *current* device: make it this engine's
            with torch.cuda.device(self.device):
                return self._execute(out)
        return self._execute(out)

    def _execute(self, out: SchedulerOutput) -> tuple[dict[str, int], float | None]:
        # one-token chunks (decodes) first, longest context first: the reference attention batches them
        chunks = sorted(out.chunks, key=lambda c: (c.num_tokens > 1, -c.start))
        input_ids, positions, meta = self.prepare(chunks)
        hidden = self.forward(input_ids, positions, meta)
        rows = [i for i, c in enumerate(chunks) if c.samples]
        if not rows:
            return {}, None
        last = meta.query_start_loc[1:][torch.tensor(rows, device=self.device)] - 1
        logits = self.model.compute_logits(hidden[last])
        reqs = [chunks[i].request for i in rows]
        tokens = sample(logits, [r.params for r in reqs], [r.generator for r in reqs], self.generator)
        return {r.request_id: t for r, t in zip(reqs, tokens)}, None
