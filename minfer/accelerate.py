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

With ``weights="int8"`` or ``"q4"`` the products' stand-ins are ``QuantizedLinear``, ``QuantizedGateUp`` and
``QuantizedLMHead`` instead: each multiplies an int8 or 4-bit copy of its weight (``minfer/quant/formats.py``) by
minfer's C++ kernel, or by the PyTorch reference (dequantize, then ``x @ W``) where ``linear_backend`` is ``"torch"``
or the kernel cannot run (``minfer/ops/quant_linear.py``). q4 takes a GGUF's own blocks where the model was converted
from one and they are exactly its weights (``minfer/quant/gguf.py``): SmolLM2's Q4_1 layers and Q8_0 LM head.

``accelerate(model, linear_backend, pointwise_backend, weights)`` decides, once, which stand-ins can run here
(``"auto"``: every one that runs the model's dtype on its device) and returns a *copy of the model's module tree*
with them in place. The copy shares every weight with the model, so it costs no memory but the packed copies, and
the model itself is left as it was: several engines may share one loaded model, each with its own choice (a chapter
builds a plain engine and a fast one from the same weights). ``describe(model)`` lists what runs where, and why.

Nothing here runs per step. A packed copy remembers which weight it copies (its memory and version counter); a
weight written after the swap (a checkpoint loaded into the model) is packed again at its next product, so a stale
copy is never multiplied (a quantized copy is quantized again, from the new weight).
"""

from __future__ import annotations

import copy
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from minfer.model.llama import ApplyRotary, GateUp, Linear, LlamaModel, LMHead, RMSNorm, silu_mul
from minfer.notices import say_once
from minfer.ops import linear as products
from minfer.ops import pointwise, quant_linear
from minfer.ops.linear import PackedWeight
from minfer.ops.quant_linear import PackedQuantized
from minfer.quant.formats import Q4Weight, QuantizedWeight, quantize_int8, quantize_q4
from minfer.types import LinearBackendName, PointwiseBackendName, WeightFormat


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


class QuantizedProduct(nn.Module):
    """What the quantized stand-ins share: an int8 or 4-bit copy of one weight, kept as its backend multiplies it --
    minfer's C++ kernel (``"cpp"``, a packed copy) or the PyTorch reference (``"torch"``: dequantize, then ``x @ W``)
    -- and quantized again if the weight is written (as ``PackedLinear`` packs again)."""

    gated = False  # packed as the MLP's gate/up weight (``QuantizedGateUp``)

    def __init__(self, weight: Tensor, quantized: QuantizedWeight, backend: str) -> None:
        super().__init__()
        self.backend, self.format = backend, quant_linear.format_of(quantized)
        self.source = products.weight_source(weight)
        self.quantized, self.packed = self.keep(quantized)

    def keep(self, quantized: QuantizedWeight) -> tuple[QuantizedWeight | None, PackedQuantized | None]:
        """What the backend multiplies: the kernel's packed copy (and nothing else), or the quantized weight."""
        if self.backend == "cpp":
            return None, quant_linear.pack_weight(quantized, self.gated)
        return quantized, None

    def in_out(self, weight: Tensor) -> Tensor:
        """``weight`` as the product's ``[in, out]`` matrix (``Linear`` stores it so)."""
        return weight

    def refresh(self, weight: Tensor) -> None:
        """Quantize again if ``weight`` was written since the copy was made."""
        if self.source != products.weight_source(weight):
            self.quantized, self.packed = self.keep(QUANTIZERS[self.format](self.in_out(weight)))
            self.source = products.weight_source(weight)

    def nbytes(self) -> int:
        """Bytes of the copy this product reads."""
        if self.packed is not None:
            return self.packed.nbytes()
        return self.quantized.nbytes() if self.quantized is not None else 0

    def product(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        if self.packed is not None:
            return quant_linear.quantized_linear(x, self.packed, bias)
        assert self.quantized is not None
        return quant_linear.reference_linear(x, self.quantized, bias)


class QuantizedLinear(QuantizedProduct):
    """``Linear`` on a quantized copy of its weight: ``x @ W (+ b)``, up to the format's rounding."""

    def __init__(self, plain: Linear, quantized: QuantizedWeight, backend: str) -> None:
        super().__init__(plain.weight, quantized, backend)
        self.weight, self.bias = plain.weight, plain.bias

    def forward(self, x: Tensor) -> Tensor:
        self.refresh(self.weight)
        return self.product(x, self.bias)


class QuantizedGateUp(QuantizedLinear):
    """``GateUp`` on a quantized copy of its fused gate/up weight. The C++ kernel packs it gated and applies
    ``silu(gate) * up`` to each tile, as ``PackedGateUp`` does; the reference applies ``activation`` after."""

    gated = True

    def __init__(self, plain: GateUp, quantized: QuantizedWeight, backend: str,
                 activation: Callable[[Tensor], Tensor] = silu_mul) -> None:
        super().__init__(plain, quantized, backend)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        self.refresh(self.weight)
        return self.product(x) if self.packed is not None else self.activation(self.product(x))


class QuantizedLMHead(QuantizedProduct):
    """``LMHead`` on a quantized copy of the matrix it is handed (the tied embedding, ``[vocab, hidden]``, quantized
    as the product's ``[hidden, vocab]``)."""

    def in_out(self, weight: Tensor) -> Tensor:
        return weight.t()

    def forward(self, hidden: Tensor, weight: Tensor) -> Tensor:
        self.refresh(weight)
        return self.product(hidden).float()


QUANTIZERS: dict[str, Callable[[Tensor], QuantizedWeight]] = {"int8": quantize_int8, "q4": quantize_q4}


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
    if dtype == torch.float32 and device.type == "cpu" and (line := float32_notice()) is not None:
        say_once(line)
    if backend != "torch":
        skipped = "" if backend == "cpp" else f" ({products.problem('cpp', dtype, device)})"
        return Choice(backend, f"auto: the first packed backend that runs {dtype} on {device.type}{skipped}")
    problems = "; ".join(p for name in products.PACKED_BACKENDS if (p := products.problem(name, dtype, device)))
    return Choice(backend, f"auto: no packed backend runs here ({problems})")


def float32_notice() -> str | None:
    """Why the fastest engine (``LLM()``, the server: every speed-up, ``"auto"``) stays in float32 on a CPU that has a
    faster dtype -- one line, printed once -- or None where float32 is the fastest this CPU runs the whole model in.

    float32 is the exact mode: its greedy tokens are Hugging Face's, token for token (the course's tests compare them).
    bfloat16 on a CPU that multiplies it natively (AVX-512 BF16, AMX) runs faster, but its rounding changes greedy
    tokens; a user trades that knowingly, with ``python -m minfer.quality``'s agreement and perplexity in hand."""
    faster, _ = products.whole_model_dtypes()
    if not faster:
        return None
    return (f"minfer: the model runs in float32, whose greedy tokens are Hugging Face's; this CPU also multiplies "
            f"{' and '.join(faster)} natively, faster but not token for token the same (python -m minfer.quality "
            f"measures how close): dtype={faster[0]!r} chooses it")


def choose_pointwise(requested: PointwiseBackendName, device: torch.device) -> Choice:
    """The per-token steps' backend (``pointwise.resolve_pointwise_backend``), with the reason for it."""
    backend = pointwise.resolve_pointwise_backend(requested, device)
    if requested != "auto":
        return Choice(backend, f"pointwise_backend={requested!r}")
    if backend == "cpp":
        return Choice(backend, "auto: the compiled kernels build here")
    return Choice(backend, f"auto: {pointwise.problem(device.type)}")


def choose_quantized(requested: LinearBackendName, dtype: torch.dtype, device: torch.device) -> Choice:
    """The quantized products' kernel: minfer's C++ kernel where ``linear_backend`` allows it and it runs here, else
    the PyTorch reference (dequantize, then ``x @ W``)."""
    if requested == "torch":
        return Choice("torch", "linear_backend='torch': dequantize, then x @ W")
    why = quant_linear.cpp_problem(dtype, device)
    if requested == "cpp":
        if why:
            raise ValueError(f"linear_backend='cpp' cannot multiply quantized weights here: {why}; use 'torch' or "
                             "'auto'")
        return Choice("cpp", "linear_backend='cpp'")
    if requested != "auto":
        raise ValueError(f"linear_backend={requested!r} multiplies float weights only; quantized weights run on "
                         "'cpp', 'torch' or 'auto'")
    if why:
        return Choice("torch", f"auto: {why}; the reference dequantizes, then x @ W")
    return Choice("cpp", "auto: the quantized C++ kernel runs here")


def quantized_copy(weights: WeightFormat, name: str, in_out: Tensor, file_blocks: Mapping[str, QuantizedWeight],
                   lm_head: bool = False) -> tuple[QuantizedWeight, str]:
    """The product weight ``in_out`` (``[in, out]``, parameter ``name``) in the format ``weights`` names, and where
    the copy came from: the GGUF's own blocks for it, when they are exactly this weight (a GGUF converted to float32
    is their exact dequantization; a weight written since, or loaded in another dtype, is not), else quantized now.
    q4 follows the GGUF's mix: 4 bits for the layers, int8 (Q8_0) for the LM head, the largest single matrix and the
    one whose rounding every logit sees."""
    blocks = file_blocks.get(name)
    if blocks is not None and blocks.shape == tuple(in_out.shape) and torch.equal(blocks.dequantize(),
                                                                                  in_out.float()):
        kind = "Q4_1" if isinstance(blocks, Q4Weight) else "Q8_0"
        return blocks, f"{quant_linear.format_of(blocks)}: the GGUF's own {kind} blocks"
    quantized = (quantize_q4 if weights == "q4" and not lm_head else quantize_int8)(in_out)
    return quantized, f"{quant_linear.format_of(quantized)}: quantized at build, groups of {quantized.group}"


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
               pointwise_backend: PointwiseBackendName = "auto", weights: WeightFormat = "dtype",
               gguf: Path | None = None) -> LlamaModel:
    """A copy of ``model``'s module tree, sharing its weights, with every stand-in that ``linear_backend``,
    ``pointwise_backend`` and ``weights`` choose swapped in. ``model`` is left as it was. ``gguf``: the file the
    model was converted from, whose blocks ``weights="q4"`` takes as they are. ``describe`` on the result lists the
    swaps."""
    pointwise_choice = choose_pointwise(pointwise_backend, model.device)
    fast = cast(LlamaModel, share_weights(model))
    compiled = pointwise_choice.backend == "cpp"
    activation = pointwise.kernels().silu_mul if compiled else silu_mul
    if weights != "dtype":
        return swap_in(fast, quantized_stand_in(fast, linear_backend, weights, gguf, pointwise_choice, activation))
    products_choice = choose_products(linear_backend, model.dtype, model.device)
    packing = products_choice.backend != "torch"

    def stand_in(name: str, module: nn.Module) -> tuple[nn.Module | None, Choice]:
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

    return swap_in(fast, stand_in)


StandIn = Callable[[str, nn.Module], tuple[nn.Module | None, Choice]]  # (name, plain module) -> (stand-in, why)


def quantized_stand_in(fast: LlamaModel, linear_backend: LinearBackendName, weights: WeightFormat,
                       gguf: Path | None, pointwise_choice: Choice, activation: Callable[[Tensor], Tensor]) -> StandIn:
    """``stand_in`` for quantized weights: each product on its quantized copy (``quantized_copy``), by the kernel
    ``choose_quantized`` picks; the norms and rotary as ``pointwise_backend`` chooses."""
    from minfer.quant.gguf import read_blocks

    kernel = choose_quantized(linear_backend, fast.dtype, fast.device)
    file_blocks = read_blocks(gguf, fast.config) if weights == "q4" and gguf is not None else {}
    compiled = pointwise_choice.backend == "cpp"

    def stand_in(name: str, module: nn.Module) -> tuple[nn.Module | None, Choice]:
        if isinstance(module, (RMSNorm, ApplyRotary)):
            if not compiled:
                return None, pointwise_choice
            return (CompiledRMSNorm(module) if isinstance(module, RMSNorm) else CompiledRotary()), pointwise_choice
        if isinstance(module, LMHead):
            head = "embed_tokens.weight" if fast.lm_head is None else "lm_head.weight"
            copy, source = quantized_copy(weights, head, fast.lm_head_weight.t(), file_blocks, lm_head=True)
            new: nn.Module = QuantizedLMHead(fast.lm_head_weight, copy, kernel.backend)
        elif isinstance(module, Linear):
            copy, source = quantized_copy(weights, f"{name}.weight", module.weight, file_blocks)
            new = (QuantizedGateUp(module, copy, kernel.backend, activation) if isinstance(module, GateUp)
                   else QuantizedLinear(module, copy, kernel.backend))
        else:
            raise TypeError(type(module).__name__)
        return new, Choice(f"{kernel.backend}, {source}", f"weights={weights!r}; {kernel.why}")

    return stand_in


def swap_in(fast: LlamaModel, stand_in: StandIn) -> LlamaModel:
    """Put ``stand_in``'s module in place of each plain one in ``fast`` (the model's copy), and record the swaps."""
    swaps: Counter[tuple[str, str, str, str]] = Counter()
    for parent_name, parent in list(fast.named_modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, (Linear, LMHead, RMSNorm, ApplyRotary)):
                continue
            new, choice = stand_in(f"{parent_name}.{name}" if parent_name else name, child)
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
