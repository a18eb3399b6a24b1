"""EngineConfig: every knob of the engine in one place, checked when it is built.

A bad value fails here, with the field's name and what it accepts, before any weights are loaded. The
names an option accepts are ``Literal`` types from ``minfer.types``, so the type checker and this check
read the same list.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from minfer import input_checks as check
from minfer.types import (
    AdmissionMode,
    BackendName,
    DType,
    ExecutorName,
    LinearBackendName,
    PointwiseBackendName,
    PolicyName,
    PreemptionMode,
    ResumeRule,
    SpeculativeMethod,
    TimeoutAction,
    WeightFormat,
    allowed,
)
from minfer.units import parse_bytes

POLICIES = allowed(PolicyName)
ADMISSIONS = allowed(AdmissionMode)
EXECUTORS = allowed(ExecutorName)
BACKENDS = allowed(BackendName)
LINEAR_BACKENDS = allowed(LinearBackendName)
POINTWISE_BACKENDS = allowed(PointwiseBackendName)
DTYPES = allowed(DType)
TIMEOUT_ACTIONS = allowed(TimeoutAction)
PREEMPTION_MODES = allowed(PreemptionMode)
RESUME_RULES = allowed(ResumeRule)
WEIGHT_FORMATS = allowed(WeightFormat)

__all__ = ["ADMISSIONS", "BACKENDS", "DTYPES", "EXECUTORS", "LINEAR_BACKENDS", "POINTWISE_BACKENDS", "POLICIES",
           "PREEMPTION_MODES", "RESUME_RULES", "SPECULATIVE_METHODS", "SPEED_UPS", "TIMEOUT_ACTIONS", "WEIGHT_FORMATS",
           "EngineConfig", "SpeculativeConfig", "parse_bytes"]


# Speculative decoding's settings, passed as vLLM passes them -- a plain dict, ``speculative_config={"method": "ngram",
# "num_speculative_tokens": 4}`` -- and checked here once, like every other knob (the mechanism: minfer/spec).
SPECULATIVE_METHODS = allowed(SpeculativeMethod)


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 4  # k: guesses per request per step (the scheduler reserves k lookahead slots)
    # ngram (prompt lookup): match the text's last n tokens, for n from prompt_lookup_max down to prompt_lookup_min
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # early_exit: the draft is the model's first num_draft_layers layers (None: a quarter of them)
    num_draft_layers: int | None = None
    # executor="sim" only: the chance that each guess is right (the simulator has no text to look guesses up in);
    # each request's guesses are then kept up to the first wrong one, as the real verification keeps them
    acceptance_rate: float | None = None

    def __post_init__(self) -> None:
        check.one_of("speculative_config method", self.method, SPECULATIVE_METHODS)
        check.integer("num_speculative_tokens", self.num_speculative_tokens, 1, 64)
        check.integer("prompt_lookup_min", self.prompt_lookup_min, 1)
        check.integer("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        if self.num_draft_layers is not None:
            check.integer("num_draft_layers", self.num_draft_layers, 1)
        if self.acceptance_rate is not None:
            check.real("acceptance_rate", self.acceptance_rate, 0.0, 1.0)

    def draft_layers(self, total: int) -> int:
        """Early exit's draft depth for a ``total``-layer model: ``num_draft_layers``, or a quarter of the layers; a
        draft must stop before the last layer (else it is the model itself). One rule for the engine and the
        simulator."""
        layers = self.num_draft_layers or max(1, total // 4)
        if not 1 <= layers < total:
            raise ValueError(f"num_draft_layers must be in [1, {total - 1}] for this {total}-layer model, got {layers}")
        return layers

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
        """``speculative_config`` as given (None, a dict of vLLM's names, or a ``SpeculativeConfig``) → checked."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(value) - known):
            raise ValueError(f"speculative_config has no field(s) {unknown}; it takes {sorted(known)}")
        return cls(**value)


# What LLM() and the server add to EngineConfig's defaults: every speed-up that runs on this machine, swapped into
# the model once when the engine is built (minfer/accelerate.py). LLMEngine's own default is the plain model that the
# chapters read; the outputs are the same either way, up to the last bits of float rounding.
SPEED_UPS: dict[str, str] = {"linear_backend": "auto", "pointwise_backend": "auto"}


class SimSpec(Protocol):
    """A simulator spec passed as itself rather than by name: a ``minfer.sim`` ``ModelSpec`` or ``HardwareSpec``.
    Those live a layer above the configuration, so it names only what it reads of them; the simulator's executor
    checks which one it got."""

    @property
    def name(self) -> str: ...


@dataclass(slots=True)
class EngineConfig:
    # what runs
    # alias, HF checkpoint dir, .gguf file; with executor="sim" a model spec name or a ModelSpec
    model: str | SimSpec = "smollm2-135m"
    device: str = "cpu"  # "cpu" or "cuda" ("cuda:1" ...)
    dtype: DType = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    executor: ExecutorName = "model"  # "model" (real forward passes) or "sim" (roofline cost model, no weights)
    hardware: str | SimSpec | None = None  # sim only: a hardware spec name such as "H100-SXM", or a spec
    attention_backend: BackendName = "auto"  # a name in minfer.ops.backends.BACKENDS; auto: per device
    # the speed-up layer (minfer/accelerate.py): "torch" runs the plain model as written (the chapters' engine);
    # LLM() and the server ask for "auto" (SPEED_UPS): whatever runs fastest here
    linear_backend: LinearBackendName = "torch"  # matrix products: "torch" (x @ W), "cpp" or "onednn" (packed, CPU)
    pointwise_backend: PointwiseBackendName = "torch"  # RMSNorm, rotary, SiLU-and-mul: "torch" or "cpp" (CPU)
    # how the products' weights are stored (minfer.types.WeightFormat): "dtype" (as loaded), "int8" or "q4"; a
    # quantized product runs minfer's C++ kernel where linear_backend allows it ("cpp", "auto"), else the PyTorch
    # reference (dequantize, then x @ W)
    weights: WeightFormat = "dtype"
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
    admission: AdmissionMode = "optimistic"  # "reserve": hold blocks for prompt + max_tokens from admission

    # preemption: what a victim's KV becomes, and when it may come back
    preemption_mode: PreemptionMode = "recompute"  # "swap": copy its KV blocks to host memory and back
    swap_space: int | str = "4GiB"  # host memory for swapped-out KV blocks (vLLM v0's swap_space, 4 GiB too)
    num_swap_blocks: int | None = None  # None: as many blocks as swap_space holds (0: swap always falls back)
    resume_rule: ResumeRule = "whole"  # "first_chunk": re-admit a victim for its first chunk (can thrash)

    # who goes first, who is refused
    policy: PolicyName = "fcfs"
    priority_preemption: bool = False  # policy="priority": a higher-priority arrival may preempt
    tenant_weights: dict[str, float] = field(default_factory=dict)  # policy="fair"; missing tenants weigh 1
    max_waiting: int | None = None  # queue capacity; beyond it requests are rejected at once
    max_queue_time: float | None = None  # seconds a request may wait before it times out (or is promoted)
    queue_timeout_action: TimeoutAction = "finish"  # "finish" (finish_reason "timeout") or "promote"
    ttft_slo: float | None = None  # shed waiting requests that can no longer reach their first token in time
    enable_prefix_caching: bool = False
    # the prefix cache's second tier (kv/host_cache.py): host blocks that keep prefix blocks the device pool evicts,
    # copied back on a later hit (vLLM's CPU KV offloading, SGLang's HiCache); 0: evicted blocks are gone
    host_cache_blocks: int = 0

    # speculative decoding (minfer/spec, chapter 13): None (off), or vLLM's dict such as {"method": "ngram",
    # "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}; kept as a SpeculativeConfig
    speculative_config: SpeculativeConfig | dict | None = None

    record_trace: bool = True  # keep a StepTrace per step (turn off for very long simulations)
    debug_checks: bool = False  # check scheduler and pool invariants after every step (tests, notebooks)
    # bounded memory for a long-running engine (a server): keep only the most recent finished requests
    # (engine.finished) and steps (engine.trace); None keeps everything, as offline runs and chapters need
    finished_window: int | None = None
    trace_window: int | None = None

    def __post_init__(self) -> None:
        check.one_of("policy", self.policy, POLICIES)
        check.one_of("admission", self.admission, ADMISSIONS)
        check.one_of("executor", self.executor, EXECUTORS)
        check.one_of("attention_backend", self.attention_backend, BACKENDS)
        check.one_of("linear_backend", self.linear_backend, LINEAR_BACKENDS)
        check.one_of("pointwise_backend", self.pointwise_backend, POINTWISE_BACKENDS)
        check.one_of("dtype", self.dtype, DTYPES)
        check.one_of("weights", self.weights, WEIGHT_FORMATS)
        check.one_of("queue_timeout_action", self.queue_timeout_action, TIMEOUT_ACTIONS)
        check.one_of("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check.one_of("resume_rule", self.resume_rule, RESUME_RULES)
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        for name in ("cuda_graphs", "enable_chunked_prefill", "priority_preemption", "enable_prefix_caching",
                     "record_trace", "debug_checks"):
            check.boolean(name, getattr(self, name))
        for name, on in (("priority_preemption", self.priority_preemption),
                         ("queue_timeout_action='promote'", self.queue_timeout_action == "promote")):
            if on and self.policy != "priority":
                raise ValueError(f"{name} acts on request priorities: it needs policy='priority', "
                                 f"got policy={self.policy!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.attention_backend == "cpp" and self.device != "cpu":
            raise ValueError("attention_backend='cpp' is a CPU kernel; on CUDA use 'triton' (or 'auto')")
        if self.linear_backend in ("cpp", "onednn") and self.device != "cpu":
            raise ValueError(f"linear_backend={self.linear_backend!r} packs weights for CPU kernels; on CUDA use "
                             "'torch' (or 'auto')")
        if self.weights != "dtype" and self.linear_backend == "onednn":
            raise ValueError(f"weights={self.weights!r} needs a kernel for quantized weights: linear_backend='cpp' "
                             "(minfer's C++ kernel), 'torch' (the PyTorch reference) or 'auto', not 'onednn'")
        if self.pointwise_backend == "cpp" and self.device != "cpu":
            raise ValueError("pointwise_backend='cpp' is CPU kernels; on CUDA use 'torch' (or 'auto')")
        for name in ("block_size", "max_num_seqs", "chunked_prefill_size", "max_prefill_chunks_per_step"):
            check.integer(name, getattr(self, name), 1)
        for name in ("num_blocks", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) is not None:
                check.integer(name, getattr(self, name), 1)
        for name in ("max_waiting", "num_swap_blocks", "finished_window", "trace_window", "host_cache_blocks"):
            if getattr(self, name) is not None:
                check.integer(name, getattr(self, name), 0)
        for name in ("max_queue_time", "ttft_slo"):
            if getattr(self, name) is not None:
                check.real(name, getattr(self, name), 0.0)
        check.integer("seed", self.seed, 0, check.INT63_MAX)
        check.real("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        if parse_bytes(self.kv_cache_memory) <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory!r}")
        if self.host_cache_blocks and not self.enable_prefix_caching:
            raise ValueError(f"host_cache_blocks={self.host_cache_blocks} keeps evicted prefix-cache blocks: it needs "
                             "enable_prefix_caching=True")
        if parse_bytes(self.swap_space, "swap_space") < 0:
            raise ValueError(f"swap_space must not be negative, got {self.swap_space!r}")
        if not isinstance(self.tenant_weights, dict) or any(
                not isinstance(t, str) or isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0
                for t, w in self.tenant_weights.items()):
            raise ValueError(f"tenant_weights must map tenant names to weights > 0, got {self.tenant_weights!r}")
        if self.executor == "sim" and self.hardware is None:
            raise ValueError("executor='sim' needs hardware=..., e.g. 'H100-SXM' (see minfer.sim.HARDWARE)")

    @property
    def checkpoint(self) -> str:
        """``model`` as the real executor loads it: an alias, directory or file (a ModelSpec describes a model
        only to the simulator)."""
        if not isinstance(self.model, str):
            raise ValueError(f"executor={self.executor!r} loads weights: model must name a checkpoint, got a "
                             f"{type(self.model).__name__} (model specs are for executor='sim')")
        return self.model

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """``speculative_config`` as checked (``__post_init__`` made a dict into a ``SpeculativeConfig``)."""
        spec = self.speculative_config
        return spec if isinstance(spec, SpeculativeConfig) else SpeculativeConfig.parse(spec)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def option_value(text: str) -> object:
    """A setting written on a command line (``--max-num-seqs 8``, ``--config small:policy=fair``) as the value it
    means: a Python literal (``8``, ``0.5``, ``True``, ``None``, ``{"a": 2}``), else the bare word as a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
