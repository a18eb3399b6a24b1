"""What several checkers share: the tiny random model, loaded once per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.kv.block_pool import BlockPool, BlockPoolError, PoolSnapshot


@functools.lru_cache(maxsize=1)
def tiny_model() -> Any:
    from minfer.model.loader import tiny_random_model

    return tiny_random_model(seed=3)


def tiny_engine(**config: Any) -> LLMEngine:
    """An engine on the 2-layer random model (vocabulary 320): seconds for a whole run. The PyTorch reference
    attention unless asked otherwise: it needs no compiler, so every check runs the same everywhere."""
    from minfer.model.tokenizer import ByteTokenizer

    config = {"attention_backend": "torch", **config}
    return LLMEngine(EngineConfig(model="tiny-random", **config), model=tiny_model(), tokenizer=ByteTokenizer())


def sim_engine(**config: Any) -> LLMEngine:
    """The scheduler on a simulated GPU: no model at all, exactly reproducible."""
    config = {"model": "llama-3-8b", "hardware": "H100-SXM", **config}
    return LLMEngine(EngineConfig(executor="sim", **config))


def cpu_sim_engine(**config: Any) -> LLMEngine:
    """The scheduler on the course machine, simulated: SmolLM2-135M's shape on the fitted ``cpu-2core`` spec."""
    return sim_engine(model="smollm2-135m", hardware="cpu-2core", **config)


def greedy(max_tokens: int) -> SamplingParams:
    """Exactly ``max_tokens`` tokens, greedy: the same tokens, and so the same schedule, every run."""
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def unchanged(pool: BlockPool, before: PoolSnapshot, what: str) -> None:
    after = pool.snapshot()
    assert after == before, f"{what} must change nothing, but the pool changed: {diff(before, after)}"


def diff(a: PoolSnapshot, b: PoolSnapshot) -> str:
    out = []
    for name in ("tables", "num_tokens", "ref_counts", "free"):
        if getattr(a, name) != getattr(b, name):
            out.append(f"{name} {getattr(a, name)} -> {getattr(b, name)}")
    return "; ".join(out) or "(snapshots differ)"


def refused(pool: BlockPool, method: Callable[..., object], *args: Any, why: str = "") -> None:
    """``method(*args)``, a method of ``pool``, must raise ``BlockPoolError`` and change nothing: a refusal checks
    everything before it takes anything."""
    call = f"{method.__name__}({', '.join(map(repr, args))})"
    before = pool.snapshot()
    try:
        method(*args)
    except BlockPoolError:
        pass
    else:
        raise AssertionError(f"{call} should raise BlockPoolError" + (f": {why}" if why else ""))
    unchanged(pool, before, f"a refused {call}")


def schedule(engine: LLMEngine) -> list[str]:
    """What the scheduler decided, step by step: who computed which tokens, who was admitted or preempted."""
    return [f"{t.describe()}{' admit:' + ','.join(t.admitted) if t.admitted else ''}" for t in engine.trace]


def same_schedule_as_reference(t, exercise: str, build: Callable[[], LLMEngine], max_steps: int = 3000) -> None:
    """Run the workload ``build()`` makes with the code as it is, then with the reference of ``exercise``
    swapped in, and require the very same decisions in every step (invariants checked after each)."""
    from minfer.exercises.standin import StandIns

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
