"""The paged KV cache: its tensors, and how many blocks fit in a memory budget.

All layers' keys and values live in one tensor ``[num_layers, 2, num_blocks, block_size, Hkv, D]``.
A block is the unit the BlockPool hands out: ``block_size`` consecutive token slots in *every* layer,
so one block id addresses the same slots in all 2 × num_layers planes.

With swap preemption, or a host tier for the prefix cache (``host_cache.py``), the cache also has a *host*
tensor, ``[num_host_blocks, num_layers, 2, block_size, Hkv, D]``: one host block is one contiguous piece of
memory (a single transfer), pinned on CUDA so the copy engine reads and writes it directly at the link's full
speed. ``swap_out`` and ``swap_in`` copy whole blocks between the two, as the scheduler's plan lists them (the
``HostBlockPool`` and the ``HostPrefixCache`` keep the bookkeeping).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from minfer.model.config import ModelConfig
from minfer.ops.attention import Attention, AttentionBackend, AttentionMetadata, AttentionOps


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V, every layer, ``block_size`` tokens: what one block id costs in memory."""
    return block_size * cfg.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())


def num_blocks_for_memory(cfg: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int) -> int:
    return int(budget_bytes // bytes_per_block(cfg, block_size, dtype))


def num_blocks_for_gpu(cfg: ModelConfig, block_size: int, dtype: torch.dtype, utilization: float,
                       device: torch.device | str = "cuda") -> int:
    """Blocks that fit in the part of the GPU's memory we may use (``utilization`` of the total) minus
    what is in use already: the weights, other processes, and the peak of a profiling forward if the
    caller ran one. The same rule as vLLM's ``gpu_memory_utilization``."""
    free, total = torch.cuda.mem_get_info(device)
    budget = free - total * (1.0 - utilization)
    return max(0, num_blocks_for_memory(cfg, block_size, dtype, int(budget)))


class PagedKVCache:
    """The cache tensor and the attention backend that reads and writes it."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str, ops: AttentionOps, num_host_blocks: int = 0) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv = torch.zeros(cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                              dtype=dtype, device=device)
        # host memory for swapped-out blocks: empty (untouched pages cost nothing until a swap writes them)
        self.host_kv = torch.empty(num_host_blocks, cfg.num_layers, 2, block_size, cfg.num_kv_heads, cfg.head_dim,
                                   dtype=dtype, pin_memory=self.kv.is_cuda and num_host_blocks > 0)
        self.ops = ops

    def swap_out(self, copies: Iterable[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks: ``(device block, host block)`` pairs."""
        for device_block, host_block in copies:
            self.host_kv[host_block].copy_(self.kv[:, :, device_block], non_blocking=True)

    def swap_in(self, copies: Iterable[tuple[int, int]]) -> None:
        """Copy host blocks back to device blocks: ``(host block, device block)`` pairs. Copies on one CUDA stream
        run in order, so a swap-in always reads what an earlier swap-out wrote."""
        for host_block, device_block in copies:
            self.kv[:, :, device_block].copy_(self.host_kv[host_block], non_blocking=True)

    @property
    def backend(self) -> AttentionBackend:
        """The attention backend's record: its name and capabilities (``graph_safe``, ...)."""
        return self.ops.backend

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    def attention(self, meta: AttentionMetadata) -> Attention:
        """The model's attention backend for one step: store the new K/V, then attend through block tables."""

        store_kv, paged_attention = self.ops.store_kv, self.ops.paged_attention

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k_cache, v_cache = self.kv[layer, 0], self.kv[layer, 1]
            store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            return paged_attention(q, k_cache, v_cache, meta)

        return attend
