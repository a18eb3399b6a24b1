"""Paged attention in plain PyTorch: the readable reference every kernel is tested against.

The KV cache of one layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``. A request's keys live
in the blocks its *block table* lists, in order: token ``i`` of a request sits in block
``table[i // block_size]`` at offset ``i % block_size``, i.e. in *slot* ``block * block_size + offset``.

One step's tokens are flattened and grouped by request (``query_start_loc``); the runner puts requests
that decode (one new token) first, then prefill chunks. Each query attends causally to its own
request's tokens: the ``seq_len - query_len`` already cached plus the new ones up to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(slots=True)
class AttentionMetadata:
    """Where one step's tokens come from and where their keys go; built by the ModelRunner."""

    slot_mapping: Tensor  # [T] cache slot of each new token
    query_start_loc: Tensor  # [B+1] offsets of each request's tokens in the flat batch
    seq_lens: Tensor  # [B] tokens of each request in the cache after this step (context + new)
    block_tables: Tensor  # [B, max_blocks] int32, padded with 0 (padding is masked by seq_lens)
    num_decodes: int  # the first num_decodes requests have exactly one new token
    max_query_len: int
    max_seq_len: int


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write each new token's key and value into its slot of the block-laid cache."""
    num_kv_heads, head_dim = k.shape[1:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


_scratch: dict[tuple, Tensor] = {}


def scratch(slot: int, numel: int, like: Tensor) -> Tensor:
    """A reusable buffer of ``numel`` elements. Gathering K/V into fresh memory every layer costs more
    than the copy itself (the OS must hand out and zero new pages), so gathers reuse these buffers."""
    key = (slot, like.dtype, like.device, torch.is_inference_mode_enabled())  # inference tensors stay inside
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = _scratch[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def gather_kv(cache: Tensor, block_tables: Tensor, length: int, slot: int = 0) -> Tensor:
    """``[B, Hkv, length, D]``: each request's first ``length`` cached tokens, read through its block table
    (a copy: the blocks of one request lie anywhere in the pool)."""
    num_blocks, block_size, heads, dim = cache.shape
    tables = block_tables[:, : -(-length // block_size)]
    out = scratch(slot, tables.numel() * block_size * heads * dim, cache)
    torch.index_select(cache.view(num_blocks, -1), 0, tables.flatten(), out=out.view(tables.numel(), -1))
    return out.view(len(tables), -1, heads, dim)[:, :length].transpose(1, 2)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Attention output ``[T, Hq, D]`` for the flat batch ``q`` (``[T, Hq, D]``), keys read via block tables."""
    out = torch.empty_like(q)
    nd = meta.num_decodes
    if nd:  # all decodes in one batched call: each query is the newest token, so it sees its whole context
        lens = meta.seq_lens[:nd]
        length = int(lens.max())
        keys = gather_kv(k_cache, meta.block_tables[:nd], length, slot=0)
        values = gather_kv(v_cache, meta.block_tables[:nd], length, slot=1)
        visible = torch.arange(length, device=q.device)[None, :] < lens[:, None]  # mask the padding
        o = F.scaled_dot_product_attention(q[:nd, :, None], keys, values, attn_mask=visible[:, None, None],
                                           enable_gqa=True)
        out[:nd] = o[:, :, 0]
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    for i in range(nd, len(seq_lens)):  # prefill chunks: a few per step, each a causal block
        s, e, length = starts[i], starts[i + 1], seq_lens[i]
        keys = gather_kv(k_cache, meta.block_tables[i : i + 1], length, slot=0)
        values = gather_kv(v_cache, meta.block_tables[i : i + 1], length, slot=1)
        pos = torch.arange(length - (e - s), length, device=q.device)  # the chunk's positions
        visible = torch.arange(length, device=q.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1)[None], keys, values,
                                           attn_mask=visible[None, None], enable_gqa=True)
        out[s:e] = o[0].transpose(0, 1)
    return out
