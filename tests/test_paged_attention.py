"""Paged attention (through block tables) equals plain causal attention over each request's tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minfer.config import parse_bytes
from minfer.kv.cache import bytes_per_block, num_blocks_for_memory
from minfer.model.loader import tiny_random_config
from minfer.ops.paged_attention import AttentionMetadata, paged_attention, store_kv
from minfer.units import ceil_div


def make_case(gen: torch.Generator, requests: list[tuple[int, int]], block_size: int, kv_heads: int, gqa: int,
              head_dim: int = 16):
    """``requests``: (tokens already cached, new tokens) each. Writes every request's K/V into a shuffled
    block pool the way the engine would, and returns the flat queries, caches, metadata and, per request,
    its full K/V and queries for the reference."""
    num_blocks = sum(ceil_div(c + n, block_size) for c, n in requests) + 3
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()  # blocks scattered across the pool
    order = sorted(range(len(requests)), key=lambda i: requests[i][1] > 1)  # one-token requests first
    tables, qs, slots, refs = [], [], [], []
    for i in order:
        cached, new = requests[i]
        total = cached + new
        table = [free.pop() for _ in range(ceil_div(total, block_size))]
        k = torch.randn(total, kv_heads, head_dim, generator=gen)
        v = torch.randn(total, kv_heads, head_dim, generator=gen)
        q = torch.randn(new, kv_heads * gqa, head_dim, generator=gen)
        pos = torch.arange(total)
        slot = torch.tensor(table)[pos // block_size] * block_size + pos % block_size
        store_kv(k[:cached], v[:cached], k_cache, v_cache, slot[:cached])  # the earlier steps
        tables.append(table)
        qs.append(q)
        slots.append(slot[cached:])
        refs.append((k, v, q, cached))
        del k, v
    width = max(map(len, tables))
    new_lens = [requests[i][1] for i in order]
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.tensor([0] + torch.tensor(new_lens).cumsum(0).tolist()),
        seq_lens=torch.tensor([sum(requests[i]) for i in order]),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        num_decodes=sum(n == 1 for n in new_lens), max_query_len=max(new_lens),
        max_seq_len=max(sum(r) for r in requests),
    )
    return torch.cat(qs), k_cache, v_cache, meta, refs


def reference(refs) -> torch.Tensor:
    """Causal attention per request over its contiguous K/V, no paging at all."""
    outs = []
    for k, v, q, cached in refs:
        total = k.shape[0]
        pos = torch.arange(cached, total)
        visible = torch.arange(total)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           attn_mask=visible, enable_gqa=True)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 40)), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16, 32]),
    gqa=st.sampled_from([1, 3]),
    kv_heads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_paged_equals_contiguous(requests, block_size, gqa, kv_heads, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k_cache, v_cache, meta, refs = make_case(gen, requests, block_size, kv_heads, gqa)
    # the new tokens' K/V are stored by the backend before attending, as in the model's layers
    k_new = torch.cat([k[c:] for k, _, _, c in refs])
    v_new = torch.cat([v[c:] for _, v, _, c in refs])
    store_kv(k_new, v_new, k_cache, v_cache, meta.slot_mapping)
    torch.testing.assert_close(paged_attention(q, k_cache, v_cache, meta), reference(refs), atol=1e-5, rtol=1e-5)


def test_mixed_decode_and_mid_block_prefill_chunks():
    """Decodes with partial last blocks beside prefill chunks that start mid-block (cached 5 of block 16)."""
    gen = torch.Generator().manual_seed(0)
    requests = [(30, 1), (5, 23), (0, 17), (16, 1), (47, 9)]
    q, k_cache, v_cache, meta, refs = make_case(gen, requests, 16, 2, 3)
    store_kv(torch.cat([k[c:] for k, _, _, c in refs]), torch.cat([v[c:] for _, v, _, c in refs]),
             k_cache, v_cache, meta.slot_mapping)
    assert meta.num_decodes == 2
    torch.testing.assert_close(paged_attention(q, k_cache, v_cache, meta), reference(refs), atol=1e-5, rtol=1e-5)


def test_kv_block_sizing():
    cfg = tiny_random_config()
    per_block = bytes_per_block(cfg, 16, torch.float32)
    assert per_block == 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    assert num_blocks_for_memory(cfg, 16, torch.float32, 10 * per_block + 1) == 10
    assert bytes_per_block(cfg, 16, torch.bfloat16) == per_block // 2


@pytest.mark.parametrize("text,expected", [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5 GiB", int(1.5 * 2**30)),
                                           ("1000", 1000), (4096, 4096)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_rejects_nonsense():
    with pytest.raises(ValueError, match="kv_cache_memory"):
        parse_bytes("lots")
