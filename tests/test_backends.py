"""Every registered attention backend against the PyTorch reference -- found in the registry, not listed here.

A new backend (one module and one entry in ``minfer.ops.backends.BACKENDS``) is picked up by these tests
without a line added: its ``store_kv`` must write what the reference writes, its ``paged_attention`` must
return what the reference returns on random mixed steps (decodes and prefill chunks, prompts split
mid-block, scattered blocks), and an engine using it must produce the reference's greedy tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import BACKEND_CASES, check_backend_matches_reference
from minfer.ops.backends import BACKENDS, available, load_backend, resolve_backend
from minfer.ops.paged_attention import paged_attention as _paged_attention
from minfer.ops.paged_attention import store_kv
from minfer.ops.testing import random_mixed_step

paged_attention = torch.inference_mode()(_paged_attention)  # as the engine runs it


def device_for(name: str) -> str:
    """Where to test a backend in this process: Triton on the GPU when there is one (this process imported it
    compiled), else each backend on the CPU if it runs there."""
    b = BACKENDS[name]
    if b.cpu_interpreter and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    return "cpu" if "cpu" in b.devices else "cuda"


def loaded(name: str):
    device = device_for(name)
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"attention backend {name!r} needs a CUDA GPU")
    if not available(BACKENDS[name], device):
        pytest.skip(f"attention backend {name!r} cannot run here (it needs a C++ compiler)")
    return load_backend(BACKENDS[name], device), device


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("block_size, group, head_dim", [(16, 3, 64), (32, 1, 48)])
def test_every_backend_matches_the_reference_on_random_mixed_steps(name, block_size, group, head_dim):
    ops, device = loaded(name)
    for case in range(3):
        b, chunks = random_mixed_step(f"{name}-{block_size}-{case}", block_size, group, head_dim)
        move = (lambda t: t.to(device))
        k_cache, v_cache = move(b.k_cache.clone()), move(b.v_cache.clone())
        ref_k, ref_v = b.k_cache.clone(), b.v_cache.clone()
        store_kv(b.k, b.v, ref_k, ref_v, b.meta.slot_mapping)
        ops.store_kv(move(b.k), move(b.v), k_cache, v_cache, move(b.meta.slot_mapping))
        assert torch.equal(k_cache.cpu(), ref_k) and torch.equal(v_cache.cpu(), ref_v), f"{name}: store_kv"
        meta = type(b.meta)(**{f: (move(v) if isinstance(v, torch.Tensor) else v)
                               for f in b.meta.__slots__ if f != "memo" for v in [getattr(b.meta, f)]})
        with torch.inference_mode():
            out = ops.paged_attention(move(b.q), move(b.k_cache), move(b.v_cache), meta)
        torch.testing.assert_close(out.cpu(), paged_attention(b.q, b.k_cache, b.v_cache, b.meta),
                                   atol=2e-5, rtol=1e-4, msg=lambda m, c=chunks: f"{name}, chunks {c}: {m}")


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("overrides, block_size", BACKEND_CASES)
def test_every_backend_gives_the_reference_greedy_tokens_in_the_engine(name, overrides, block_size):
    ops, device = loaded(name)
    if device != "cpu":
        pytest.skip(f"{name} runs compiled on the GPU in this process: tests/test_cuda.py checks its engine")
    check_backend_matches_reference(name, overrides, block_size)


def test_auto_picks_by_device_and_capability():
    from minfer.ops.backends import unready

    assert resolve_backend("auto", "cpu").name == ("cpp" if unready("cpp", "cpu") is None else "torch")  # if it builds
    assert resolve_backend("auto", "cuda").name == "triton"
    assert all(b.name == name for name, b in BACKENDS.items())
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("flash", "cpu")
    with pytest.raises(ValueError, match="runs on"):
        load_backend(BACKENDS["cpp"], "cuda")


def test_auto_says_once_per_process_which_backend_it_skips(monkeypatch, capsys):
    """Every engine built in a process resolves "auto" again; the notice of a skipped kernel is printed by the first
    only (``minfer.notices.say_once``), not once per engine."""
    import minfer.ops.backends as backends
    from minfer.notices import say_once

    monkeypatch.setattr(backends, "unready", lambda name, kind: "no C++ compiler found" if name == "cpp" else None)
    say_once.cache_clear()
    capsys.readouterr()
    assert [resolve_backend("auto", "cpu").name for _ in range(3)] == ["torch"] * 3
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["minfer: attention_backend='auto' skips 'cpp' on the cpu (no C++ compiler found); the next "
                     "backend runs the same attention"], lines
    say_once.cache_clear()
