"""The roofline cost model: how long one engine step takes, from its shape alone.

A kernel takes at least ``FLOPs / peak FLOP/s`` (arithmetic) and at least ``bytes / bandwidth``
(memory traffic); the roofline says it takes the larger. A step is three such parts, run one after another:

* **Linear layers** (q/k/v/o projections, the MLP, the LM head): ``2 × tokens × parameters`` FLOPs, but the
  weights are read from memory only *once per step*, however many tokens share it. A decode step of a few
  requests is therefore memory-bound (its time is the weight read), and adding more decodes is almost
  free -- until the FLOPs catch up. That is why batching works, and where it stops paying.
* **Prefill attention**: every new token against every earlier token of its request (causal), a quadratic
  number of FLOPs on a context read once per chunk -- compute-bound.
* **Decode attention**: one query per request against its whole context: few FLOPs per byte of K/V read,
  so memory-bound; its cost grows with the total context of the batch, not with the number of requests.

Plus overheads the roofline does not see: a fixed one per step (scheduling, launches), one per token
(elementwise work: norms, rotary, activations) and one per sampled token (per-request work: sampling,
detokenizing, a decode's own attention setup). A GPU kernel streams
weights while it computes, so its time is the *larger* of the two; a CPU running small matrix products
mostly does one and then the other: ``HardwareSpec.overlap`` (1 → max, 0 → sum) says which. Everything a step
needs to be priced is summed into a ``StepShape`` in one pass over the scheduled chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.sim.hardware import HardwareSpec
from minfer.sim.models import DTYPE_BYTES, ModelSpec


@dataclass(slots=True)
class StepShape:
    """What a step computes, reduced to the sums the cost model needs."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    prefill_pairs: int = 0  # (query, key) pairs of the prefill tokens: each sees its request's earlier tokens
    prefill_context: int = 0  # keys the prefill chunks read: each chunk its whole context, once
    decode_context: int = 0  # keys the decode tokens read: the sum of their context lengths
    num_sampled: int = 0  # tokens whose logits are computed (one per request that samples)

    def add(self, start: int, num_tokens: int, is_decode: bool, samples: bool) -> None:
        """Tokens ``start .. start + num_tokens`` of one request (positions count from 0)."""
        end = start + num_tokens
        if is_decode:
            self.num_decode_tokens += num_tokens
            self.decode_context += end
        else:
            self.num_prefill_tokens += num_tokens
            self.prefill_pairs += num_tokens * start + num_tokens * (num_tokens + 1) // 2
            self.prefill_context += end
        self.num_sampled += samples

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


def roofline_terms(model: ModelSpec, dtype: str, shape: StepShape) -> list[tuple[float, float]]:
    """``(FLOPs, bytes)`` of the step's three parts: linear layers, prefill attention, decode attention."""
    c = model.config
    elem = DTYPE_BYTES[dtype]
    kv = model.kv_bytes_per_token(dtype)
    head = model.lm_head_parameters if shape.num_sampled else 0  # no token samples: the LM head does not run
    linear = (2 * shape.num_tokens * model.layer_matmul_parameters + 2 * shape.num_sampled * head,
              (model.layer_matmul_parameters + head) * elem)
    per_pair = 4 * c.num_layers * c.num_heads * c.head_dim  # q·k and p·v, every head, every layer
    # attention reads the context's K/V and writes the new tokens' K/V
    prefill = (per_pair * shape.prefill_pairs, kv * (shape.prefill_context + shape.num_prefill_tokens))
    decode = (per_pair * shape.decode_context, kv * (shape.decode_context + shape.num_decode_tokens))
    return [linear, prefill, decode]


@dataclass(slots=True)
class RooflineCost:
    """Prices steps of ``model`` in ``dtype`` on ``hardware``."""

    model: ModelSpec
    hardware: HardwareSpec
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        self.hardware.flops(self.dtype)  # fails early, naming the dtypes the hardware knows

    def parts(self, shape: StepShape) -> dict[str, float]:
        """Seconds per part of the step (for plots that show where the time goes)."""
        hw, flops = self.hardware, self.hardware.flops(self.dtype)
        names = ("linear", "prefill_attention", "decode_attention")
        out = {}
        for name, (f, b) in zip(names, roofline_terms(self.model, self.dtype, shape)):
            compute, memory = f / flops, b / hw.memory_bandwidth
            out[name] = max(compute, memory) + (1 - hw.overlap) * min(compute, memory)
        out["overhead"] = (hw.step_overhead + hw.token_overhead * shape.num_tokens
                           + hw.sample_overhead * shape.num_sampled)
        return out

    def step_time(self, shape: StepShape) -> float:
        return sum(self.parts(shape).values())

    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.dtype)
