"""SimExecutor: the engine's executor without a model. The scheduler cannot tell the difference.

The scheduler needs two things from the executor: a token for every request that reached its last
token, and how long the step took. The simulator answers both without weights: the token is a
placeholder (output lengths come from each request's ``max_tokens``; EOS never happens), and the time
comes from the roofline cost model. The KV pool gets the blocks that the hardware's memory holds after
the weights -- so preemption, admission and batch sizes behave as on the real machine.

Swap preemption's block copies are priced over the host link (``HardwareSpec.host_link_bandwidth``: PCIe, or
NVLink-C2C on a Grace Hopper), before the step's compute and not overlapped with it -- as a step that waits
for its copies before the forward pass does: ``bytes / bandwidth``.

Speculative decoding (``speculative_config`` with ``acceptance_rate``): a decode with ``k`` lookahead slots is priced
as the verification pass it is -- ``k + 1`` query tokens read the request's context once, and ``k + 1`` rows of
logits -- plus nothing for the guesses themselves (prompt lookup costs no model). Whether a guess is right is a draw
at ``acceptance_rate``, keyed by the request and the position (a hash, not a random stream), and a request keeps its
guesses up to the first wrong one. With ``method="early_exit"`` the guesses cost a model: ``k`` draft passes before
the verification, each one token per speculating request through the first ``num_draft_layers`` layers and the LM
head -- priced by the same cost model on a copy of the model cut to those layers (``draft_spec``), one pass after
another because guess ``j + 1`` needs guess ``j``. Acceptance is still the given ``acceptance_rate``: the simulator
knows no weights to ask how often an early exit agrees with the whole model.

Nothing here is random and nothing reads a clock: the same workload gives the same trace, every run.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

from minfer.config import EngineConfig, SpeculativeConfig
from minfer.executor import ExecutorSetup, ModelOutput, num_swap_blocks
from minfer.plan import SchedulerOutput
from minfer.sim.cost import RooflineCost, StepShape
from minfer.sim.hardware import HardwareSpec, get_hardware
from minfer.sim.models import ModelSpec, get_model_spec
from minfer.units import parse_bytes

PLACEHOLDER_TOKEN = 0


def guess_is_right(request_id: str, position: int, rate: float) -> bool:
    """The simulator's stand-in for verification: right with probability ``rate``, the same answer every run."""
    return zlib.crc32(f"{request_id}:{position}".encode()) / 2**32 < rate


class SimExecutor:
    def __init__(self, model: ModelSpec, hardware: HardwareSpec, dtype: str, block_size: int = 16,
                 acceptance_rate: float | None = None, draft: ModelSpec | None = None) -> None:
        self.cost = RooflineCost(model, hardware, dtype)
        self.hardware = hardware
        self.block_bytes = model.kv_bytes_per_token(dtype) * block_size
        self.acceptance_rate = acceptance_rate  # speculative decoding: the chance each guess is right
        # early exit: the draft model whose passes make the guesses (None: guesses cost nothing, as prompt lookup)
        self.draft_cost = RooflineCost(draft, hardware, dtype) if draft is not None else None

    def swap_time(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` KV blocks over the host link (one direction)."""
        if not num_blocks:
            return 0.0
        link = self.hardware.host_link_bandwidth
        if link is None:
            raise ValueError(f"hardware {self.hardware.name!r} has no host_link_bandwidth: KV copies to host memory "
                             "(swap preemption, host_cache_blocks) cannot be priced (set one with dataclasses.replace, "
                             "or use preemption_mode='recompute' and host_cache_blocks=0)")
        return num_blocks * self.block_bytes / link

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        """A placeholder token for each request whose chunk reaches its last token; the modelled seconds: the
        step's KV block copies over the host link, then its compute."""
        copies = out.num_copies  # swaps, and the prefix cache's host tier
        seconds = self.swap_time(copies) if copies else 0.0
        if not out.chunks:
            return ModelOutput({}, seconds)
        shape = StepShape()
        sampled: dict[str, int] = {}
        add = shape.add
        result = ModelOutput(sampled)
        for c in out.chunks:  # the hot loop of a long simulation: one pass, nothing else
            req = c.request
            samples = c.start + c.num_tokens == req.num_tokens
            if c.lookahead:
                self._verify(c.request.request_id, c.start, c.lookahead, shape, result)
            else:
                add(c.start, c.num_tokens, c.is_decode, samples)
            if samples:
                sampled[req.request_id] = PLACEHOLDER_TOKEN
        result.duration = seconds + self.cost.step_time(shape) + self.draft_time(out)
        return result

    def draft_time(self, out: SchedulerOutput) -> float:
        """Seconds of the draft passes before the verification (0 without a draft model): pass ``j`` runs one token
        of every request that wants more than ``j`` guesses, at its position ``start + j``."""
        if self.draft_cost is None:
            return 0.0
        rounds = max((c.lookahead for c in out.chunks), default=0)
        passes = [StepShape() for _ in range(rounds)]
        for c in out.chunks:
            for j in range(c.lookahead):
                passes[j].add(c.start + j, 1, True, True)
        return sum(self.draft_cost.step_time(shape) for shape in passes)

    def _verify(self, request_id: str, start: int, k: int, shape: StepShape, result: ModelOutput) -> None:
        """A decode and its ``k`` guesses: priced as one ``k + 1``-token query with ``k + 1`` rows of logits; its
        guesses kept up to the first wrong one."""
        shape.add(start, k + 1, False, True)
        shape.num_sampled += k
        rate = self.acceptance_rate or 0.0
        kept = 0
        while kept < k and guess_is_right(request_id, start + 1 + kept, rate):
            kept += 1
        result.proposed[request_id] = k
        result.accepted[request_id] = [PLACEHOLDER_TOKEN] * kept


def kv_pool_blocks(config: EngineConfig, model: ModelSpec, hardware: HardwareSpec, dtype: str) -> int:
    """KV blocks that fit: the explicit ``num_blocks``, else the memory left after the weights.

    On a GPU that is ``gpu_memory_utilization`` of its memory minus the weights (activations are ignored);
    on the CPU spec, ``kv_cache_memory``, the same budget the real CPU engine uses."""
    if config.num_blocks is not None:
        return config.num_blocks
    budget: float
    if hardware.device == "cpu":
        budget = parse_bytes(config.kv_cache_memory)
    else:
        budget = hardware.memory_bytes * config.gpu_memory_utilization - model.weight_bytes(dtype)
    block_bytes = model.kv_bytes_per_token(dtype) * config.block_size
    blocks = int(budget // block_bytes)
    if blocks < 1:
        raise ValueError(
            f"{model.name} in {dtype} needs {model.weight_bytes(dtype) / 1e9:.1f} GB of weights; "
            f"{hardware.name} has {hardware.memory_bytes / 1e9:.0f} GB, leaving no room for KV blocks "
            "(use more devices, e.g. hardware='8xH100-SXM', or a smaller model)"
        )
    return blocks


def draft_spec(model: ModelSpec, speculative: SpeculativeConfig) -> ModelSpec:
    """The early-exit draft of ``model``: its first ``speculative.draft_layers(...)`` layers (the engine's rule) with
    its embedding, final norm and LM head."""
    layers = speculative.draft_layers(model.config.num_layers)
    return replace(model, name=f"{model.name} (first {layers} layers)", config=replace(model.config, num_layers=layers))


def build_sim_executor(config: EngineConfig, model: Any = None, tokenizer: Any = None) -> ExecutorSetup:
    """What ``LLMEngine`` needs for ``executor="sim"``: the executor, the number of KV blocks and the maximum
    sequence length -- no weights, no tokenizer (prompts are token ids), no vocabulary, no EOS."""
    if model is not None or tokenizer is not None:
        raise ValueError("executor='sim' runs no model: do not pass model= or tokenizer=")
    if config.hardware is None:
        raise ValueError("executor='sim' needs hardware=..., e.g. 'H100-SXM' (see minfer.sim.HARDWARE)")
    if not isinstance(config.model, (str, ModelSpec)) or not isinstance(config.hardware, (str, HardwareSpec)):
        raise ValueError(f"executor='sim' takes model= a name or a ModelSpec and hardware= a name or a HardwareSpec, "
                         f"got {type(config.model).__name__} and {type(config.hardware).__name__}")
    spec = get_model_spec(config.model)
    hardware = get_hardware(config.hardware)
    dtype = hardware.dtype if config.dtype == "auto" else config.dtype
    limit = spec.config.max_position_embeddings
    speculative = config.speculative
    if speculative is not None and speculative.acceptance_rate is None:
        raise ValueError("executor='sim' models speculative decoding at a given acceptance rate: speculative_config "
                         f"needs acceptance_rate=... (in [0, 1]) with method={speculative.method!r}")
    draft = None
    if speculative is not None and speculative.method == "early_exit":
        draft = draft_spec(spec, speculative)
    executor = SimExecutor(spec, hardware, dtype, config.block_size,
                           speculative.acceptance_rate if speculative is not None else None, draft)
    if (config.preemption_mode == "swap" or config.host_cache_blocks) and hardware.host_link_bandwidth is None:
        executor.swap_time(1)  # raises: say so now, not at the first preemption
    return ExecutorSetup(executor=executor, num_blocks=kv_pool_blocks(config, spec, hardware, dtype),
                         max_model_len=min(config.max_model_len or limit, limit), kv_block_bytes=executor.block_bytes,
                         num_swap_blocks=num_swap_blocks(config, executor.block_bytes))
