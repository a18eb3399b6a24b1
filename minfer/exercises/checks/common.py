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
