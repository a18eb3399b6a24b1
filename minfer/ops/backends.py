"""Attention backends by name: the registry, the rule ``attention_backend="auto"`` follows, and loading.

Each ``AttentionBackend`` record (``attention.py``) says where a backend's two functions live and what it can
do. The functions are named by import path and imported only when an engine chooses the backend: importing
Triton fixes its interpreter-or-compiled mode for the whole process, and compiling the C++ kernel takes half
a minute, so neither may happen as a side effect of importing minfer.

Adding a backend is one module (its ``store_kv`` and ``paged_attention`` functions, with the reference's
signatures) plus one entry in ``BACKENDS``; ``tests/test_backends.py`` then checks it against the reference
on random mixed steps and through the engine.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

import torch

from minfer.notices import say_once
from minfer.ops.attention import AttentionBackend, AttentionOps
from minfer.ops.cpp_build import build_problem, have_compiler

BACKENDS: dict[str, AttentionBackend] = {b.name: b for b in (
    AttentionBackend(  # "auto" on the CPU where it builds (cpp_paged_attention.available); else the reference
        "cpp", "minfer.ops.cpp_paged_attention:cpp_store_kv", "minfer.ops.cpp_paged_attention:cpp_paged_attention",
        devices=("cpu",), auto_on=("cpu",), needs_compiler=True, prepare="minfer.ops.cpp_paged_attention:kernel",
        summary="compiled CPU kernels: decodes read K/V in place, prefill chunks on the products' register tile"),
    AttentionBackend(
        "torch", "minfer.ops.paged_attention:store_kv", "minfer.ops.paged_attention:paged_attention",
        devices=("cpu", "cuda"), auto_on=("cpu",),
        summary="the PyTorch reference: gathers each request's K/V out of its blocks, then SDPA"),
    AttentionBackend(
        "triton", "minfer.ops.triton_store_kv:triton_store_kv",
        "minfer.ops.triton_paged_attention:triton_paged_attention",
        devices=("cuda", "cpu"), auto_on=("cuda",), graph_safe=True, cpu_interpreter=True,
        summary="Triton kernels: online softmax over blocks read in place (on the CPU: the interpreter)"),
)}


def resolve_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """The record for ``name``; ``"auto"``: the first backend in ``BACKENDS`` that lists the device in
    ``auto_on`` and is ready here. One that is not (no compiler, a failed build) is skipped with a one-line
    notice, once per process: the course runs either way, only slower."""
    kind = torch.device(device).type
    if name == "auto":
        for backend in BACKENDS.values():
            if kind in backend.auto_on and (problem := unready(backend.name, kind)) is None:
                return backend
            if kind in backend.auto_on:
                say_once(f"minfer: attention_backend='auto' skips {backend.name!r} on the {kind} ({problem}); "
                         "the next backend runs the same attention")
        raise ValueError(f"no attention backend is registered for attention_backend='auto' on {kind!r}")
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be 'auto' or one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]


def available(backend: AttentionBackend, device: torch.device | str) -> bool:
    """Can ``backend`` run on ``device`` here (with a compiler, if it needs one)?"""
    return torch.device(device).type in backend.devices and (not backend.needs_compiler or have_compiler())


@functools.cache
def unready(name: str, device_type: str) -> str | None:
    """Why backend ``name`` cannot run on ``device_type`` here, or None when it can: it runs there, has its
    compiler if it needs one, and its ``prepare`` step (compiling a kernel: once per machine) succeeds.
    Asked once per process."""
    backend = BACKENDS[name]
    if device_type not in backend.devices:
        return f"it runs on {backend.devices}"
    if backend.needs_compiler and not have_compiler():
        return "no C++ compiler found: install g++ or set CXX"
    return None if backend.prepare is None else build_problem(_resolve(backend.prepare))


def load_backend(backend: AttentionBackend, device: torch.device | str) -> AttentionOps:
    """Import (and prepare) ``backend``'s functions for an engine on ``device``."""
    kind = torch.device(device).type
    if kind not in backend.devices:
        raise ValueError(f"attention_backend={backend.name!r} runs on {backend.devices}, not on {kind!r}")
    if backend.cpu_interpreter and kind == "cpu":
        enable_triton_interpreter()
    if backend.prepare is not None:
        _resolve(backend.prepare)()
    return AttentionOps(backend, _resolve(backend.store_kv), _resolve(backend.attend))


def enable_triton_interpreter() -> None:
    """Run Triton kernels on the CPU (numpy). Triton fixes its mode per function when ``@triton.jit``
    decorates it: its own helpers (``tl.zeros``, ``tl.sum``) when ``triton`` is first imported -- which
    importing ``transformers`` does -- and each kernel when its module is imported. So the variable must
    be set before both; a clear error beats the interpreter's "cannot call @triton.jit'd" later."""

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


def _resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
