"""The plan of one step: the contract between the scheduler, which writes it, and the executors, which run it.

Every step, ``Scheduler.schedule()`` hands the engine a ``SchedulerOutput``: which requests compute which tokens
(``ScheduledChunk``, each with its request's block table), and which KV blocks move between device and host
memory first. The executors -- the real model (``runner.py``) and the simulator (``sim/executor.py``) -- read
nothing else: no scheduler, no block pool. So the plan's types live here, apart from the scheduler, and both
sides import them (vLLM keeps its plan types apart the same way, in ``v1/core/sched/output.py``).

The step's budgets (``StepBudget``) are here too: how many tokens one step may compute is part of what a plan
may hold, and the runner sizes its largest forward pass by the same numbers the scheduler spends.

And so is *why* the plan is what it is. The scheduler records each decision -- admitted, chunked, preempted, kept
waiting, ended -- as a small record holding the numbers behind it (``Decision``), never as a sentence: tests
assert on the numbers, and the words are rendered from them in one place, ``minfer.viz.narration``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal

from minfer.types import FinishReason

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
    # speculative decoding: slots reserved after a decode's token for up to this many guesses, which the executor
    # proposes and verifies in the same pass (``minfer.spec``); 0: a plain decode, or not a decode
    lookahead: int = 0

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
    # the prefix cache's host tier (host_cache_blocks > 0; ``kv/host_cache.py``): cached blocks the pool evicted this
    # step, copied to host memory with the swap-outs (before their new owners write them), and host copies of a
    # prompt's next blocks, per admitted request, copied back with the swap-ins
    spill: list[tuple[int, int]] = field(default_factory=list)  # (device block, host block) pairs
    load: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (host block, device block) pairs
    decisions: list[Decision] = field(default_factory=list)  # why: admitted, chunked, preempted, kept waiting

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_decode)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for c in self.chunks if c.is_decode)

    @property
    def has_work(self) -> bool:
        """Anything for an executor to do: tokens to compute, or KV blocks to copy."""
        return bool(self.chunks or self.swap_out or self.swap_in or self.spill or self.load)

    @property
    def num_copies(self) -> int:
        """KV blocks the step copies between device and host memory, both ways: swaps and the host tier's."""
        return (sum(map(len, self.swap_out.values())) + sum(map(len, self.swap_in.values())) + len(self.spill)
                + sum(map(len, self.load.values())))


@dataclass(slots=True)
class StepBudget:
    """What one step may still compute: tokens of any kind, prompt tokens, and prefill chunks."""

    tokens: int  # every token: prompt chunks and decodes (max_num_batched_tokens)
    prompt: int  # prompt (or recompute) tokens (chunked_prefill_size)
    chunks: int  # prompts the step may work on (max_prefill_chunks_per_step)

    @classmethod
    def from_config(cls, config: EngineConfig, max_model_len: int) -> StepBudget:
        """A whole step's budgets, the one place they come from. Unchunked, a whole prompt is one step's prompt
        budget; the token budget defaults to a full prompt budget plus one decode per sequence (and its guesses,
        with speculative decoding)."""
        prompt = config.chunked_prefill_size if config.enable_chunked_prefill else max_model_len
        spec = config.speculative
        per_seq = 1 + (spec.num_speculative_tokens if spec is not None else 0)  # a decode, and its guesses
        tokens = config.max_num_batched_tokens or prompt + config.max_num_seqs * per_seq
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


# ---- why: the scheduler's decisions, as data (the engine copies them into StepTrace.decisions) -----------------

PreemptCause = Literal["pool_full", "priority"]
WaitCause = Literal["step_preempted", "token_budget", "chunk_limit", "prompt_budget", "max_num_seqs",
                    "prompt_too_long", "no_free_blocks"]
ChunkLimit = Literal["prompt_budget", "token_budget"]
EndCause = Literal["eos", "stop_token", "stop_string", "max_tokens", "max_model_len", "abort", "rejected",
                   "timeout", "error"]


@dataclass(slots=True, frozen=True)
class Admitted:
    """Left the queue: its first tokens (after a preemption: all it had, and its next) fit the budget and the pool."""

    request: str
    tokens: int  # tokens it computes this step
    blocks: int  # KV blocks it took off the free list
    free_blocks: int  # free blocks before it took them
    cached_tokens: int = 0  # prompt tokens the prefix cache served (both tiers) ...
    loaded_blocks: int = 0  # ... of which these blocks were copied back from its host tier
    resumed: Literal["", "recompute", "swap_in"] = ""  # after a preemption: how its K/V come back
    swapped_blocks: int = 0  # swap_in: blocks copied back from host memory ...
    swapped_tokens: int = 0  # ... holding this many tokens
    kind: Literal["admitted"] = field(default="admitted", init=False)


@dataclass(slots=True, frozen=True)
class Chunked:
    """A prompt (or a recompute) got only part of what it has left: the step's budget ran out at this chunk."""

    request: str
    start: int  # its first token computed this step
    tokens: int  # tokens computed this step
    remaining: int  # tokens it had left before this step
    limit: ChunkLimit  # the budget that ran out
    budget: int  # that budget per step (chunked_prefill_size, or max_num_batched_tokens)
    kind: Literal["chunked"] = field(default="chunked", init=False)


@dataclass(slots=True, frozen=True)
class Preempted:
    """Lost its KV blocks and went back to the front of the queue."""

    request: str
    cause: PreemptCause  # "pool_full": ``by`` needed a block; "priority": ``by`` outranks it and could not start
    by: str  # the request that needed the room (with "pool_full", possibly ``request`` itself)
    victim_rule: str  # the policy's words for whom it preempts first
    tokens: int  # computed tokens it held: copied to host memory, or dropped to be recomputed
    swapped_blocks: int = 0  # blocks copied to host memory (preemption_mode="swap"); 0: it recomputes
    host_full: bool = False  # swap mode, but the host pool could not hold them ...
    host_blocks_needed: int = 0  # ... it needed this many blocks there ...
    host_blocks_free: int = 0  # ... and this many were free
    priority: int = 0  # "priority": its own priority ...
    by_priority: int = 0  # ... and the one of the request that outranks it
    kind: Literal["preempted"] = field(default="preempted", init=False)


@dataclass(slots=True, frozen=True)
class NotAdmitted:
    """The request next in the queue stayed there this step (everyone behind it too: the queue is served in order)."""

    request: str
    cause: WaitCause
    need: int = 0  # no_free_blocks: blocks it needs; prompt_too_long: tokens it needs
    have: int = 0  # ... free blocks; tokens left in the budget; max_num_seqs, chunk limit or prompt budget
    kind: Literal["not_admitted"] = field(default="not_admitted", init=False)


@dataclass(slots=True, frozen=True)
class Ended:
    """Finished, for any reason: stopped, reached a limit, aborted, refused in the queue, or failed."""

    request: str
    reason: FinishReason
    cause: EndCause
    detail: str | int | None = None  # the token, the stop string, the limit reached, or the message
    kind: Literal["ended"] = field(default="ended", init=False)

    @classmethod
    def of(cls, req: Request) -> Ended:
        """Why a finished request ended, read off the request (its finish reason and stop reason)."""
        reason, why = req.finish_reason, req.stop_reason
        assert reason is not None, f"{req.request_id} has not finished"
        if reason == "stop" and isinstance(why, int):
            return cls(req.request_id, reason, "eos" if why in req.eos_token_ids else "stop_token", why)
        if reason == "stop":
            return cls(req.request_id, reason, "stop_string", why)
        if reason == "length":  # max_tokens, or the model's context: the request is then exactly that long
            return (cls(req.request_id, reason, "max_model_len", req.num_tokens) if why is not None
                    else cls(req.request_id, reason, "max_tokens", req.params.max_tokens))
        return cls(req.request_id, reason, reason, why)


Decision = Admitted | Chunked | Preempted | NotAdmitted | Ended
DECISIONS: dict[str, type[Decision]] = {"admitted": Admitted, "chunked": Chunked, "preempted": Preempted,
                                        "not_admitted": NotAdmitted, "ended": Ended}  # kind → record


def decision_from_dict(d: dict) -> Decision:
    """A decision read back from JSON (a saved trace): its ``kind`` names the record."""
    cls = DECISIONS[d["kind"]]
    names = {f.name for f in fields(cls) if f.init}
    return cls(**{k: v for k, v in d.items() if k in names})
