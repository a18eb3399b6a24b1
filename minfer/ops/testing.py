"""Random paged batches for checking an attention kernel against the reference.

A batch here is what one engine step hands the attention ops: some requests decoding one token, some
ingesting a prefill chunk on top of what they already cached. Blocks are drawn in random order from the
pool, so a kernel that ignored the block table (or read a neighbour's block) would give wrong answers,
and the cache is filled with random numbers everywhere, so reading a wrong slot cannot go unnoticed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from minfer.ops.attention import AttentionMetadata
from minfer.ops.paged_attention import store_kv
from minfer.units import ceil_div


@dataclass(slots=True)
class PagedBatch:
    q: Tensor  # [T, Hq, D] the step's queries
    k: Tensor  # [T, Hkv, D] the step's new keys (to store)
    v: Tensor  # [T, Hkv, D]
    k_cache: Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: Tensor
    meta: AttentionMetadata


def random_paged_batch(chunks: list[tuple[int, int]], *, block_size: int = 16, num_kv_heads: int = 2,
                       group: int = 3, head_dim: int = 64, spare_blocks: int = 3, seed: int = 0,
                       dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> PagedBatch:
    """A batch of ``chunks``, each ``(context_len, query_len)``: ``query_len`` new tokens on top of
    ``context_len`` cached ones. One-token chunks go first, as the ModelRunner orders them."""
    chunks = sorted(chunks, key=lambda c: c[1] > 1)  # stable: decodes first
    if any(c < 0 or n < 1 for c, n in chunks):
        raise ValueError("each chunk needs context_len >= 0 and query_len >= 1")
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in chunks]
    need = [ceil_div(s, block_size) for s in seq_lens]
    num_blocks = sum(need) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks, as in a busy pool
    tables, used = [], 0
    for n in need:
        tables.append(order[used : used + n])
        used += n
    block_tables = torch.zeros(len(chunks), max(need), dtype=torch.int32)  # padded with 0, like the runner's
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (c, n) in enumerate(chunks) for p in range(c, c + n)]
    query_lens = torch.tensor([n for _, n in chunks])
    query_start_loc = torch.zeros(len(chunks) + 1, dtype=torch.long)
    query_start_loc[1:] = query_lens.cumsum(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    num_tokens = len(slots)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device), query_start_loc=query_start_loc.to(device),
        seq_lens=torch.tensor(seq_lens, device=device), block_tables=block_tables.to(device),
        num_decodes=sum(n == 1 for _, n in chunks), max_query_len=max(n for _, n in chunks),
        max_seq_len=max(seq_lens),
    )
    return PagedBatch(q=randn(num_tokens, num_kv_heads * group, head_dim),
                      k=randn(num_tokens, num_kv_heads, head_dim), v=randn(num_tokens, num_kv_heads, head_dim),
                      k_cache=randn(num_blocks, block_size, num_kv_heads, head_dim),
                      v_cache=randn(num_blocks, block_size, num_kv_heads, head_dim), meta=meta)


def random_chunks(rng: random.Random, block_size: int) -> list[tuple[int, int]]:
    """(context_len, query_len) of a mixed step: decodes, a fresh prompt, and chunks starting mid-block."""
    decodes = [(rng.randrange(0, 3 * block_size), 1) for _ in range(rng.randint(1, 4))]
    fresh = [(0, rng.randrange(2, 2 * block_size + 7))]
    mid_block = [(rng.randrange(1, 3 * block_size) | 1, rng.randrange(2, block_size + 9)) for _ in range(2)]
    return decodes + fresh + mid_block


def random_mixed_step(seed: str, block_size: int, group: int, head_dim: int,
                      num_kv_heads: int = 2) -> tuple[PagedBatch, list[tuple[int, int]]]:
    """A random mixed step (``random_chunks``) with its own new keys already stored -- as the engine calls
    attention, after ``store_kv`` -- and its chunks, for error messages. ``seed`` names the case."""
    rng = random.Random(seed)
    chunks = random_chunks(rng, block_size)
    b = random_paged_batch(chunks, block_size=block_size, num_kv_heads=num_kv_heads, group=group,
                           head_dim=head_dim, seed=rng.randrange(10**6))
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)  # the step's own keys are visible too
    return b, chunks
