"""EngineConfig: every knob of the engine in one place, checked when it is built.

A bad value fails here, with the field's name and what it accepts, before any weights are loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

POLICIES = ("fcfs", "priority", "fair")
ADMISSIONS = ("optimistic", "reserve")
EXECUTORS = ("model", "sim")
BACKENDS = ("auto", "torch", "triton", "cpp")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TIMEOUT_ACTIONS = ("finish", "promote")


def parse_bytes(value: int | float | str) -> int:
    """``"512MiB"``, ``"2 GB"``, ``1e9`` → bytes."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", value, re.IGNORECASE)
    if not m:
        raise ValueError(f"kv_cache_memory: cannot read {value!r} as a size (examples: '512MiB', '2GB')")
    num, unit, binary = float(m[1]), m[2].upper(), m[3]
    base = 1024 if binary or not unit else 1000
    return int(num * base ** " KMGT".index(unit or " "))


@dataclass(slots=True)
class EngineConfig:
    # what runs
    model: str = "smollm2-135m"  # alias, HF checkpoint dir, .gguf file; with executor="sim" a model spec name
    device: str = "cpu"  # "cpu" or "cuda" ("cuda:1" ...)
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    executor: str = "model"  # "model" (real forward passes) or "sim" (roofline cost model, no weights)
    hardware: str | None = None  # sim only: a hardware spec name such as "H100-SXM"
    attention_backend: str = "auto"  # auto: Triton on CUDA; on CPU "cpp" (compiled kernel) if it builds, else "torch"
    cuda_graphs: bool = True  # capture decode steps in CUDA graphs (CUDA only)
    seed: int = 0  # for requests sampled without their own seed

    # the paged KV cache
    block_size: int = 16
    num_blocks: int | None = None  # None: size from kv_cache_memory (CPU) or gpu_memory_utilization (CUDA)
    kv_cache_memory: int | str = "1GiB"  # CPU budget for KV blocks
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # None: the model's max_position_embeddings

    # the per-step budgets
    max_num_seqs: int = 64  # requests running at once
    max_num_batched_tokens: int | None = None  # tokens per step; None: one full prefill chunk + a decode per seq
    enable_chunked_prefill: bool = True
    chunked_prefill_size: int = 512  # prompt tokens one step may ingest
    max_prefill_chunks_per_step: int = 1  # prompts (chunks) one step may work on
    admission: str = "optimistic"  # "reserve": hold blocks for prompt + max_tokens from admission

    # who goes first, who is refused
    policy: str = "fcfs"
    priority_preemption: bool = False  # policy="priority": a higher-priority arrival may preempt
    tenant_weights: dict[str, float] = field(default_factory=dict)  # policy="fair"; missing tenants weigh 1
    max_waiting: int | None = None  # queue capacity; beyond it requests are rejected at once
    max_queue_time: float | None = None  # seconds a request may wait before it times out (or is promoted)
    queue_timeout_action: str = "finish"  # "finish" (finish_reason "timeout") or "promote"
    ttft_slo: float | None = None  # shed waiting requests that can no longer reach their first token in time
    enable_prefix_caching: bool = False

    record_trace: bool = True  # keep a StepTrace per step (turn off for very long simulations)

    def __post_init__(self) -> None:
        def choice(name: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

        def at_least(name: str, low: float, optional: bool = False) -> None:
            v = getattr(self, name)
            if v is None and optional:
                return
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be >= {low}{' or None' if optional else ''}, got {v!r}")

        choice("policy", POLICIES)
        choice("admission", ADMISSIONS)
        choice("executor", EXECUTORS)
        choice("attention_backend", BACKENDS)
        choice("dtype", DTYPES)
        choice("queue_timeout_action", TIMEOUT_ACTIONS)
        for name, on in (("priority_preemption", self.priority_preemption),
                         ("queue_timeout_action='promote'", self.queue_timeout_action == "promote")):
            if on and self.policy != "priority":
                raise ValueError(f"{name} acts on request priorities: it needs policy='priority', "
                                 f"got policy={self.policy!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.attention_backend == "cpp" and self.device != "cpu":
            raise ValueError("attention_backend='cpp' is a CPU kernel; on CUDA use 'triton' (or 'auto')")
        for name in ("block_size", "max_num_seqs", "chunked_prefill_size", "max_prefill_chunks_per_step"):
            at_least(name, 1)
        for name in ("num_blocks", "max_model_len", "max_num_batched_tokens"):
            at_least(name, 1, optional=True)
        at_least("max_waiting", 0, optional=True)
        for name in ("max_queue_time", "ttft_slo"):
            at_least(name, 0, optional=True)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if parse_bytes(self.kv_cache_memory) <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory!r}")
        if any(w <= 0 for w in self.tenant_weights.values()):
            raise ValueError(f"tenant_weights must all be > 0, got {self.tenant_weights!r}")
        if self.executor == "sim" and self.hardware is None:
            raise ValueError("executor='sim' needs hardware=..., e.g. 'H100-SXM' (see minfer.sim.HARDWARE)")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
