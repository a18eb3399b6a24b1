"""The paged KV cache: its tensors, and how many blocks fit in a memory budget.

All layers' keys and values live in one tensor ``[num_layers, 2, num_blocks, block_size, Hkv, D]``.
A block is the unit the BlockPool hands out: ``block_size`` consecutive token slots in *every* layer,
so one block id addresses the same slots in all 2 × num_layers planes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minfer.model.config import ModelConfig
from minfer.model.llama import Attention
from minfer.ops.paged_attention import AttentionMetadata

StoreKV = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
PagedAttentionFn = Callable[[Tensor, Tensor, Tensor, AttentionMetadata], Tensor]


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V, every layer, ``block_size`` tokens: what one block id costs in memory."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem


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
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str, store_kv: StoreKV, paged_attention: PagedAttentionFn) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv = torch.zeros(cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                              dtype=dtype, device=device)
        self._store_kv, self._paged_attention = store_kv, paged_attention

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    def attention(self, meta: AttentionMetadata) -> Attention:
        """The model's attention backend for one step: store the new K/V, then attend through block tables."""

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k_cache, v_cache = self.kv[layer, 0], self.kv[layer, 1]
            self._store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            return self._paged_attention(q, k_cache, v_cache, meta)

        return attend
