"""minfer: a compact, readable LLM inference engine, and the course that builds it.

    from minfer import LLM, SamplingParams
    llm = LLM("smollm2-135m")
    llm.generate(["What is the capital of France?"], SamplingParams(max_tokens=32, temperature=0))
"""

from minfer.config import EngineConfig
from minfer.engine import LLM, LLMEngine
from minfer.kv.block_pool import BlockPool, PoolSnapshot
from minfer.request import CompletionOutput, RequestMetrics, RequestOutput, SamplingParams
from minfer.trace import StepTrace

__all__ = ["LLM", "BlockPool", "CompletionOutput", "EngineConfig", "LLMEngine", "PoolSnapshot",
           "RequestMetrics", "RequestOutput", "SamplingParams", "StepTrace"]
__version__ = "0.1.0"
