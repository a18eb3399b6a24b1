"""The reference solution as plain functions, for hidden cases that compare a student's code with it.

In the instructor's checkout the package files hold the reference; ``StandIns.install(..., always=True)`` compiles
it from there whatever the module holds now (during a check: the student's code). The functions it compiles are
ordinary functions and keep working after the swap is undone, so a case can call the student's code and the
reference side by side -- on the same input, as often as a property-based test likes -- without swapping per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from minfer import LLMEngine
from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns

C = TypeVar("C", bound=type)


def reference_functions(exercise: str) -> dict[str, Callable[..., Any]]:
    """The reference function of each unit of ``exercise``, by its qualified name (``"BlockPool.allocate"``)."""
    with StandIns() as swaps:
        swaps.install([exercise], always=True)
        found: dict[str, Callable[..., Any]] = {}
        for s in swaps.swaps:  # a module-level function also replaces every module's import of it: keep the first
            name = f"{s.owner.__qualname__}.{s.name}" if isinstance(s.owner, type) else s.name
            found.setdefault(name, s.new)
    if not found:
        raise RuntimeError(f"no reference found for {exercise}")
    return found


def reference_class(cls: C, exercise: str) -> C:
    """A subclass of ``cls`` whose methods of ``exercise`` are the reference's (the rest: ``cls``'s own)."""
    methods = {name.split(".")[-1]: f for name, f in reference_functions(exercise).items()
               if name.startswith(f"{cls.__qualname__}.")}
    return type(f"Reference{cls.__name__}", (cls,), methods)  # type: ignore[return-value]


def same_schedule_as_reference(t: Tester, exercise: str, build: Callable[[], LLMEngine], max_steps: int = 3000) -> None:
    """Run the workload ``build()`` makes with the code as it is, then with the reference of ``exercise``
    swapped in, and require the very same decisions in every step (invariants checked after each)."""
    engine = build()
    t.run(engine, max_steps=max_steps)
    with StandIns() as swaps:
        swaps.install([exercise], always=True)
        reference = build()
        t.run(reference, max_steps=max_steps)
    mine, ref = schedule(engine), schedule(reference)
    for i, (a, b) in enumerate(zip(mine, ref)):
        assert a == b, f"step {i} differs from the reference:\n  yours:     {a}\n  reference: {b}"
    assert len(mine) == len(ref), f"{len(mine)} steps, the reference needs {len(ref)}"


def schedule(engine: LLMEngine) -> list[str]:
    """What the scheduler decided, step by step: who computed which tokens, who was admitted or preempted."""
    return [f"{t.describe()}{' admit:' + ','.join(t.admitted) if t.admitted else ''}" for t in engine.trace]
