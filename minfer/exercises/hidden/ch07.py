"""Hidden cases of E7.1 (the online softmax): many key tiles with a huge score in an early or a late tile, rows
that see almost nothing (every other score -inf), and float16 inputs whose scores share a large offset -- each
compared with the PyTorch reference (for float16: in float32, on the very same rounded numbers)."""

from __future__ import annotations

import torch

from minfer.exercises.checks.ch07 import compare, kernel_module
from minfer.exercises.harness import Tester
from minfer.ops.paged_attention import paged_attention, store_kv
from minfer.ops.testing import PagedBatch, random_paged_batch


def peaked(b: PagedBatch, tile: int, height: float) -> PagedBatch:
    """Every query 0.3 everywhere; in each request, the key at the start of its ``tile``-th tile of 64 keys
    ``height`` everywhere: that one key's score dwarfs all others (2^100 and more after exp2)."""
    b.q.fill_(0.3)
    keys, bs = b.k_cache.view(-1, *b.k_cache.shape[2:]), b.k_cache.shape[1]
    for i, n in enumerate(b.meta.seq_lens.tolist()):
        pos = min(64 * tile, n - 2)  # a cached key (the step's own keys are stored over the cache)
        keys[b.meta.block_tables[i, pos // bs] * bs + pos % bs] = height
    return b


def compare_half(b: PagedBatch, what: str) -> None:
    """The kernel on float16 inputs against the reference in float32 on the very same (rounded) numbers."""
    half = PagedBatch(b.q.half(), b.k.half(), b.v.half(), b.k_cache.half(), b.v_cache.half(), b.meta)
    store_kv(half.k, half.v, half.k_cache, half.v_cache, b.meta.slot_mapping)
    with torch.inference_mode():
        got = kernel_module().triton_paged_attention(half.q, half.k_cache, half.v_cache, b.meta)
        want = paged_attention(half.q.float(), half.k_cache.float(), half.v_cache.float(), b.meta)
    assert got.dtype == torch.float16, f"{what}: the output is {got.dtype}, expected the inputs' float16"
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: the output holds NaN or inf -- a score or an exp() overflowed float16?")
    err = (got.float() - want).abs().max().item()
    assert err < 2e-2, f"{what}: the kernel's output differs from the float32 reference by up to {err:.2e}"


def check_online_softmax(t: Tester) -> None:
    with t.case("five tiles of keys, one huge score in the first tile, then in the last",
                hint="keep the running maximum over *every* tile (m_i = m_new at the end of each), and rescale both "
                     "l_i and acc by exp2(m_i - m_new) whenever it rises"):
        for tile in (0, 4):
            b = peaked(random_paged_batch([(300, 1), (290, 1), (270, 3)], seed=11 + tile), tile, 8.0)
            compare(b, f"the huge score in tile {tile}", atol=1e-4, rtol=1e-3)

    with t.case("a 9-token prompt whose first queries see only a key or two of five tiles (the rest -inf)",
                hint="a tile where a row sees no key at all has a row maximum of -inf: exp2(-inf - m) is 0, "
                     "but never compute -inf - -inf (m_i starts finite)"):
        b = random_paged_batch([(0, 9), (257, 1), (0, 70)], seed=12)
        b.q.mul_(20.0)
        compare(b, "rows that see almost nothing", atol=1e-4, rtol=1e-3)

    with t.case("float16 inputs over four tiles, every score near 800 (far past what float16 resolves)",
                hint="compute the scores and the softmax in float32 (tl.dot accumulates in float32): only the "
                     "weights p, cast to the values' dtype, go into the second dot; a score rounded to float16 "
                     "near 800 is off by up to 0.25, a weight by up to 19%"):
        b = random_paged_batch([(250, 1), (200, 1), (0, 1), (180, 20)], seed=13, group=2, head_dim=32)
        for x in (b.k_cache, b.k):  # every key near the all-ones vector, every query near 100 x it
            x.mul_(0.05).add_(1.0)
        b.q.mul_(0.05).add_(100.0)
        compare_half(b, "float16")
