"""The speed-up layer: faster stand-ins for some of the model's modules, swapped in once, when an engine is built.

``minfer/model/llama.py`` is the model as the paper writes it, in plain PyTorch, and it stays that way: that is the
code the chapters show. What makes it fast on a CPU lives here, as modules that compute the same thing another way
and take a plain module's place:

========================  ==========================================================================================
plain module              stand-in
========================  ==========================================================================================
``Linear``                ``PackedLinear``: ``x @ W`` on a copy of ``W`` packed once for minfer's C++ kernel or for
                          oneDNN (``linear_backend``; ``minfer/ops/linear.py`` says why packing pays)
``GateUp``                ``PackedGateUp``: the packed product, with ``silu(gate) * up`` applied inside the C++
                          kernel's tiles; or ``x @ W`` then the compiled SiLU-and-mul
``LMHead``                ``PackedLMHead``: the LM head's product on a packed copy of its matrix
``RMSNorm``               ``CompiledRMSNorm``: the norm in one pass over each row (``pointwise_backend``,
                          ``minfer/ops/pointwise.py``)
``ApplyRotary``           ``CompiledRotary``: q and k rotated in place, in one pass
========================  ==========================================================================================

``accelerate(model, linear_backend, pointwise_backend)`` decides, once, which stand-ins can run here (``"auto"``:
every one that runs the model's dtype on its device) and returns a *copy of the model's module tree* with them in
place. The copy shares every weight with the model, so it costs no memory but the packed copies, and the model
itself is left as it was: several engines may share one loaded model, each with its own choice (a chapter builds a
plain engine and a fast one from the same weights). ``describe(model)`` lists what runs where, and why.

Nothing here runs per step. A packed copy remembers which weight it copies (its memory and version counter); a
weight written after the swap (a checkpoint loaded into the model) is packed again at its next product, so a stale
copy is never multiplied.
"""

from __future__ import annotations

import copy
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from minfer.model.llama import ApplyRotary, GateUp, Linear, LlamaModel, LMHead, RMSNorm, silu_mul
from minfer.ops import linear as products
from minfer.ops import pointwise
from minfer.ops.linear import PackedWeight
from minfer.types import LinearBackendName, PointwiseBackendName


# ---- the stand-ins ------------------------------------------------------------------------------------------------
class PackedLinear(nn.Module):
    """``Linear`` on a packed copy of its weight: the same ``x @ W (+ b)``, by minfer's C++ kernel or oneDNN."""

    gated = False  # packed as the MLP's gate/up weight (``PackedGateUp``)

    def __init__(self, plain: Linear, backend: str) -> None:
        super().__init__()
        self.weight, self.bias, self.backend = plain.weight, plain.bias, backend
        self.packed = self.pack()

    def pack(self) -> PackedWeight:
        return products.shared_pack(self.weight, transposed=True, backend=self.backend, gated=self.gated)

    def current(self) -> PackedWeight:
        """The packed copy, packed again first if the weight was written since."""
        if self.packed.source != products.weight_source(self.weight):
            self.packed = self.pack()
        return self.packed

    def forward(self, x: Tensor) -> Tensor:
        return products.packed_linear(x, self.current(), self.bias)


class PackedGateUp(PackedLinear):
    """``GateUp`` on a packed copy of its fused gate/up weight. minfer's C++ kernel packs it *gated* and applies
    ``silu(gate) * up`` to each tile of the two products as it computes them, so the ``[rows, 2 * inter]`` product
    is never written to memory (at a 2048-token prefill step that is 25 MB a layer, written and read back). oneDNN
    computes the product, then the activation runs (``activation``: PyTorch's or the compiled kernel)."""

    gated = True

    def __init__(self, plain: GateUp, backend: str, activation: Callable[[Tensor], Tensor] = silu_mul) -> None:
        super().__init__(plain, backend)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        packed = self.current()
        if packed.gated:  # product and activation in one pass
            return products.packed_linear(x, packed)
        return self.activation(products.packed_linear(x, packed))


class CompiledGateUp(nn.Module):
    """``GateUp`` with PyTorch's ``x @ W`` and the compiled SiLU-and-mul (products unpacked, pointwise compiled)."""

    def __init__(self, plain: GateUp) -> None:
        super().__init__()
        self.weight = plain.weight

    def forward(self, x: Tensor) -> Tensor:
        return pointwise.kernels().silu_mul(x @ self.weight)


class PackedLMHead(nn.Module):
    """``LMHead`` on a packed copy of the matrix it is handed (the tied embedding, or the model's own head)."""

    def __init__(self, weight: Tensor, backend: str) -> None:
        super().__init__()
        self.backend = backend
        self.packed = products.shared_pack(weight, transposed=False, backend=backend)

    def forward(self, hidden: Tensor, weight: Tensor) -> Tensor:
        if self.packed.source != products.weight_source(weight):
            self.packed = products.shared_pack(weight, transposed=False, backend=self.backend)
        return products.packed_linear(hidden, self.packed).float()


class CompiledRMSNorm(nn.Module):
    """``RMSNorm`` in one pass over each row (the same float32 arithmetic; the sum in another order)."""

    def __init__(self, plain: RMSNorm) -> None:
        super().__init__()
        self.weight, self.eps = plain.weight, plain.eps

    def forward(self, x: Tensor) -> Tensor:
        return pointwise.kernels().rms_norm(x, self.weight, self.eps)


class CompiledRotary(nn.Module):
    """``ApplyRotary`` in place, in one pass: ``qk`` is the layer's own fresh product, read by no one else."""

    def forward(self, qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        pointwise.kernels().rotary_(qk, cos, sin)
        return qk


# ---- choosing, once -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Choice:
    """Which backend runs one family of modules, and why."""

    backend: str  # "torch": the plain module stays; else the stand-in's backend
    why: str


def choose_products(requested: LinearBackendName, dtype: torch.dtype, device: torch.device) -> Choice:
    """The matrix products' backend (``products.resolve_linear_backend``), with the reason for it."""
    backend = products.resolve_linear_backend(requested, dtype, device)
    if requested != "auto":
        return Choice(backend, f"linear_backend={requested!r}")
    if backend != "torch":
        skipped = "" if backend == "cpp" else f" ({products.problem('cpp', dtype, device)})"
        return Choice(backend, f"auto: the first packed backend that runs {dtype} on {device.type}{skipped}")
    problems = "; ".join(p for name in products.PACKED_BACKENDS if (p := products.problem(name, dtype, device)))
    return Choice(backend, f"auto: no packed backend runs here ({problems})")


def choose_pointwise(requested: PointwiseBackendName, device: torch.device) -> Choice:
    """The per-token steps' backend (``pointwise.resolve_pointwise_backend``), with the reason for it."""
    backend = pointwise.resolve_pointwise_backend(requested, device)
    if requested != "auto":
        return Choice(backend, f"pointwise_backend={requested!r}")
    if backend == "cpp":
        return Choice(backend, "auto: the compiled kernels build here")
    return Choice(backend, f"auto: {pointwise.problem(device.type)}")


# ---- swapping -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Swap:
    """One line of ``describe``: what runs in place of the plain modules of one class, and why."""

    plain: str  # the class in minfer/model/llama.py
    count: int  # how many of them the model has
    runs: str  # the class that runs instead ("kept": the plain module runs)
    backend: str
    why: str


SWAPS: weakref.WeakKeyDictionary[nn.Module, list[Swap]] = weakref.WeakKeyDictionary()  # each accelerated model's


def accelerate(model: LlamaModel, linear_backend: LinearBackendName = "auto",
               pointwise_backend: PointwiseBackendName = "auto") -> LlamaModel:
    """A copy of ``model``'s module tree, sharing its weights, with every stand-in that ``linear_backend`` and
    ``pointwise_backend`` choose swapped in. ``model`` is left as it was. ``describe`` on the result lists the
    swaps."""
    products_choice = choose_products(linear_backend, model.dtype, model.device)
    pointwise_choice = choose_pointwise(pointwise_backend, model.device)
    fast = cast(LlamaModel, share_weights(model))
    packing, compiled = products_choice.backend != "torch", pointwise_choice.backend == "cpp"
    activation = pointwise.kernels().silu_mul if compiled else silu_mul

    def stand_in(module: nn.Module) -> tuple[nn.Module | None, Choice]:
        """The module to run in ``module``'s place (None: keep it), and the choice that decided."""
        if isinstance(module, GateUp):  # before Linear: a GateUp is a Linear
            if packing:
                return PackedGateUp(module, products_choice.backend, activation), products_choice
            if compiled:
                return CompiledGateUp(module), pointwise_choice
            return None, Choice("torch", f"{products_choice.why}; {pointwise_choice.why}")
        if isinstance(module, Linear):
            return (PackedLinear(module, products_choice.backend) if packing else None), products_choice
        if isinstance(module, LMHead):
            return (PackedLMHead(fast.lm_head_weight, products_choice.backend) if packing else None), products_choice
        if isinstance(module, RMSNorm):
            return (CompiledRMSNorm(module) if compiled else None), pointwise_choice
        if isinstance(module, ApplyRotary):
            return (CompiledRotary() if compiled else None), pointwise_choice
        raise TypeError(type(module).__name__)

    swaps: Counter[tuple[str, str, str, str]] = Counter()
    for parent in list(fast.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, (Linear, LMHead, RMSNorm, ApplyRotary)):
                continue
            new, choice = stand_in(child)
            if new is not None:
                setattr(parent, name, new)
            swaps[(type(child).__name__, "kept" if new is None else type(new).__name__, choice.backend,
                   choice.why)] += 1
    SWAPS[fast] = [Swap(plain, n, runs, backend, why) for (plain, runs, backend, why), n in swaps.items()]
    return fast


def share_weights(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree that holds the very same parameters and buffers: swapping a module in the
    copy leaves ``model`` untouched, and moving or writing a weight of either is seen by both."""
    twin = copy.copy(model)  # the module's attributes, shallow; then its own dicts of parameters, buffers, children
    twin._parameters = dict(model._parameters)
    twin._buffers = dict(model._buffers)
    twin._modules = {name: None if child is None else share_weights(child) for name, child in model._modules.items()}
    return twin


def describe(model: nn.Module) -> str:
    """What runs in place of the plain modules, one line per class, with the reason -- or that the model is the
    plain one (every module as written in ``minfer/model/llama.py``)."""
    swaps = SWAPS.get(model)
    if swaps is None:
        return "the plain model: every module runs as written in minfer/model/llama.py"
    width = max(len(f"{s.count} x {s.plain}") for s in swaps)
    return "\n".join(f"{f'{s.count} x {s.plain}':<{width}}  ->  {s.runs}"
                     f"{'' if s.runs == 'kept' else f' ({s.backend})'}  [{s.why}]" for s in swaps)
