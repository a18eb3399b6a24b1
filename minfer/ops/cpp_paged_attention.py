"""Paged attention on the CPU with compiled kernels (``attention_backend="cpp"``).

Why a kernel at all on the CPU: a decode step is bound by memory traffic. The reference gathers each
request's K and V out of their scattered blocks into a padded copy, and SDPA then reads that copy: the
cache is crossed three times. ``csrc/paged_attention_cpu.cpp`` walks the block tables instead and reads
every key and value once, where it lies -- what the Triton kernel does on a GPU (chapter 07).

Prefill chunks are the other case: a chunk has hundreds of queries per request, so its attention is two matrix
products per head, bound by arithmetic. The same file computes them on the register tile of minfer's own products
(``csrc/panel_tile.h``), about three times as fast as SDPA on this model's small heads (measured in the
README's benchmark); float32 only -- other dtypes' chunks go through the reference, whose bfloat16 SDPA beat
this kernel fed with a widening copy of the keys and values (0.46 against 0.63 s of prompts' attention in a run on a
Xeon with AMX).

New keys and values go into the cache by the same module (``cpp_store_kv``): one call per layer for both.

The kernels are compiled on first use (about 30 s, once per machine: ``cpp_build.py``; it needs a C++ compiler).
They are the CPU's default (``attention_backend="auto"``) wherever they build.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from minfer.ops.attention import AttentionMetadata
from minfer.ops.cpp_build import have_compiler, load_extension
from minfer.ops.paged_attention import attend, step_groups

SOURCE = Path(__file__).with_name("csrc") / "paged_attention_cpu.cpp"
NAME = "minfer_paged_attention_cpu"

__all__ = ["SOURCE", "cpp_paged_attention", "cpp_store_kv", "have_compiler", "kernel"]


@functools.cache
def kernel() -> ModuleType:
    """The compiled extension module (built once per machine and PyTorch version, then loaded)."""
    return load_extension(NAME, SOURCE, "the CPU paged-attention kernel",
                          instead="attention_backend='torch' runs the same attention without compiling")


def cpp_store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Same contract as the reference ``store_kv``, in one call: the reference's two ``index_copy_`` calls cost more
    to dispatch than their copy at a decode step (16 us a layer measured alone, up to 40 in a running engine: about
    1 ms of a step for this model's 30 layers, against 2 us a layer here)."""
    kernel().store_kv(k, v, k_cache, v_cache, slot_mapping)


def cpp_paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Same contract as the reference ``paged_attention``: decodes, then prefill chunks, by the kernels."""
    out = torch.empty_like(q)
    nd, scale = meta.num_decodes, q.shape[-1] ** -0.5  # the runner puts the one-token requests first
    if nd:
        kernel().decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
                                  out[:nd])
    if nd == len(meta.seq_lens):
        return out
    if q.dtype == torch.float32:
        kernel().prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, nd,
                                   scale, out)
    else:
        attend(q, k_cache, v_cache, step_groups(meta, k_cache.shape[1], q.device, decodes=False), out)
    return out
