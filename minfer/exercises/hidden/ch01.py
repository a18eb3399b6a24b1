"""Hidden cases of E1.1 (the KV-cache step): half-precision caches, with scores large enough that a softmax
which does not subtract its maximum overflows in float16."""

from __future__ import annotations

import torch

from minfer.exercises.checks.ch01 import Strips
from minfer.exercises.harness import Tester
from minfer.kv.contiguous import ContiguousKVCache
from minfer.model.loader import tiny_random_config


def half_precision_steps(dtype: torch.dtype, scale: float) -> None:
    """A prefill and two decodes in a cache of ``dtype``: the output keeps the inputs' dtype, stays finite, and
    matches attention computed in float32 on the same (rounded) inputs."""
    cfg = tiny_random_config(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
    gen = torch.Generator().manual_seed(1)
    cache, strips = ContiguousKVCache(cfg, 2, 16, dtype=dtype), Strips()
    for slots, positions in (([1, 0], [[0, 1, 2, 3], [0, 1, 2, 3]]), ([1, 0], [[4], [4]]), ([1, 0], [[5], [5]])):
        n = sum(len(r) for r in positions)
        q, k, v = ((torch.randn(n, h, 8, generator=gen) * s).to(dtype) for h, s in ((4, scale), (2, scale), (2, 1.0)))
        strips.write(0, slots, positions, k.float(), v.float())
        got = cache.attention(torch.tensor(slots), torch.tensor(positions))(0, q, k, v)
        assert got.dtype == dtype, f"{dtype} inputs gave a {got.dtype} output: attention keeps the inputs' dtype"
        assert torch.isfinite(got).all(), f"{dtype}: the output holds inf or NaN (a softmax without its maximum?)"
        want = strips.expected(0, slots, positions, q.float())
        err = (got.float() - want).abs().max().item()
        assert err < 0.05, f"{dtype}, positions {positions}: max error {err:.3f} against float32 attention"


def check_kv_cache(t: Tester) -> None:
    for dtype in (torch.float16, torch.bfloat16):
        with t.case(f"a {str(dtype).removeprefix('torch.')} cache with scores in the hundreds: the output keeps the "
                    "dtype, stays finite and matches float32 attention",
                    hint="let scaled_dot_product_attention (or a softmax that subtracts the row's maximum) do the "
                         "exponentials; return the inputs' dtype, not float32"):
            half_precision_steps(dtype, scale=6.0)
