"""A request's life: what the user asked for, what the engine has computed, and what it reports back.

The scheduler sees a request as two numbers: ``num_tokens`` (prompt + generated so far) and
``num_computed_tokens`` (how many of those already have K/V in the cache). A step computes some of the
difference: the whole gap of a fresh prompt is a *prefill* (in chunks), a gap of one -- the token
sampled last step -- is a *decode*. Preemption sets ``num_computed_tokens`` back to 0; a prefix-cache
hit moves it forward. There is no other state to keep in sync.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minfer import input_checks
from minfer.types import FinishReason, allowed

if TYPE_CHECKING:
    import torch

FINISH_REASONS = allowed(FinishReason)


class RequestStatus(enum.Enum):
    PENDING = "pending"  # arrival_time is still in the future
    WAITING = "waiting"  # in the queue: never ran, or preempted
    RUNNING = "running"  # holds KV blocks and is scheduled every step
    FINISHED = "finished"


MAX_TEMPERATURE = 100.0


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop, per request (the vLLM names and defaults).

    Every field is checked when the object is built (and again when a request is added, in case it was
    changed since): a wrong type or range raises ``ValueError`` naming the field -- never later, inside a
    step, where it would fail every request in the batch. Values are normalized on the way: a stop string
    becomes a one-element list, tuples become lists, NumPy scalars become Python numbers."""

    max_tokens: int = 16  # >= 1
    temperature: float = 1.0  # 0 = greedy; at most MAX_TEMPERATURE
    top_p: float = 1.0  # nucleus, in (0, 1]: keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1  # keep the k most likely tokens (k >= 1, at most the vocabulary); -1 = all
    seed: int | None = None  # in [0, 2**63 - 1]: the same tokens whatever else shares the batch
    stop: list[str] | str | None = None  # stop strings (not included in the returned text)
    stop_token_ids: list[int] | None = None  # checked against the vocabulary when the request is added
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check (and normalize) every field; raise ``ValueError`` naming the field and its allowed values."""
        self.max_tokens = input_checks.integer("max_tokens", self.max_tokens, 1)
        self.temperature = input_checks.real("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        self.top_p = input_checks.real("top_p", self.top_p, 0.0, 1.0, low_open=True)
        self.top_k = input_checks.integer("top_k", self.top_k, -1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (all tokens) or >= 1, got 0")
        if self.seed is not None:
            self.seed = input_checks.integer("seed", self.seed, 0, input_checks.INT63_MAX)
        if self.stop is not None:
            self.stop = input_checks.text_list("stop", self.stop)
        if self.stop_token_ids is not None:
            self.stop_token_ids = input_checks.integer_list("stop_token_ids", self.stop_token_ids)
        input_checks.boolean("ignore_eos", self.ignore_eos)

    def check_vocabulary(self, vocab_size: int) -> None:
        """What only the engine can check: token ids and ``top_k`` within its model's vocabulary."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k must be -1 or in [1, {vocab_size}] (the vocabulary), got {self.top_k}")
        for t in self.stop_token_ids or ():
            if t >= vocab_size:
                raise ValueError(f"stop_token_ids must be token ids in [0, {vocab_size}), got {t}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps on the engine clock (seconds); the latency figures derive from them."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def queue_time(self) -> float | None:
        """Arrival until first scheduled."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival until the first output token exists."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive output tokens."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (mean ITL)."""
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    @property
    def e2e(self) -> float | None:
        """End-to-end latency: arrival until finished."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    prompt: str | None = None
    priority: int = 0  # lower is served first (policy="priority")
    tenant: str | None = None  # who sent it (policy="fair")
    eos_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it, or why it was refused
    block_hashes: list[int] = field(default_factory=list)  # hash chain of its full blocks (prefix caching)
    admitted_seq: int = -1  # order of its latest admission: preemption takes the most recent first
    metrics: RequestMetrics = field(init=False)
    num_tokens: int = field(init=False)  # prompt + output; a field, read by the scheduler every step
    _generator: torch.Generator | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def generator(self) -> torch.Generator | None:
        """The request's own random stream when ``params.seed`` is set (else None: the engine's stream serves).
        Made when the sampler first asks, so that describing a request imports no torch -- the simulator's
        requests never sample."""
        if self._generator is None and self.params.seed is not None:
            import torch

            self._generator = torch.Generator().manual_seed(self.params.seed)
        return self._generator

    def append_token(self, token: int) -> None:
        """The only way output grows, so ``num_tokens`` stays equal to prompt + output."""
        self.output_token_ids.append(token)
        self.num_tokens += 1

    def truncate_output(self, length: int) -> None:
        """Keep only the first ``length`` output tokens (and their times): the engine re-reads a step's several new
        tokens one at a time (speculative decoding), to stop at the one that completes a stop string."""
        del self.output_token_ids[length:], self.metrics.token_times[length:]
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def max_kv_slots(self, max_model_len: int) -> int:
        """KV slots the request holds at its longest: prompt + ``max_tokens`` within the model's limit, less
        one -- the last sampled token is returned, never fed back, so its K/V is never stored."""
        return min(self.num_prompt_tokens + self.params.max_tokens, max_model_len) - 1

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start..end`` of prompt + output, without concatenating the two lists."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (minfer generates one per request: ``index`` is always 0)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None  # None while running
    stop_reason: str | int | None = None


@dataclass(slots=True)
class RequestOutput:
    """What ``LLMEngine.step`` and ``LLM.generate`` return for a request.

    ``outputs[0]`` holds everything generated so far; ``new_token_ids``/``new_text`` only what this
    step added, for streaming. ``finished`` turns True exactly once, in the last output of a request.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
