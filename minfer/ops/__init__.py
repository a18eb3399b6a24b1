"""Paged-attention operations: the PyTorch reference, the Triton kernels and a compiled CPU kernel,
behind one choice.

``attention_ops(backend, device)`` returns the pair ``(store_kv, paged_attention)`` the KV cache calls.
Every kernel has a reference of the same signature in ``paged_attention.py``; tests compare them.
"""

from __future__ import annotations

import os

import torch

from minfer.config import BACKENDS
from minfer.ops.paged_attention import AttentionMetadata, paged_attention, store_kv

__all__ = ["AttentionMetadata", "attention_ops", "paged_attention", "resolve_backend", "store_kv"]


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """``"auto"`` means Triton on CUDA; on the CPU, the compiled decode kernel where it builds (a C++ compiler is
    present), else the PyTorch reference (with a one-line notice)."""
    if backend == "auto":
        if torch.device(device).type == "cuda":
            return "triton"
        from minfer.ops.cpp_paged_attention import available

        return "cpp" if available() else "torch"
    return backend


def attention_ops(backend: str, device: torch.device | str):
    backend = resolve_backend(backend, device)
    if backend == "torch":
        return store_kv, paged_attention
    if backend == "cpp":  # (EngineConfig has refused it on CUDA already)
        from minfer.ops.cpp_paged_attention import cpp_paged_attention, kernel

        kernel()  # compile or load it now, at engine construction, not in the middle of the first step
        return store_kv, cpp_paged_attention
    if backend != "triton":
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {backend!r}")
    if torch.device(device).type == "cpu":
        enable_triton_interpreter()
    from minfer.ops.triton_paged_attention import triton_paged_attention
    from minfer.ops.triton_store_kv import triton_store_kv

    return triton_store_kv, triton_paged_attention


def enable_triton_interpreter() -> None:
    """Run Triton kernels on the CPU (numpy). Triton fixes its mode per function when ``@triton.jit``
    decorates it: its own helpers (``tl.zeros``, ``tl.sum``) when ``triton`` is first imported -- which
    importing ``transformers`` does -- and each kernel when its module is imported. So the variable must
    be set before both; a clear error beats the interpreter's "cannot call @triton.jit'd" later."""
    import sys

    def compiled(module: str, fn: str) -> bool:  # imported, and its @triton.jit was not interpreted
        return module in sys.modules and type(getattr(sys.modules[module], fn)).__name__ == "JITFunction"

    jitted = (("triton.language", "zeros"), ("minfer.ops.triton_store_kv", "store_kv_kernel"),
              ("minfer.ops.triton_paged_attention", "paged_attention_kernel"))
    loaded = [m for m, fn in jitted if compiled(m, fn)]
    if loaded:
        raise RuntimeError(
            "attention_backend='triton' on the CPU needs Triton's interpreter, but Triton code was already "
            f"imported without it ({', '.join(loaded)}). Set TRITON_INTERPRET=1 in the environment (or in "
            "os.environ before importing minfer and transformers), or restart the Python process."
        )
    os.environ["TRITON_INTERPRET"] = "1"
