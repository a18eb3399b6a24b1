"""The model's matrix products on int8 and 4-bit weights: minfer's C++ kernel, and the PyTorch reference it must
agree with.

A quantized weight (``minfer/quant/formats.py``) stands for a float32 matrix, ``dequantize(w)``. The reference,
``reference_linear``, builds that matrix and multiplies: correct on any device and dtype, and the definition the
kernel is tested against -- but it writes and reads the whole float32 matrix at every product, more bytes than the
float32 model reads, so it saves nothing but the memory the weights sit in. The point of fewer bytes a weight is a
kernel that reads only those bytes: ``csrc/quant_linear_cpu.cpp`` turns each weight back into a float inside its
inner loop (float32 activations, float32 sums), on a copy packed once at load (``pack``) in the order it reads.
Its sums run in another order than the reference's, so results differ in the last bits.

The speed-up layer (``minfer/accelerate.py``) chooses between them once, at engine build: the kernel where it builds
and the model computes in float32 on the CPU, else the reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from minfer.ops.cpp_build import build_problem, load_extension
from minfer.quant.formats import Int8Weight, Q4Weight, QuantizedWeight

SOURCE = Path(__file__).with_name("csrc") / "quant_linear_cpu.cpp"
NAME = "minfer_quant_linear_cpu"


@functools.cache
def kernels() -> ModuleType:
    """The compiled module: ``quantized_linear(x, packed, format, out_features, group, gated)``,
    ``panel_width()``."""
    return load_extension(NAME, SOURCE, "the CPU int8/4-bit matrix-product kernel",
                          instead="linear_backend='torch' multiplies the same weights, dequantized, without compiling")


def cpp_problem(dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Why the C++ kernel cannot multiply activations of ``dtype`` on ``device`` here, or None when it can (builds
    the kernel the first time it is asked on a CPU)."""
    if torch.device(device).type != "cpu":
        return "minfer's quantized C++ products run on the CPU"
    if dtype != torch.float32:
        return f"minfer's quantized C++ products take float32 activations, not {dtype}"
    return _unready()


@functools.cache
def _unready() -> str | None:  # asked once per process
    return build_problem(kernels)


def format_of(w: QuantizedWeight) -> str:
    """The format's name, as ``weights=`` and the kernel spell it."""
    return "int8" if isinstance(w, Int8Weight) else "q4"


def reference_linear(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """``x @ dequantize(w) (+ bias)``: the definition of a quantized product, in PyTorch."""
    y = x @ w.dequantize().to(device=x.device, dtype=x.dtype)
    return y if bias is None else y + bias


# ---- the kernel's copy ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PackedQuantized:
    """A quantized weight packed for the C++ kernel (``pack``), with what the kernel needs to read it."""

    tensor: Tensor  # [panels, groups, block bytes] uint8
    format: str  # "int8" or "q4"
    group: int
    out_features: int  # columns of the product (the last panel is padded)
    gated: bool = False  # packed by ``pack_gated``: the product returns ``silu(x @ W_gate) * (x @ W_up)``

    def nbytes(self) -> int:
        return self.tensor.numel()


def columns(w: QuantizedWeight, start: int, stop: int) -> QuantizedWeight:
    """Columns ``start:stop`` of ``w``, in the same format (groups run along the rows, so a column slice is exact)."""
    q, scales = w.q[:, start:stop], w.scales[:, start:stop]
    if isinstance(w, Q4Weight):
        return replace(w, q=q, scales=scales, mins=w.mins[:, start:stop])
    return replace(w, q=q, scales=scales)


def pack(w: QuantizedWeight, width: int) -> Tensor:
    """``w`` (``[in, out]``) → ``[panels, groups, block bytes]``: panel ``p`` holds columns ``p * width`` to
    ``(p + 1) * width`` as one block per group of rows -- the group's ``width`` scales (float16), for q4 its
    ``width`` minimums, then its ``group`` rows of values (a byte each for int8; for q4 two to a byte, column ``c``
    in the low four bits and column ``c + width / 2`` in the high four). The last panel is padded with columns whose
    scales and minimums are 0, the last group with rows of zeros (which the kernel never reads)."""
    k, n = w.shape
    groups, panels = -(-k // w.group), -(-n // width)
    values = F.pad(w.q, (0, panels * width - n, 0, groups * w.group - k))
    values = values.view(groups, w.group, panels, width).permute(2, 0, 1, 3)
    if isinstance(w, Q4Weight):
        values = values[..., : width // 2] | (values[..., width // 2:] << 4)

    def header(per_group: Tensor) -> Tensor:  # [groups, out] float16 -> [panels, groups, 2 * width] bytes
        padded = F.pad(per_group, (0, panels * width - n))
        return padded.view(groups, panels, width).transpose(0, 1).contiguous().view(torch.uint8)

    heads = [header(w.scales)] + ([header(w.mins)] if isinstance(w, Q4Weight) else [])
    body = values.contiguous().view(torch.uint8).reshape(panels, groups, -1)
    return torch.cat(heads + [body], dim=2).contiguous()


def pack_gated(w: QuantizedWeight, width: int) -> Tensor:
    """The MLP's fused gate/up weight (gate's columns, then up's), packed as ``pack`` packs each half, with the
    halves' panels alternating -- as ``minfer/ops/linear.py``'s ``pack_gated``, for the same reason."""
    half = w.shape[1] // 2
    return torch.stack([pack(columns(w, 0, half), width), pack(columns(w, half, 2 * half), width)], 1).flatten(0, 1)


def pack_weight(w: QuantizedWeight, gated: bool = False) -> PackedQuantized:
    """The C++ kernel's packed copy of ``w``."""
    width = kernels().panel_width()
    tensor = (pack_gated if gated else pack)(w, width)
    return PackedQuantized(tensor, format_of(w), w.group, w.shape[1], gated)


def quantized_linear(x: Tensor, packed: PackedQuantized, bias: Tensor | None = None) -> Tensor:
    """``x @ W (+ bias)`` by the C++ kernel on a packed quantized ``W``; ``x``: ``[rows, in]`` float32, any number
    of rows. A gated copy returns ``silu(x @ W_gate) * (x @ W_up)`` and takes no bias."""
    if packed.gated and bias is not None:
        raise ValueError("a gated product takes no bias")
    y = kernels().quantized_linear(x.contiguous(), packed.tensor, packed.format, packed.out_features, packed.group,
                                   packed.gated)
    return y if bias is None else y + bias
