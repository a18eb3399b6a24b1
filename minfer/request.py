"""A request's life: what the user asked for, what the engine has computed, and what it reports back.

The scheduler sees a request as two numbers: ``num_tokens`` (prompt + generated so far) and
``num_computed_tokens`` (how many of those already have K/V in the cache). A step computes some of the
difference: the whole gap of a fresh prompt is a *prefill* (in chunks), a gap of one -- the token
sampled last step -- is a *decode*. Preemption sets ``num_computed_tokens`` back to 0; a prefix-cache
hit moves it forward. There is no other state to keep in sync.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import torch

FINISH_REASONS = ("stop", "length", "abort", "rejected", "timeout")


class RequestStatus(enum.Enum):
    PENDING = "pending"  # arrival_time is still in the future
    WAITING = "waiting"  # in the queue: never ran, or preempted
    RUNNING = "running"  # holds KV blocks and is scheduled every step
    FINISHED = "finished"


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop, per request (the vLLM names and defaults)."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1  # keep the k most likely tokens; -1 = all
    seed: int | None = None  # per-request seed: the same tokens whatever else shares the batch
    stop: list[str] | str | None = None  # stop strings (not included in the returned text)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field and its allowed range."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}")
        if self.stop is not None and any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

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
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it, or why it was refused
    generator: torch.Generator | None = None  # the per-request random stream when params.seed is set
    block_hashes: list[int] = field(default_factory=list)  # hash chain of its full blocks (prefix caching)
    admitted_seq: int = -1  # order of its latest admission: preemption takes the most recent first
    metrics: RequestMetrics = field(init=False)
    num_tokens: int = field(init=False)  # prompt + output; a field, read by the scheduler every step

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    def append_token(self, token: int) -> None:
        """The only way output grows, so ``num_tokens`` stays equal to prompt + output."""
        self.output_token_ids.append(token)
        self.num_tokens += 1

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
    finish_reason: str | None  # None while running; then one of FINISH_REASONS
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
