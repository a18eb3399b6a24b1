"""Two ways to store a weight matrix in fewer bytes: int8 and 4-bit, each in groups with their own scale.

A weight matrix ``W`` (``[in, out]``, as minfer's ``Linear`` stores it) is cut, along its input dimension, into
groups of ``group`` consecutive weights of one output column (32 by default: the block of the GGUF formats). Each
group is stored as small integers and one or two float16 numbers that map them back to floats:

* **int8** (``Int8Weight``), symmetric: ``w = scale * q`` with ``q`` in -127..127 and
  ``scale = max |w| / 127`` over the group. 8 bits a weight plus 16 bits a group: 8.5 bits. This is the GGUF's
  Q8_0 block; SmolLM2's GGUF stores its embedding (the tied LM head) this way.
* **q4** (``Q4Weight``), with a minimum: ``w = scale * q + min`` with ``q`` in 0..15, ``min`` the group's smallest
  weight and ``scale = (max - min) / 15``. 4 bits a weight plus 32 bits a group: 5 bits. This is the GGUF's Q4_1
  block; SmolLM2's GGUF stores every layer's matrices this way.

Why groups: one scale for a whole column would be set by its largest weight, and a single outlier would leave every
other weight of the column only a few of the 255 (or 16) levels. A group of 32 shares a scale with 31 neighbours
only; the scales cost 0.5 (int8) or 1 (q4) bit a weight. ``minfer/quality.py`` measures what the choice does to the
model's outputs (``docs/architecture.md`` has the numbers behind the default).

``dequantize`` is the reference: the float32 weights a format stands for. The kernels (``minfer/ops/quant_linear.py``)
never build that matrix; they turn each weight back into a float inside the product's inner loop, and the tests
compare them with ``x @ dequantize(w)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

GROUP = 32  # weights that share a scale: the block of the GGUF formats Q8_0 and Q4_1


@dataclass(frozen=True, slots=True)
class Int8Weight:
    """``W[k, n] = scales[k // group, n] * q[k, n]``: symmetric int8 in groups along the input dimension."""

    q: Tensor  # [in, out] int8, -127..127
    scales: Tensor  # [groups, out] float16, groups = ceil(in / group)
    group: int = GROUP

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def dequantize(self) -> Tensor:
        """The float32 matrix ``[in, out]`` this stands for."""
        return expand_groups(self.scales, self.group, self.shape[0]) * self.q.float()

    def nbytes(self) -> int:
        """Bytes the format stores: a byte a weight and a float16 a group."""
        return self.q.numel() + 2 * self.scales.numel()


@dataclass(frozen=True, slots=True)
class Q4Weight:
    """``W[k, n] = scales[k // group, n] * q[k, n] + mins[k // group, n]``: 4-bit values in groups along the input
    dimension, each group with its own scale and minimum (the GGUF's Q4_1)."""

    q: Tensor  # [in, out] uint8, 0..15 (one value a byte here; the kernel's packing puts two in a byte)
    scales: Tensor  # [groups, out] float16
    mins: Tensor  # [groups, out] float16
    group: int = GROUP

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def dequantize(self) -> Tensor:
        """The float32 matrix ``[in, out]`` this stands for: ``scale * q + min``, computed as the GGUF's own
        dequantization computes it (so a GGUF's blocks give exactly the float32 weights minfer converts it to)."""
        k = self.shape[0]
        return expand_groups(self.scales, self.group, k) * self.q.float() + expand_groups(self.mins, self.group, k)

    def nbytes(self) -> int:
        """Bytes the format stores: half a byte a weight, and two float16 a group."""
        return (self.q.numel() + 1) // 2 + 2 * (self.scales.numel() + self.mins.numel())


QuantizedWeight = Int8Weight | Q4Weight


def expand_groups(per_group: Tensor, group: int, rows: int) -> Tensor:
    """``[groups, out]`` → ``[rows, out]`` float32: each group's value repeated for its ``group`` rows."""
    return per_group.float().repeat_interleave(group, dim=0)[:rows]


def grouped(w: Tensor, group: int) -> Tensor:
    """``w`` (``[in, out]``) as ``[groups, group, out]`` float32. A last, partial group is padded with copies of
    the matrix's last row, which changes no group's largest, smallest or largest absolute value -- and so no
    scale; the padding rows are dropped again by ``dequantize``."""
    w = w.detach().float()
    pad = -w.shape[0] % group
    if pad:
        w = torch.cat([w, w[-1:].expand(pad, -1)])
    return w.view(-1, group, w.shape[1])


def quantize_int8(w: Tensor, group: int = GROUP) -> Int8Weight:
    """``w`` (``[in, out]``) in symmetric int8, one scale per ``group`` inputs of each output: ``scale`` is the
    group's largest absolute value over 127, rounded to float16, and each ``q`` the nearest integer to
    ``w / scale`` (computed with the rounded scale, so that the stored pair is as close to ``w`` as it can be)."""
    # BEGIN EXERCISE E14.1
    g = grouped(w, group)  # [groups, group, out]: each group's weights along dim 1
    scales = (g.abs().amax(dim=1) / 127).half()  # [groups, out]
    divisor = scales.float()[:, None, :]
    q = torch.where(divisor > 0, g / divisor, 0.0).round().clamp(-127, 127)  # an all-zero group: scale 0, q 0
    return Int8Weight(q.flatten(0, 1)[: w.shape[0]].to(torch.int8), scales, group)
    # END EXERCISE


def quantize_q4(w: Tensor, group: int = GROUP) -> Q4Weight:
    """``w`` (``[in, out]``) in 4 bits with a minimum, as the GGUF's Q4_1: per group, ``min`` is its smallest
    weight and ``scale = (max - min) / 15`` (both rounded to float16), and each ``q`` the nearest of 0..15 to
    ``(w - min) / scale``."""
    g = grouped(w, group)
    low, high = g.amin(dim=1), g.amax(dim=1)
    scales, mins = ((high - low) / 15).half(), low.half()
    divisor = scales.float()[:, None, :]
    q = torch.where(divisor > 0, (g - mins.float()[:, None, :]) / divisor, 0.0).round().clamp(0, 15)
    return Q4Weight(q.flatten(0, 1)[: w.shape[0]].to(torch.uint8), scales, mins, group)


def dequantize(w: QuantizedWeight) -> Tensor:
    """The float32 ``[in, out]`` matrix a quantized weight stands for."""
    return w.dequantize()


def max_rounding_error(w: QuantizedWeight) -> Tensor:
    """The most any weight of each group (``[groups, out]``) can be off: half a step (``scale / 2``), plus what
    rounding the scale and minimum to float16 can add at the group's extreme weights (half a float16 unit in the
    last place, 2^-11 of the largest magnitude the group reaches, or 2^-25 for the smallest float16 numbers).
    The bound the tests hold both formats to."""
    scales = w.scales.float()
    reach = 127 * scales if isinstance(w, Int8Weight) else w.mins.float().abs() + 15 * scales
    return scales / 2 + reach * 2.0**-11 + 2.0**-25
