"""The model's matrix products by name: PyTorch's ``x @ W``, or a packed copy of every weight multiplied by
minfer's C++ kernel or by oneDNN.

Most of a forward pass is ``x @ W`` (q/k/v, o, gate/up, down, the LM head). On a CPU, PyTorch hands a plain
float32 product to a BLAS library (MKL on x86) that sees each weight for the first time at every call: it
copies tiles of ``W`` into the order its inner kernel reads, then multiplies. A decode step has few rows (one
per running request), so that copy costs as much as the arithmetic -- and MKL picks slow code paths on AMD
processors. A weight can instead be *packed* once into the order a kernel reads, and reused at every call. Same
products, same float32 arithmetic (sums in another order, so results differ in the last bits); chapter 01
measures what it buys.

Backends:

* ``"torch"``: ``x @ W`` as written in ``minfer/model/llama.py`` (any device, any dtype);
* ``"cpp"``: ``csrc/linear_cpu.cpp``, minfer's own kernel: each weight packed in column panels, a tile of the
  output held in vector registers (float32 on the CPU, compiled once per machine like the other C++ kernels);
* ``"onednn"``: weights packed for oneDNN, the library under ``torch.ops.mkldnn`` (which vLLM's CPU backend also
  calls); float32, and bfloat16 where the CPU has bfloat16 instructions;
* ``"auto"``: ``"cpp"`` where it builds and runs the model's dtype, else ``"onednn"`` where that can, else
  ``"torch"``.

A packed copy is extra memory: the weights twice. The model itself always multiplies ``x @ W``; the speed-up layer
(``minfer/accelerate.py``) stands a module that multiplies a packed copy in for each of its products, once, when an
engine is built. Engines that share a model share its packed copies (``shared_pack``).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from minfer.notices import say_once
from minfer.ops.cpp_build import build_problem, load_extension
from minfer.types import LinearBackendName

SOURCE = Path(__file__).with_name("csrc") / "linear_cpu.cpp"
NAME = "minfer_linear_cpu"
PACKED_BACKENDS = ("cpp", "onednn")  # the backends that multiply a packed copy of each weight


@functools.cache
def kernels() -> ModuleType:
    """The compiled module: ``linear(x, packed, out_features)``, ``panel_width()``."""
    return load_extension(NAME, SOURCE, "the CPU matrix-product kernel",
                          instead="linear_backend='onednn' or 'torch' multiply without compiling")


def cpp_problem(dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Why minfer's C++ products cannot run ``dtype`` on ``device`` here, or None when they can (builds the
    kernel the first time it is asked on a CPU)."""
    if torch.device(device).type != "cpu":
        return "minfer's C++ products run on the CPU"
    if dtype != torch.float32:
        return f"minfer's C++ products take float32, not {dtype}"
    return _cpp_unready()


@functools.cache
def _cpp_unready() -> str | None:  # asked once per process
    return build_problem(kernels)


def onednn_problem(dtype: torch.dtype, device: torch.device | str) -> str | None:
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


def whole_model_dtypes() -> tuple[tuple[str, ...], str | None]:
    """The dtypes besides float32 a whole model runs in natively on this CPU -- ``("bfloat16",)`` where oneDNN
    multiplies bfloat16 in hardware -- and, when there are none, why not: the rows a quality or speed table adds."""
    why = onednn_problem(torch.bfloat16, "cpu")
    return ((), why) if why else (("bfloat16",), None)


def problem(name: str, dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Why backend ``name`` cannot run ``dtype`` on ``device`` here, or None when it can."""
    if name == "cpp":
        return cpp_problem(dtype, device)
    if name == "onednn":
        return onednn_problem(dtype, device)
    return None


def resolve_linear_backend(name: LinearBackendName, dtype: torch.dtype, device: torch.device | str) -> str:
    """The backend ``name`` means for a model of ``dtype`` on ``device``: ``"auto"`` picks the first of
    ``"cpp"``, ``"onednn"``, ``"torch"`` that can run (with a one-line notice when the C++ kernel would have fit but
    does not build); an explicit backend that cannot run is an error that says why."""
    if name == "auto":
        if torch.device(device).type != "cpu":
            return "torch"
        if dtype == torch.float32:
            if (why := cpp_problem(dtype, device)) is None:
                return "cpp"
            say_once(f"minfer: linear_backend='auto' skips 'cpp' ({why})")
        return "torch" if onednn_problem(dtype, device) else "onednn"
    if (why := problem(name, dtype, device)) is not None:
        raise ValueError(f"linear_backend={name!r} cannot run here: {why}; use 'torch' or 'auto'")
    return name


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """One weight's packed copy for ``backend`` (``"cpp"``: ``[panels, in, panel width]``, see ``pack``;
    ``"onednn"``: oneDNN's own blocked layout, an opaque tensor), and which weight it copies: its memory, version
    counter and dtype. A weight written since (a checkpoint loaded into the model, ``model.to(...)``) no longer
    matches its ``source``, and must be packed again."""

    tensor: Tensor
    source: tuple[int, int, torch.dtype]
    backend: str  # "cpp" or "onednn": which kernel ``packed_linear`` hands it to
    out_features: int  # columns of the product (the "cpp" copy's last panel is padded)
    gated: bool = False  # packed by ``pack_gated``: the product returns ``silu(x @ W_gate) * (x @ W_up)``


def weight_source(weight: Tensor) -> tuple[int, int, torch.dtype]:
    return weight.data_ptr(), weight._version, weight.dtype


def pack(in_out: Tensor, width: int) -> Tensor:
    """``[in, out]`` → ``[panels, in, width]``: panel ``p`` holds columns ``p * width`` to ``(p + 1) * width``, row
    after row, so the C++ kernel reads it front to back (the last panel padded with zero columns)."""
    k, n = in_out.shape
    panels = -(-n // width)
    padded = in_out.new_zeros(k, panels * width)
    padded[:, :n] = in_out
    return padded.view(k, panels, width).transpose(0, 1).contiguous()


def pack_gated(in_out: Tensor, width: int) -> Tensor:
    """The MLP's fused gate/up weight ``[in, 2n]`` (gate's ``n`` columns, then up's), packed as ``pack`` packs each
    half, with the halves' panels alternating: gate's panel 0, up's panel 0, gate's panel 1... The C++ kernel then
    meets the two products of the same columns together, and applies ``silu(gate) * up`` before writing them."""
    gate, up = in_out.chunk(2, dim=1)
    return torch.stack([pack(gate, width), pack(up, width)], dim=1).flatten(0, 1)


def pack_weight(weight: Tensor, transposed: bool, backend: str = "onednn", gated: bool = False) -> PackedWeight:
    """``backend``'s packed copy of ``weight``. ``transposed``: ``weight`` is stored ``[in, out]``, as minfer's
    ``Linear`` does; else ``[out, in]`` (``nn.Linear``'s layout, and the embedding's, which the LM head shares).
    ``gated``: ``weight`` is the MLP's fused gate/up weight, and the ``"cpp"`` copy applies its activation
    (``pack_gated``); other backends copy it as any weight."""
    gated = gated and backend == "cpp"
    weight = weight.detach()
    if backend == "cpp":
        in_out = weight if transposed else weight.t()
        packed = (pack_gated if gated else pack)(in_out, kernels().panel_width())
        return PackedWeight(packed, weight_source(weight), backend, in_out.shape[1], gated)
    out_in = (weight.t() if transposed else weight).contiguous()
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(out_in, None), weight_source(weight), backend,
                        out_in.shape[0])


# (id of a weight, transposed, backend, gated) -> (the weight, weakly; its packed copy). Keyed by id, with the weight
# checked by identity: tensors compare element by element, so they cannot be a dictionary's keys.
_SHARED: dict[tuple[int, bool, str, bool], tuple[weakref.ref[Tensor], PackedWeight]] = {}


def shared_pack(weight: Tensor, transposed: bool, backend: str, gated: bool = False) -> PackedWeight:
    """``pack_weight``, once per weight while it is unchanged: engines that share a model share its packed copies
    instead of holding one each. The copy is dropped with the weight."""
    key = (id(weight), transposed, backend, gated)
    hit = _SHARED.get(key)
    if hit is not None and hit[0]() is weight and hit[1].source == weight_source(weight):
        return hit[1]
    packed = pack_weight(weight, transposed, backend, gated)
    _SHARED[key] = (weakref.ref(weight, lambda _: _SHARED.pop(key, None)), packed)
    return packed


def padded_rows(rows: int) -> int:
    """The row count oneDNN is asked for: ``rows`` rounded up to a multiple of 8 (to 64 past 64 rows).

    oneDNN compiles a kernel for every input shape it meets and keeps it, about 1-2 MB and a millisecond each.
    A server's steps have any number of rows from 1 to the token budget, so unpadded products would compile
    thousands of kernels and hold gigabytes. Padded, a weight meets at most 8 shapes up to 64 rows (a decode
    batch; at so few rows the product streams the weight, and the padding rows cost little) plus one per 64 rows
    beyond (at most an eighth more arithmetic). minfer's C++ kernel compiles nothing per shape and needs no
    padding."""
    step = 8 if rows <= 64 else 64
    return -(-rows // step) * step


def packed_linear(x: Tensor, packed: PackedWeight, bias: Tensor | None = None) -> Tensor:
    """``x @ W (+ bias)`` through a packed copy of ``W``; ``x``: ``[rows, in]``, any number of rows. A gated copy
    returns ``silu(x @ W_gate) * (x @ W_up)`` and takes no bias (the bias would go before the activation)."""
    if packed.backend == "cpp":
        if packed.gated and bias is not None:
            raise ValueError("a gated product takes no bias: pack a weight with a bias without gated=True")
        y = kernels().linear(x.contiguous(), packed.tensor, packed.out_features, packed.gated)
        return y if bias is None else y + bias
    rows = x.shape[0]  # oneDNN: padded with zero rows to ``padded_rows``, which are computed and dropped
    if (padded := padded_rows(rows)) != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, bias, "none", [], "")[:rows]
