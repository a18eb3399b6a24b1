"""The model's matrix products by name: PyTorch's ``x @ W``, or oneDNN's with every weight packed once.

Most of a forward pass is ``x @ W`` (q/k/v, o, gate/up, down, the LM head). On a CPU, PyTorch hands a plain
float32 product to a BLAS library (MKL on x86) that sees each weight for the first time at every call: it
copies tiles of ``W`` into the order its inner kernel reads, then multiplies. A decode step has few rows (one
per running request), so that copy costs as much as the arithmetic -- and MKL picks slow code paths on AMD
processors. oneDNN (the library under ``torch.ops.mkldnn``, which vLLM's CPU backend also calls) can *pack* a
weight once into its kernels' blocked layout and reuse it at every call. Same products, same float32
arithmetic (sums in another order, so results differ in the last bits); chapter 01 measures what it buys.

Backends:

* ``"torch"``: ``x @ W`` as written in ``minfer/model/llama.py`` (any device, any dtype);
* ``"onednn"``: weights packed for oneDNN (CPU builds of PyTorch with oneDNN; float32, and bfloat16 where the
  CPU has bfloat16 instructions). A packed copy is extra memory: the weights twice;
* ``"auto"``: ``"onednn"`` where it can run the model's dtype on this CPU, else ``"torch"``.

``LlamaModel.use_linear_backend`` applies one to a model; the runner applies its engine's at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minfer.types import LinearBackendName


def onednn_supports(dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Why oneDNN's packed products cannot run ``dtype`` on ``device`` here, or None when they can."""
    if torch.device(device).type != "cpu":
        return "oneDNN's packed products run on the CPU"
    if not torch.backends.mkldnn.is_available():
        return "this build of PyTorch has no oneDNN"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bfloat16 instructions for oneDNN"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"oneDNN's packed products take float32 or bfloat16, not {dtype}"
    return None


def resolve_linear_backend(name: LinearBackendName, dtype: torch.dtype, device: torch.device | str) -> str:
    """The backend ``name`` means for a model of ``dtype`` on ``device``: ``"auto"`` picks oneDNN where it can run,
    an explicit ``"onednn"`` that cannot run is an error that says why."""
    problem = onednn_supports(dtype, device)
    if name == "auto":
        return "torch" if problem else "onednn"
    if name == "onednn" and problem:
        raise ValueError(f"linear_backend='onednn' cannot run here: {problem}; use 'torch' or 'auto'")
    return name


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """oneDNN's copy of one weight in its kernels' blocked layout (an opaque tensor: only ``packed_linear`` reads
    it), and which weight it copies: its memory, version counter and dtype. A weight written since (a checkpoint
    loaded into the model, ``model.to(...)``) no longer matches, and ``repack`` copies it again."""

    tensor: Tensor
    source: tuple[int, int, torch.dtype]


def weight_source(weight: Tensor) -> tuple[int, int, torch.dtype]:
    return weight.data_ptr(), weight._version, weight.dtype


def repack(weight: Tensor, current: PackedWeight | None, transposed: bool) -> PackedWeight:
    """oneDNN's copy of ``weight``: ``current`` while it still copies it, else a new one. oneDNN takes ``[out, in]``
    (``nn.Linear``'s layout); ``transposed``: ``weight`` is stored ``[in, out]``, as minfer's ``Linear`` does."""
    if current is not None and current.source == weight_source(weight):
        return current
    out_in = (weight.t() if transposed else weight).detach().contiguous()
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(out_in, None), weight_source(weight))


def padded_rows(rows: int) -> int:
    """The row count oneDNN is asked for: ``rows`` rounded up to a multiple of 8 (to 64 past 64 rows).

    oneDNN compiles a kernel for every input shape it meets and keeps it, about 1-2 MB and a millisecond each.
    A server's steps have any number of rows from 1 to the token budget, so unpadded products would compile
    thousands of kernels and hold gigabytes. Padded, a weight meets at most 8 shapes up to 64 rows (a decode
    batch; at so few rows the product streams the weight, and the padding rows cost little) plus one per 64 rows
    beyond (at most an eighth more arithmetic)."""
    step = 8 if rows <= 64 else 64
    return -(-rows // step) * step


def packed_linear(x: Tensor, packed: PackedWeight, bias: Tensor | None = None) -> Tensor:
    """``x @ W (+ bias)`` through oneDNN's packed copy of ``W``; ``x``: ``[rows, in]``, any number of rows (padded
    with zero rows to ``padded_rows``, which are computed and dropped)."""
    rows = x.shape[0]
    if (padded := padded_rows(rows)) != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, bias, "none", [], "")[:rows]
