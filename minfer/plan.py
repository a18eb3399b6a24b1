"""The plan of one step: the contract between the scheduler, which writes it, and the executors, which run it.

Every step, ``Scheduler.schedule()`` hands the engine a ``SchedulerOutput``: which requests compute which tokens
(``ScheduledChunk``, each with its request's block table), and which KV blocks move between device and host
memory first. The executors -- the real model (``runner.py``) and the simulator (``sim/executor.py``) -- read
nothing else: no scheduler, no block pool. So the plan's types live here, apart from the scheduler, and both
sides import them (vLLM keeps its plan types apart the same way, in ``v1/core/sched/output.py``).

The step's budgets (``StepBudget``) are here too: how many tokens one step may compute is part of what a plan
may hold, and the runner sizes its largest forward pass by the same numbers the scheduler spends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a plan is plain data
    from minfer.config import EngineConfig
    from minfer.request import Request


@dataclass(slots=True)
class ScheduledChunk:
    """Tokens ``start .. start + num_tokens`` of one request, computed in this step."""

    request: Request
    start: int
    num_tokens: int
    is_decode: bool  # one token, the one sampled last step (else: a prompt chunk, or a recompute)
    block_table: list[int]  # the request's KV blocks in token order (the pool's list: read it in this step only)

    @property
    def samples(self) -> bool:
        """Does this chunk reach the request's last token? Then the step samples its next token."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """The plan of one step: everything an executor needs, and what changed in the queues."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # left the queue this step
    preempted: list[Request] = field(default_factory=list)  # lost their blocks this step
    finished: list[Request] = field(default_factory=list)  # ended by the scheduler: rejected, timeout
    num_cached_tokens: int = 0  # prompt tokens that admission found in the prefix cache
    # KV block copies between device and host memory (preemption_mode="swap"), per request id. The executor makes
    # them before the forward pass, swap-outs first: a device block a swap-out frees may be refilled this step.
    swap_out: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (device block, host block) pairs
    swap_in: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (host block, device block) pairs

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_decode)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for c in self.chunks if c.is_decode)

    @property
    def has_work(self) -> bool:
        """Anything for an executor to do: tokens to compute, or KV blocks to copy."""
        return bool(self.chunks or self.swap_out or self.swap_in)


@dataclass(slots=True)
class StepBudget:
    """What one step may still compute: tokens of any kind, prompt tokens, and prefill chunks."""

    tokens: int  # every token: prompt chunks and decodes (max_num_batched_tokens)
    prompt: int  # prompt (or recompute) tokens (chunked_prefill_size)
    chunks: int  # prompts the step may work on (max_prefill_chunks_per_step)

    @classmethod
    def from_config(cls, config: EngineConfig, max_model_len: int) -> StepBudget:
        """A whole step's budgets, the one place they come from. Unchunked, a whole prompt is one step's prompt
        budget; the token budget defaults to a full prompt budget plus one decode per sequence."""
        prompt = config.chunked_prefill_size if config.enable_chunked_prefill else max_model_len
        tokens = config.max_num_batched_tokens or prompt + config.max_num_seqs
        return cls(tokens, prompt, config.max_prefill_chunks_per_step)

    def prefill_chunk(self, remaining: int) -> int:
        """How many of a prompt's ``remaining`` tokens this step may compute: as many as both token budgets
        allow, if a chunk is left -- else 0. What is left waits for the next step (chunked prefill)."""
        # BEGIN EXERCISE E5.1
        if self.chunks <= 0:
            return 0
        return min(remaining, self.prompt, self.tokens)
        # END EXERCISE

    def spend(self, num_tokens: int, decode: bool) -> None:
        """Account for ``num_tokens`` just scheduled: a decode takes them from the token budget only; a prompt
        chunk from the token and the prompt budgets, and it uses up one chunk."""
        # BEGIN EXERCISE E5.1
        self.tokens -= num_tokens
        if not decode:
            self.prompt -= num_tokens
            self.chunks -= 1
        # END EXERCISE
