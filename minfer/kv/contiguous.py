"""The simplest KV cache: one contiguous ``[max_len]`` strip per sequence (chapter 01's cache).

Each of ``max_seqs`` slots reserves room for ``max_len`` tokens whether the request uses it or not --
exactly the waste that chapter 03's paged cache removes. It serves the plain decode loop of chapter 01,
the static-batching baseline of chapter 02, and tests, as the reference the paged cache must equal.

Tokens arrive as a rectangle: ``B`` sequences × ``Q`` new tokens each, flattened row by row (``Q`` is the
padded prompt length in a prefill, 1 in a decode step). A query at position ``p`` sees keys ``0..p`` of
its own strip; keys beyond ``p`` (padding written by a longer neighbour's prefill) are never looked at.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from minfer.model.config import ModelConfig
from minfer.ops.attention import Attention


class ContiguousKVCache:
    def __init__(self, cfg: ModelConfig, max_seqs: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        shape = (cfg.num_layers, max_seqs, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def attention(self, slots: Tensor, positions: Tensor) -> Attention:
        """``slots``: ``[B]`` which strip each row uses; ``positions``: ``[B, Q]`` each new token's position."""
        if int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} does not fit max_len={self.max_len}")
        b, q_len = positions.shape
        length = int(positions.max()) + 1
        visible = torch.arange(length, device=positions.device)[None, None, :] <= positions[:, :, None]
        rows = slots[:, None].expand(b, q_len)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            # BEGIN EXERCISE E1.1
            kc, vc = self.k[layer], self.v[layer]
            kc[rows, positions] = k.view(b, q_len, *k.shape[1:])
            vc[rows, positions] = v.view(b, q_len, *v.shape[1:])
            keys = kc[slots, :length].transpose(1, 2)  # [B, Hkv, L, D]
            values = vc[slots, :length].transpose(1, 2)
            queries = q.view(b, q_len, *q.shape[1:]).transpose(1, 2)  # [B, Hq, Q, D]
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None],
                                                 enable_gqa=True)
            return out.transpose(1, 2).reshape(b * q_len, *q.shape[1:])
            # END EXERCISE

        return attend
