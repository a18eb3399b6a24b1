"""``store_kv`` as a Triton kernel: copy each new token's K and V into its slot of the paged cache.

The reference (``paged_attention.store_kv``) is one ``index_copy_`` per tensor. This kernel does the same
copy with one program per token, and adds one rule the engine's CUDA-graph path needs: a **negative slot
writes nothing**. A captured decode graph has a fixed batch size, so a smaller batch is padded with dummy
rows; their slot is ``-1`` and their K/V go nowhere -- no block of the pool is touched.

Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``; slot ``s`` is block
``s // block_size``, offset ``s % block_size``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,  # new keys/values: [T, Hkv, D]
    stride_cb, stride_ct, stride_ch,  # cache: [num_blocks, block_size, Hkv, D] (same for K and V)
    num_kv_heads, head_dim,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEADS_P2: tl.constexpr, HEAD_DIM_P2: tl.constexpr,  # tile sizes: powers of two, masked down
):
    t = tl.program_id(0)  # one program per new token: it copies all heads of K and of V
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)  # int64: block * stride may pass 2**31
    if slot < 0:  # a padding row of a CUDA graph: write nothing
        return
    h = tl.arange(0, HEADS_P2)[:, None]
    d = tl.arange(0, HEAD_DIM_P2)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)  # the tile is rounded up to powers of two
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + h * stride_ch + d
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def launch_constants(block_size: int, num_kv_heads: int, head_dim: int) -> dict:
    """The compile-time constants (and warps) of a launch: tiles rounded up to powers of two."""
    return dict(BLOCK_SIZE=block_size, HEADS_P2=triton.next_power_of_2(num_kv_heads),
                HEAD_DIM_P2=triton.next_power_of_2(head_dim),
                num_warps=1)  # a few hundred bytes per token: one warp is plenty


def triton_store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Same contract as ``paged_attention.store_kv``, plus: a slot ``< 0`` is skipped."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share one layout with a contiguous last dimension")
    store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_kv_heads, head_dim, **launch_constants(k_cache.shape[1], num_kv_heads, head_dim),
    )


__all__ = ["launch_constants", "store_kv_kernel", "triton_store_kv"]
