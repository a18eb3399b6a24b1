"""The executor contract: what runs a step the scheduler planned, and what the engine must know at start.

The engine has two executors and cannot tell them apart:

* ``ModelRunner`` (``runner.py``) runs the real model: one forward pass, one sampled token per request
  whose chunk reached its last token. The engine times the step by the wall clock.
* ``SimExecutor`` (``sim/executor.py``) runs no model: a placeholder token, and a step time from the
  roofline cost model of a chosen GPU.

Both take a ``SchedulerOutput`` -- the whole plan of the step, block tables and KV block copies (swap
preemption) included -- and return a ``ModelOutput``. Neither reads the scheduler or the block pool: what
they need travels in the plan. And both are built by a function that returns an ``ExecutorSetup``: the executor
plus the facts the engine needs before its first step (how many KV blocks fit, the longest sequence, the
tokenizer if any).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from minfer.config import EngineConfig
from minfer.plan import SchedulerOutput
from minfer.units import parse_bytes

if TYPE_CHECKING:  # annotations only: the contract does not depend on a model or a tokenizer
    from minfer.kv.cache import PagedKVCache
    from minfer.model.tokenizer import Tokenizer


@dataclass(slots=True)
class Query:
    """What one request computes in a forward pass: ``token_ids`` at positions ``start, start + 1, ...``, their K/V
    stored through its ``block_table`` (a scheduled chunk, and its guesses if it speculates; or a draft's token)."""

    token_ids: list[int]
    start: int
    block_table: list[int]


@dataclass(slots=True)
class ModelOutput:
    """What one step produced."""

    sampled: dict[str, int] = field(default_factory=dict)  # request id → its next token
    duration: float | None = None  # modelled seconds (simulator); None: the engine measures the wall clock
    # speculative decoding (a chunk with lookahead): the guesses each request verified, and those it kept -- its
    # new tokens are the kept guesses, then its sampled token
    proposed: dict[str, int] = field(default_factory=dict)  # request id → guesses verified this step
    accepted: dict[str, list[int]] = field(default_factory=dict)  # request id → guesses kept, in order


class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> ModelOutput:
        """Make the step's KV block copies (swap-outs, then swap-ins), then compute its chunks; sample a token
        for every chunk that reaches its request's last token. A decode with lookahead slots may first guess up to
        that many tokens and verify them in the same pass (speculative decoding)."""
        ...


@dataclass(slots=True)
class ExecutorSetup:
    """An executor and what the engine must know before its first step."""

    executor: Executor
    num_blocks: int  # KV blocks that fit in the memory budget
    max_model_len: int  # the longest sequence (prompt + output) a request may reach
    tokenizer: Tokenizer | None = None  # None: prompts must be token ids (the simulator)
    vocab_size: int | None = None  # None: token ids are not checked (the simulator has no vocabulary)
    eos_token_ids: tuple[int, ...] = ()
    model: Any = None  # the loaded model, if any (notebooks reuse its weights)
    kv_cache: PagedKVCache | None = None  # the real KV cache, if any
    kv_block_bytes: int = 0  # bytes of K/V one block holds (all layers): what a swapped block moves
    num_swap_blocks: int = 0  # host blocks for swapped-out K/V (preemption_mode="swap"; else 0)


def num_swap_blocks(config: EngineConfig, kv_block_bytes: int) -> int:
    """Host blocks swap preemption may fill: ``num_swap_blocks``, else what ``swap_space`` holds (0 unless
    ``preemption_mode="swap"``: recompute needs no host memory)."""
    if config.preemption_mode != "swap":
        return 0
    if config.num_swap_blocks is not None:
        return config.num_swap_blocks
    return parse_bytes(config.swap_space, "swap_space") // kv_block_bytes
