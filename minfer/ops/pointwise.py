"""The per-token steps of a decoder layer by name: PyTorch's operators, or compiled CPU kernels.

Between its matrix products a decoder layer normalizes (RMSNorm, twice), rotates q and k (rotary), and gates its
MLP (SiLU-and-mul). Written in PyTorch (``minfer/model/llama.py``) each is several operators -- RMSNorm alone
squares, averages, adds, takes a reciprocal square root and multiplies twice -- and each operator reads its input
from memory, writes a new tensor and costs a dispatch of a few microseconds. ``csrc/pointwise_cpu.cpp`` does each
step in one pass over its rows. Same arithmetic, in float32 (sums in another order, so the last bits may differ);
the products still take most of a step, so this is worth a few percent of it (the README's benchmark measures).

Backends:

* ``"torch"``: the PyTorch operators of ``minfer/model/llama.py`` (any device, any dtype);
* ``"cpp"``: the kernels, compiled once per machine (``cpp_build.py``; the CPU, with a C++ compiler);
* ``"auto"``: ``"cpp"`` on the CPU where the kernels build (a one-line notice once when they do not), else
  ``"torch"``.

The model itself always runs PyTorch's operators; the speed-up layer (``minfer/accelerate.py``) stands modules that
call these kernels in for its norms, rotary and gated MLP activation, once, when an engine is built.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch

from minfer.notices import say_once
from minfer.ops.cpp_build import build_problem, load_extension
from minfer.types import PointwiseBackendName

SOURCE = Path(__file__).with_name("csrc") / "pointwise_cpu.cpp"
NAME = "minfer_pointwise_cpu"


@functools.cache
def kernels() -> ModuleType:
    """The compiled module: ``rms_norm(x, weight, eps)``, ``rotary_(x, cos, sin)`` (in place), ``silu_mul(gate_up)``."""
    return load_extension(NAME, SOURCE, "the CPU pointwise kernels",
                          instead="pointwise_backend='torch' runs the same steps without compiling")


@functools.cache
def problem(device_type: str) -> str | None:
    """Why the kernels cannot run on ``device_type`` here, or None when they can (asked once per process)."""
    if device_type != "cpu":
        return "they run on the CPU"
    return build_problem(kernels)


def resolve_pointwise_backend(name: PointwiseBackendName, device: torch.device | str) -> str:
    """The backend ``name`` means on ``device``: ``"auto"`` picks the kernels on a CPU where they build; an explicit
    ``"cpp"`` that cannot build is an error that says why."""
    kind = torch.device(device).type
    if name == "torch" or (name == "auto" and kind != "cpu"):
        return "torch"
    why = problem(kind)
    if why is None:
        return "cpp"
    if name == "auto":
        say_once(f"minfer: pointwise_backend='auto' skips 'cpp' ({why}); PyTorch's operators do the same")
        return "torch"
    raise ValueError(f"pointwise_backend='cpp' cannot run here: {why}")
