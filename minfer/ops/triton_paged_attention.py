"""Paged attention as one Triton kernel, for decode tokens and prefill chunks alike.

The PyTorch reference (``paged_attention.paged_attention``) is easy to read but wasteful: it *gathers* a
padded copy of every request's keys and values out of the block-laid cache, builds boolean masks in
memory, and loops in Python over prefill chunks. This kernel reads each key and value straight from its
cache block, once, and never materializes scores, masks or copies.

**One program** computes the attention output of a tile of ``BLOCK_Q`` query tokens of one request, for
all the query heads that share one K/V head (grouped-query attention). Its rows are (token, head) pairs,
so each K/V tile loaded from memory serves the whole query group. It walks over the request's keys
``BLOCK_N`` at a time, looking up each key's cache block in the request's block table, and keeps a
running (*online*) softmax: a running maximum ``m_i``, a running sum ``l_i`` and a running weighted sum of
values ``acc``, rescaled whenever the maximum grows -- the FlashAttention recurrence.

**One kernel, two launches.** Decode requests (one query token each, at the front of the batch) and
prefill chunks run the same code with different tile shapes: decodes with ``BLOCK_Q = 1`` (a prefill-sized
tile would be mostly empty rows), chunks with ``BLOCK_Q`` tokens per program. The decode launch's grid
depends only on the number of decode requests, and the kernel reads every length from device memory,
so a decode step makes no host sync and can be captured in a CUDA graph.

Causality inside a chunk: query ``i`` of a chunk sits at position ``context + i`` (``context`` = tokens
cached before the chunk) and sees keys ``0 .. context + i``. A chunk may start mid-block and the last
block may be partly filled: the kernel masks by position, so neither needs special code.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from minfer.ops.attention import AttentionMetadata

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the GPU's native instruction


@triton.jit(do_not_specialize=["first_request"])  # one compiled kernel whatever the number of decodes
def paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale,  # softmax scale times log2(e)
    first_request,  # program_id(0) = 0 is request `first_request` of the batch
    stride_qt, stride_qh, stride_ot, stride_oh,  # q, out: [T, Hq, D]
    stride_cb, stride_ct, stride_ch,  # caches: [num_blocks, block_size, Hkv, D]
    stride_bt,  # block_tables: [B, max_blocks]
    head_dim,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    GROUP: tl.constexpr,  # query heads per K/V head (the GQA ratio)
    GROUP_P2: tl.constexpr,  # GROUP rounded up to a power of two
    HEAD_DIM_P2: tl.constexpr,  # head_dim rounded up to a power of two (>= 16)
    BLOCK_Q: tl.constexpr,  # query tokens per program
    ROWS: tl.constexpr,  # max(16, BLOCK_Q * GROUP_P2): tl.dot wants at least 16 rows
    BLOCK_N: tl.constexpr,  # keys per step of the inner loop
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (else the GPU would round them to tf32)
):
    req = first_request + tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    # -- this request's chunk: where its queries are, how long its context is ------------------------
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = (tl.load(query_start_loc_ptr + req + 1) - q_start).to(tl.int32)
    context = tl.load(seq_lens_ptr + req).to(tl.int32) - q_len  # keys cached before this chunk
    first_q = q_tile * BLOCK_Q
    if first_q >= q_len:  # the grid is sized for the longest chunk; shorter ones have idle tiles
        return

    # -- rows = (query token, query head of this K/V head's group) ----------------------------------
    rows = tl.arange(0, ROWS)
    tok = first_q + rows // GROUP_P2
    head = kv_head * GROUP + rows % GROUP_P2
    row_ok = (rows < BLOCK_Q * GROUP_P2) & (rows % GROUP_P2 < GROUP) & (tok < q_len)
    d = tl.arange(0, HEAD_DIM_P2)
    d_ok = d < head_dim  # head_dim need not be a power of two: pad with zeros, mask the store
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=q_mask, other=0.0)
    q_pos = context + tok  # each query's position: it sees keys at positions 0 .. q_pos

    # -- online softmax over the keys, BLOCK_N at a time -------------------------------------------
    m_i = tl.full([ROWS], -1.0e30, tl.float32)  # running max (finite: -inf - -inf would be NaN)
    l_i = tl.zeros([ROWS], tl.float32)  # running sum of exp
    acc = tl.zeros([ROWS, HEAD_DIM_P2], tl.float32)  # running sum of exp * value
    kv_end = context + tl.minimum(first_q + BLOCK_Q, q_len)  # the tile's last query sees keys < kv_end
    table = block_tables_ptr + req.to(tl.int64) * stride_bt
    n = tl.arange(0, BLOCK_N)
    # BEGIN EXERCISE E7.1
    for start in range(0, kv_end, BLOCK_N):
        k_pos = start + n
        k_ok = k_pos < kv_end
        # paging: key position -> (block from the block table, offset inside the block)
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [ROWS, BLOCK_N], log2 units
        s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))  # causal
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old maximum
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    # END EXERCISE

    # -- normalize, and store the valid rows in the output's dtype -----------------------------------
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i == 0 only for a padding row that sees no key
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def launch_constants(block_size: int, group: int, head_dim: int, decode: bool, dtype: torch.dtype) -> dict:
    """The compile-time constants (and warps) of one launch -- one compiled variant of the kernel each.
    Decodes get one query token per program, prefill chunks 64 rows (16 tokens at GQA 3 or 4)."""
    group_p2 = triton.next_power_of_2(group)
    block_q = 1 if decode else max(1, 64 // group_p2)
    return dict(
        BLOCK_SIZE=block_size, GROUP=group, GROUP_P2=group_p2, HEAD_DIM_P2=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_Q=block_q, ROWS=max(16, block_q * group_p2), BLOCK_N=64,
        DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",  # the default; moot for 16 bits
        num_warps=4 if decode else 8,  # 8 warps hold a 64-row tile in registers (sm_90: no spills)
    )


def triton_paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Same contract as ``paged_attention.paged_attention``: ``[T, Hq, D]`` out for the flat batch ``q``.

    Launches the kernel once for the decode requests (``BLOCK_Q = 1``) and once for the prefill chunks.
    Reads only shapes and the host-side ints of ``meta`` -- never a device value -- so it is graph-safe.
    """
    num_heads, head_dim = q.shape[1:]
    _, block_size, num_kv_heads, _ = k_cache.shape
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share one layout with a contiguous last dimension")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    num_requests = meta.seq_lens.shape[0]

    def launch(first: int, count: int, decode: bool, max_query_len: int) -> None:
        constants = launch_constants(block_size, group, head_dim, decode, q.dtype)
        grid = (count, triton.cdiv(max_query_len, constants["BLOCK_Q"]), num_kv_heads)
        paged_attention_kernel[grid](
            out, q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
            LOG2E / math.sqrt(head_dim), first,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
            head_dim, **constants,
        )

    if meta.num_decodes:  # one query token each: one program per (request, K/V head)
        launch(0, meta.num_decodes, True, 1)
    if num_requests > meta.num_decodes:  # prefill chunks: 64 rows per program (16 tokens at GQA 3 or 4)
        launch(meta.num_decodes, num_requests - meta.num_decodes, False, meta.max_query_len)
    return out


__all__ = ["launch_constants", "paged_attention_kernel", "triton_paged_attention"]
