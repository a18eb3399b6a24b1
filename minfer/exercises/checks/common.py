"""What several checkers share: the tiny random model, loaded once per process."""

from __future__ import annotations

import functools
from typing import Any

from minfer import EngineConfig, LLMEngine


@functools.lru_cache(maxsize=1)
def tiny_model() -> Any:
    from minfer.model.loader import tiny_random_model

    return tiny_random_model(seed=3)


def tiny_engine(**config: Any) -> LLMEngine:
    """An engine on the 2-layer random model (vocabulary 320): seconds for a whole run."""
    from minfer.model.tokenizer import ByteTokenizer

    return LLMEngine(EngineConfig(model="tiny-random", **config), model=tiny_model(), tokenizer=ByteTokenizer())


def sim_engine(**config: Any) -> LLMEngine:
    """The scheduler on a simulated GPU: no model at all, exactly reproducible."""
    config = {"model": "llama-3-8b", "hardware": "H100-SXM", **config}
    return LLMEngine(EngineConfig(executor="sim", **config))
