"""Paged attention in plain PyTorch: the readable reference every kernel is tested against.

The KV cache of one layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``. A request's keys live
in the blocks its *block table* lists, in order: token ``i`` of a request sits in block
``table[i // block_size]`` at offset ``i % block_size``, i.e. in *slot* ``block * block_size + offset``.

One step's tokens are flattened and grouped by request (``query_start_loc``); the runner puts requests
that decode (one new token) first, longest context first, then prefill chunks. Each query attends causally to its own
request's tokens: the ``seq_len - query_len`` already cached plus the new ones up to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from minfer.ops.attention import AttentionMetadata
from minfer.units import ceil_div


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
    tables = block_tables[:, : ceil_div(length, block_size)]  # the blocks that hold the first `length` tokens
    out = scratch(slot, tables.numel() * block_size * heads * dim, cache)
    torch.index_select(cache.view(num_blocks, -1), 0, tables.flatten(), out=out.view(tables.numel(), -1))
    return out.view(len(tables), -1, heads, dim)[:, :length].transpose(1, 2)


def decode_buckets(seq_lens: list[int]) -> list[tuple[int, int]]:
    """Split the decodes (sorted longest first by the runner) into runs whose lengths are within 2x of the
    run's longest. Each run is gathered padded to its own longest: with mixed lengths, one padded batch would
    copy mostly padding."""
    buckets, start = [], 0
    while start < len(seq_lens):
        end = start + 1
        while end < len(seq_lens) and 2 * seq_lens[end] > seq_lens[start]:
            end += 1
        buckets.append((start, end))
        start = end
    return buckets


@dataclass(slots=True)
class Group:
    """Requests attended together: a bucket of decodes, or one prefill chunk."""

    rows: slice  # their query rows in the flat batch
    block_tables: Tensor  # their block tables, cut to the blocks ``length`` tokens need
    length: int  # keys to gather per request (the longest of the group)
    # [requests, queries, length]: which gathered keys each query may see; None for a whole prompt in one chunk,
    # which is plain causal attention (SDPA's is_causal skips the hidden half instead of reading a mask)
    visible: Tensor | None
    decode: bool


def attention_groups(meta: AttentionMetadata, block_size: int, device: torch.device,
                     decodes: bool = True) -> list[Group]:
    """The step's groups (without the decodes if ``decodes`` is false: a kernel serves those)."""
    starts, seq_lens, nd = meta.query_start_loc.tolist(), meta.seq_lens.tolist(), meta.num_decodes
    groups = []
    # decodes: each query is the newest token, it sees everything
    for a, b in decode_buckets(seq_lens[:nd]) if decodes else ():
        length = max(seq_lens[a:b])
        visible = torch.arange(length, device=device)[None, :] < meta.seq_lens[a:b, None]  # mask the padding
        tables = meta.block_tables[a:b, : ceil_div(length, block_size)]
        groups.append(Group(slice(a, b), tables, length, visible[:, None], decode=True))
    for i in range(nd, len(seq_lens)):  # prefill chunks: a few per step, each a causal block
        s, e, length = starts[i], starts[i + 1], seq_lens[i]
        tables = meta.block_tables[i : i + 1, : ceil_div(length, block_size)]
        sees: Tensor | None = None  # a whole prompt in one chunk: plain causal attention
        if length > e - s:  # a later chunk: its queries also see every token cached before it
            pos = torch.arange(length - (e - s), length, device=device)  # the chunk's positions
            sees = (torch.arange(length, device=device)[None, :] <= pos[:, None])[None]
        groups.append(Group(slice(s, e), tables, length, sees, decode=False))
    return groups


def step_groups(meta: AttentionMetadata, block_size: int, device: torch.device, decodes: bool = True) -> list[Group]:
    """The same for every layer of a step: computed at the first layer, kept in ``meta.memo``."""
    key = "groups" if decodes else "prefill groups"
    if key not in meta.memo:
        meta.memo[key] = attention_groups(meta, block_size, device, decodes)
    return meta.memo[key]


def attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, groups: list[Group], out: Tensor) -> None:
    """Write the attention output of every group's query rows into ``out``."""
    for g in groups:
        keys = gather_kv(k_cache, g.block_tables, g.length, slot=0)
        values = gather_kv(v_cache, g.block_tables, g.length, slot=1)
        # queries as [requests, heads, queries, dim]: a decode group has one query per request,
        # a prefill chunk is one request with many queries
        queries = q[g.rows, :, None] if g.decode else q[g.rows].transpose(0, 1)[None]
        mask = None if g.visible is None else g.visible[:, None]
        o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=True)
        out[g.rows] = o[:, :, 0] if g.decode else o[0].transpose(0, 1)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Attention output ``[T, Hq, D]`` for the flat batch ``q`` (``[T, Hq, D]``), keys read via block tables."""
    out = torch.empty_like(q)
    attend(q, k_cache, v_cache, step_groups(meta, k_cache.shape[1], q.device), out)
    return out
