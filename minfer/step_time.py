"""Where one forward step's time goes: a stopwatch on every module of the model, and a count of its operators.

The roofline (``minfer.roofline``) says how long a decode step *must* take: every weight streamed from memory
once, at the measured bandwidth. A measured step takes longer, and chapter 01 asks where the rest goes. Three
instruments answer it, all measured, nothing assumed:

* ``time_step_parts`` times each module of the model with forward hooks and keeps each one's *own* time (its
  children's taken out), grouped by what the roofline counts: the weight products (the bytes it charges), the
  norms and rotary, attention with each layer's own code (cache writes, softmax over the context, residual
  adds), and what runs outside the model (sampling, the Python around the step);
* ``time_products`` times the step's weight products alone, called again with the inputs they got in the step:
  the step's time minus theirs is the rest of the step, measured without a stopwatch inside it;
* ``operator_calls`` counts the PyTorch operators one step dispatches, and ``dispatch_cost`` times one tiny
  operator, so their product estimates what the calls cost before any arithmetic happens.

Hooks cost a few microseconds per module call; the step's time without them is reported beside, so the reader
sees what the stopwatch itself adds. On a GPU each hook synchronizes the device (kernels run asynchronously, so
a clock alone would time their launch); the parts then add up to a slower, serialized step.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from minfer.roofline import best_time

# module class -> part of the step (classes of the plain model and of the speed-up layer's stand-ins)
PARTS: dict[str, tuple[str, ...]] = {
    "weight products": ("Linear", "GateUp", "LMHead", "PackedLinear", "PackedGateUp", "CompiledGateUp",
                        "PackedLMHead", "QuantizedLinear", "QuantizedGateUp", "QuantizedLMHead"),
    "norms and rotary": ("RMSNorm", "CompiledRMSNorm", "RotaryEmbedding", "ApplyRotary", "CompiledRotary"),
}
LAYER_CODE = "attention and the layers' own code"  # any other module: attention, cache writes, residual adds
OUTSIDE = "outside the model (sampling, Python)"


def part_of(module: nn.Module) -> str:
    name = type(module).__name__
    return next((part for part, classes in PARTS.items() if name in classes), LAYER_CODE)


@dataclass(slots=True)
class StepParts:
    """Seconds of one step: the median step without the stopwatch, and the median step with it, part by part."""

    wall_s: float  # the step as it runs, no hooks
    timed_wall_s: float  # the step with a stopwatch on every module
    parts: dict[str, float] = field(default_factory=dict)  # part -> seconds; OUTSIDE = timed_wall_s - the rest

    def table(self) -> str:
        rows = [f"  {part:40s} {s * 1e3:7.1f} ms  {s / self.timed_wall_s:4.0%}" for part, s in self.parts.items()]
        return "\n".join([*rows, f"  {'the step, timed part by part':40s} {self.timed_wall_s * 1e3:7.1f} ms",
                          f"  {'the step without the stopwatch':40s} {self.wall_s * 1e3:7.1f} ms"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``step``, the device waited for before and after."""
    _sync(device)
    start = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - start


def time_step_parts(step: Callable[[], object], model: nn.Module, reps: int = 5) -> StepParts:
    """Run ``step`` (one forward step of ``model``, sampling included) ``reps`` times with and without a
    stopwatch on every module; a module's own time is its time minus its timed children's."""
    device = next(model.parameters()).device
    step()  # warm-up: first calls allocate and pick kernels
    wall = statistics.median(_timed(step, device) for _ in range(reps))
    stack: list[list[float]] = []  # per open module: [start, children's seconds]
    own: dict[str, float] = defaultdict(float)

    def before(module: nn.Module, args: object) -> None:
        _sync(device)
        stack.append([time.perf_counter(), 0.0])

    def after(module: nn.Module, args: object, output: object) -> None:
        _sync(device)
        start, children = stack.pop()
        elapsed = time.perf_counter() - start
        own[part_of(module)] += elapsed - children
        if stack:
            stack[-1][1] += elapsed

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(before),
                                                    m.register_forward_hook(after))]
    try:
        per_rep: list[dict[str, float]] = []
        walls = []
        for _ in range(reps):
            own.clear()
            walls.append(_timed(step, device))
            per_rep.append({**own, OUTSIDE: walls[-1] - sum(own.values())})
    finally:
        for h in handles:
            h.remove()
    middle = sorted(range(reps), key=walls.__getitem__)[reps // 2]  # the median step, whole: its parts add up
    parts = {p: per_rep[middle].get(p, 0.0) for p in (*PARTS, LAYER_CODE, OUTSIDE)}
    return StepParts(wall_s=wall, timed_wall_s=walls[middle], parts=parts)


def time_products(step: Callable[[], object], model: nn.Module, reps: int = 5) -> float:
    """Seconds of ``step``'s weight products alone: one call of ``step`` records every product's inputs, in the
    order it calls them; then those calls run again with the same inputs, nothing between them, ``reps`` times (the
    median). The step's time minus this is what the rest of it costs: attention, norms, sampling, the Python around
    them -- no stopwatch inside the step, so nothing of its own is added to either side."""
    device = next(model.parameters()).device
    calls: list[tuple[nn.Module, tuple[object, ...]]] = []
    handles = [m.register_forward_pre_hook(lambda module, args: calls.append((module, args)))
               for m in model.modules() if part_of(m) == "weight products"]
    try:
        step()
    finally:
        for h in handles:
            h.remove()

    @torch.inference_mode()
    def products() -> None:
        for module, args in calls:
            module(*args)

    products()  # warm-up, as the step itself was warm
    return statistics.median(_timed(products, device) for _ in range(reps))


class _CountOperators(TorchDispatchMode):
    """Counts every PyTorch operator that reaches a kernel while it is active (and runs it unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def operator_calls(step: Callable[[], object]) -> int:
    """How many PyTorch operators one call of ``step`` runs: each one a trip through PyTorch's dispatcher to a
    kernel (``x @ W`` is one ``mm``; a composite such as ``matmul`` counts as the operators it becomes). Kernels
    of the speed-up layer called outside the dispatcher are not counted."""
    with _CountOperators() as counter:
        step()
    return counter.calls


def dispatch_cost(reps: int = 2000) -> float:
    """Seconds one trivial operator takes on this CPU (adding two 1-element tensors): Python's call, PyTorch's
    dispatch and an allocation, with next to no arithmetic -- the floor every operator call pays."""
    a, b = torch.ones(1), torch.ones(1)
    return best_time(lambda: [torch.add(a, b) for _ in range(reps)], reps=5) / reps
