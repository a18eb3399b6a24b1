"""minfer: a compact, readable LLM inference engine, and the course that builds it.

    from minfer import LLM, SamplingParams
    llm = LLM("smollm2-135m")
    llm.generate(["What is the capital of France?"], SamplingParams(max_tokens=32, temperature=0))

The names below are imported when first used, not when ``minfer`` is: importing one low module (say
``minfer.kv.block_pool`` in chapter 03) then loads only what that module needs, and
``tests/test_layers.py`` can check that no module reaches above its layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "minfer.engine", "LLMEngine": "minfer.engine", "EngineConfig": "minfer.config",
    "BlockPool": "minfer.kv.block_pool", "PoolSnapshot": "minfer.kv.block_pool", "StepTrace": "minfer.trace",
    "SamplingParams": "minfer.request", "RequestOutput": "minfer.request", "CompletionOutput": "minfer.request",
    "RequestMetrics": "minfer.request",
}
__all__ = ["LLM", "BlockPool", "CompletionOutput", "EngineConfig", "LLMEngine", "PoolSnapshot", "RequestMetrics",
           "RequestOutput", "SamplingParams", "StepTrace"]

if TYPE_CHECKING:
    from minfer.config import EngineConfig
    from minfer.engine import LLM, LLMEngine
    from minfer.kv.block_pool import BlockPool, PoolSnapshot
    from minfer.request import CompletionOutput, RequestMetrics, RequestOutput, SamplingParams
    from minfer.trace import StepTrace


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'minfer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
