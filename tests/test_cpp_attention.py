"""The compiled CPU attention kernels (``attention_backend="cpp"``: decodes, prefill chunks) against the PyTorch
reference.

The first test to run compiles the kernel (about 30 s, once per machine); it is skipped where no C++
compiler is installed, since the backend is optional and the reference needs none.
"""

from __future__ import annotations

import os

import pytest
import torch

from minfer import EngineConfig
from minfer.ops.cpp_paged_attention import cpp_paged_attention, cpp_store_kv, have_compiler, kernel
from minfer.ops.paged_attention import paged_attention as _paged_attention
from minfer.ops.paged_attention import store_kv
from minfer.ops.testing import random_mixed_step, random_paged_batch

if not have_compiler():
    pytest.skip("no C++ compiler: the 'cpp' attention backend cannot be built here", allow_module_level=True)

paged_attention = torch.inference_mode()(_paged_attention)
cpp_attention = torch.inference_mode()(cpp_paged_attention)
TOL = dict(atol=2e-5, rtol=1e-4)  # float32 on both sides; only the summation order differs


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 48, 80])
def test_matches_the_reference_on_a_mixed_step(block_size, group, head_dim):
    """Decodes and prefill chunks (first chunks and later ones) in one step, each through its kernel."""
    b, chunks = random_mixed_step(f"cpp-{block_size}-{group}-{head_dim}", block_size, group, head_dim)
    torch.testing.assert_close(cpp_attention(b.q, b.k_cache, b.v_cache, b.meta),
                               paged_attention(b.q, b.k_cache, b.v_cache, b.meta), **TOL,
                               msg=lambda m: f"chunks {chunks}: {m}")


def test_decodes_at_block_edges_with_strided_queries():
    """Contexts of 0 and exactly one block, long ones; queries as the model passes them: a view of a
    wider q/k tensor, not contiguous."""
    chunks = [(0, 1), (15, 1), (16, 1), (31, 1), (200, 1), (7, 1)]
    b = random_paged_batch(chunks, block_size=16, num_kv_heads=3, group=3, head_dim=64, seed=11)
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
    qk = torch.cat([b.q, b.k], dim=1)  # [T, Hq + Hkv, D], as the model's fused projection gives it
    q = qk[:, : b.q.shape[1]]
    assert not q.is_contiguous()
    torch.testing.assert_close(cpp_attention(q, b.k_cache, b.v_cache, b.meta),
                               paged_attention(b.q, b.k_cache, b.v_cache, b.meta), **TOL)


@pytest.mark.parametrize("chunks", [
    [(0, 1)],  # a one-token prompt: a single query that sees only itself
    [(0, 13), (0, 12), (0, 25)],  # prompts of one row tile, one full tile, and a tile and a bit
    [(16, 16), (5, 40), (200, 3)],  # later chunks, starting at a block edge, mid-block, and deep in a prompt
    [(31, 1), (0, 70), (64, 64)],  # a decode before the chunks, and chunks crossing many blocks
])
def test_prefill_chunks_with_strided_queries(chunks):
    """Chunks as the model passes them (q a view of the wider fused q/k tensor): every query sees exactly the keys
    up to its own position, whatever the tile it falls in."""
    b = random_paged_batch(chunks, block_size=16, num_kv_heads=3, group=3, head_dim=64, seed=7)
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
    q = torch.cat([b.q, b.k], dim=1)[:, : b.q.shape[1]]
    torch.testing.assert_close(cpp_attention(q, b.k_cache, b.v_cache, b.meta),
                               paged_attention(b.q, b.k_cache, b.v_cache, b.meta), **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_caches(dtype):
    """Decodes through the kernel in a 16-bit dtype: values widened to float32 as they are read, the arithmetic in
    float32, each output rounded once. So the output is the float32 attention of the same 16-bit inputs, rounded to
    the dtype (within one unit of its last place, plus float32's sums in another order) -- closer to it than the
    reference's, which rounds along the way. A prefill chunk in the same step goes through the reference (the
    prefill kernel is float32)."""
    b = random_paged_batch([(40, 1), (3, 1), (70, 1), (0, 1), (10, 20)], block_size=16, num_kv_heads=2, group=3,
                           head_dim=64, seed=5, dtype=dtype)
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
    out = cpp_attention(b.q, b.k_cache, b.v_cache, b.meta)
    assert out.dtype == dtype
    decodes = b.meta.num_decodes
    exact = paged_attention(b.q.float(), b.k_cache.float(), b.v_cache.float(), b.meta)
    torch.testing.assert_close(out[:decodes].float(), exact[:decodes], atol=1e-5, rtol=torch.finfo(dtype).eps)
    torch.testing.assert_close(out.float(), paged_attention(b.q, b.k_cache, b.v_cache, b.meta).float(),
                               atol=2e-2, rtol=2e-2)


def test_the_kernel_refuses_bad_inputs():
    b = random_paged_batch([(9, 1)], block_size=16, num_kv_heads=2, group=3, head_dim=64)
    m = b.meta
    with pytest.raises(RuntimeError, match="int32"):
        kernel().decode_attention(b.q, b.k_cache, b.v_cache, m.block_tables.long(), m.seq_lens, 0.125,
                                  torch.empty_like(b.q))
    with pytest.raises(RuntimeError, match="share one dtype"):
        kernel().decode_attention(b.q.double(), b.k_cache, b.v_cache, m.block_tables, m.seq_lens, 0.125,
                                  torch.empty_like(b.q))
    with pytest.raises(RuntimeError, match="takes float32"):
        kernel().prefill_attention(b.q.bfloat16(), b.k_cache.bfloat16(), b.v_cache.bfloat16(), m.block_tables,
                                   m.query_start_loc, m.seq_lens, 0, 0.125, torch.empty_like(b.q.bfloat16()))
    with pytest.raises(RuntimeError, match="one more entry"):
        kernel().prefill_attention(b.q, b.k_cache, b.v_cache, m.block_tables, m.seq_lens, m.seq_lens, 0, 0.125,
                                   torch.empty_like(b.q))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_what_the_reference_writes_and_checks_every_slot(dtype):
    """One call for k and v, from strided views (as the fused q/k/v product gives them), in any dtype: the caches
    end bit for bit as the reference's two ``index_copy_`` leave them. A slot outside the cache is an IndexError
    that names it, raised before anything is written."""
    b = random_paged_batch([(9, 1), (20, 7)], block_size=16, num_kv_heads=2, group=3, head_dim=64)
    qkv = torch.randn(len(b.k), 4 * 2 * 64, dtype=dtype)  # k and v as column slices of a wider product
    k, v = qkv[:, :128].view(-1, 2, 64), qkv[:, 256:384].view(-1, 2, 64)
    want_k, want_v = b.k_cache.to(dtype), b.v_cache.to(dtype)
    got_k, got_v = want_k.clone(), want_v.clone()
    store_kv(k, v, want_k, want_v, b.meta.slot_mapping)
    cpp_store_kv(k, v, got_k, got_v, b.meta.slot_mapping)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    bad = b.meta.slot_mapping.clone()
    bad[-1] = got_k.shape[0] * got_k.shape[1]
    before = got_k.clone()
    with pytest.raises(IndexError, match=f"slot {int(bad[-1])} of token {len(bad) - 1} is out of range"):
        cpp_store_kv(k * 2, v, got_k, got_v, bad)
    assert torch.equal(got_k, before)
    with pytest.raises(RuntimeError, match="share one dtype"):
        cpp_store_kv(k.float() if dtype != torch.float32 else k.double(), v, got_k, got_v, b.meta.slot_mapping)
    with pytest.raises(RuntimeError, match="int64"):
        cpp_store_kv(k, v, got_k, got_v, b.meta.slot_mapping.int())


def test_cpp_on_cuda_is_refused_by_the_config():
    with pytest.raises(ValueError, match="attention_backend='cpp' is a CPU kernel"):
        EngineConfig(device="cuda", attention_backend="cpp")


def test_a_missing_compiler_is_named(monkeypatch):
    if os.name == "nt":
        pytest.skip("MSVC is found by the extension loader itself")
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler was found"):
        kernel.__wrapped__()


def test_two_checkouts_of_one_kernel_share_a_build_and_an_edited_kernel_gets_its_own(tmp_path, monkeypatch):
    """The build folder is keyed by the source's content and its headers', not its path: a student copy beside the
    repository loads the module the repository compiled instead of rebuilding it (and making the repository
    rebuild); an edit to the kernel or to a header it includes builds anew."""
    import shutil

    from minfer.ops.cpp_build import build_folder
    from minfer.ops.cpp_paged_attention import SOURCE

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "cache"))
    here = build_folder(SOURCE)
    copy = tmp_path / "copy" / SOURCE.name
    shutil.copytree(SOURCE.parent, copy.parent)
    assert build_folder(copy) == here
    assert (here / SOURCE.name).read_bytes() == SOURCE.read_bytes()  # what the loader compiles
    header = SOURCE.with_name("vector_math.h")
    assert (here / header.name).read_bytes() == header.read_bytes()  # and what it includes
    copy.with_name(header.name).write_text(header.read_text() + "\n// edited\n")
    edited_header = build_folder(copy)
    assert edited_header != here and edited_header.parent == here.parent
    copy.write_text(copy.read_text() + "\n// edited\n")
    assert build_folder(copy) not in (here, edited_header)


def test_a_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path, capsys):
    """PyTorch's loader waits forever on a build folder's ``lock``: an orphaned one (older than any build) goes,
    with a notice; one a build is holding now stays, and the waiting process says what it waits for."""
    import os
    import time

    from minfer.ops.cpp_build import STALE_LOCK_SECONDS, clear_stale_lock

    lock = tmp_path / "lock"
    lock.touch()
    clear_stale_lock(tmp_path, "the test kernel")
    assert lock.exists() and "waiting for another process's build of the test kernel" in capsys.readouterr().err
    old = time.time() - STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    clear_stale_lock(tmp_path, "the test kernel")
    assert not lock.exists() and "interrupted build of the test kernel" in capsys.readouterr().err
    clear_stale_lock(tmp_path, "the test kernel")  # no lock: nothing to do, nothing said
    assert capsys.readouterr().err == ""
