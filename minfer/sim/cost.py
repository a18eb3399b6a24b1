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

A real engine reaches only part of the datasheet peaks, and less of them in a small step than in a large
one: the ``HardwareSpec`` says how much (``matmul_efficiency`` and ``matmul_half_tokens``, ``bandwidth_efficiency``,
``attention_efficiency``). With every share at 1 -- ``spec.roofline()`` -- the model is the plain roofline, an upper
bound on speed; with the shares a well-tuned engine reaches, it predicts published measurements within a stated
error (``minfer.validate.published``).

Plus overheads the roofline does not see: a fixed one per step (scheduling, launches), one per token (elementwise
work: norms, rotary, activations) and one per sampled token (per-request work: sampling, detokenizing, a decode's
own attention setup). A GPU kernel streams weights while it computes, so its time is the *larger* of the two; a CPU
running small matrix products mostly does one and then the other: ``HardwareSpec.overlap`` (1 → max, 0 → sum) says
which. Everything a step needs to be priced is summed into a ``StepShape`` in one pass over the scheduled chunks.

The arithmetic works on numbers and on numpy arrays alike: ``RooflineCost.step_times`` prices a whole recorded
schedule in one vectorized pass, which is what makes fitting the efficiencies to published tables fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from minfer.sim.hardware import HardwareSpec, larger
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

    def scaled(self, k: int) -> StepShape:
        """The same step with every request ``k`` times over: ``k`` identical requests in lockstep."""
        return StepShape(k * self.num_prefill_tokens, k * self.num_decode_tokens, k * self.prefill_pairs,
                         k * self.prefill_context, k * self.decode_context, k * self.num_sampled)

    @staticmethod
    def stack(shapes: Sequence[StepShape]) -> StepShape:
        """Many steps as one shape of numpy arrays (one entry per step), for vectorized pricing."""
        columns = (np.array([getattr(s, f.name) for s in shapes], dtype=float) for f in fields(StepShape))
        return StepShape(*columns)  # type: ignore[arg-type]  # arrays where one step has ints: the same arithmetic


def roofline_terms(model: ModelSpec, dtype: str, shape: StepShape) -> list[tuple[float, float]]:
    """``(FLOPs, bytes)`` of the step's three parts: linear layers, prefill attention, decode attention."""
    c = model.config
    elem = DTYPE_BYTES[dtype]
    kv = model.kv_bytes_per_token(dtype)
    head = model.lm_head_parameters * (shape.num_sampled > 0)  # no token samples: the LM head does not run
    linear = (2 * shape.num_tokens * model.layer_matmul_parameters + 2 * shape.num_sampled * head,
              (model.layer_matmul_parameters + head) * elem)
    # BEGIN EXERCISE E10.4
    per_pair = 4 * c.num_layers * c.num_heads * c.head_dim  # q·k and p·v, every head, every layer
    # attention reads the context's K/V and writes the new tokens' K/V
    prefill = (per_pair * shape.prefill_pairs, kv * (shape.prefill_context + shape.num_prefill_tokens))
    decode = (per_pair * shape.decode_context, kv * (shape.decode_context + shape.num_decode_tokens))
    # END EXERCISE
    return [linear, prefill, decode]


@dataclass(slots=True)
class RooflineCost:
    """Prices steps of ``model`` in ``dtype`` on ``hardware``.

    ``replicas``: each scheduled request stands for that many identical requests running in lockstep -- a
    way to simulate a batch of thousands of identical requests with a scheduler that sees only dozens."""

    model: ModelSpec
    hardware: HardwareSpec
    dtype: str
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        self.hardware.flops(self.dtype)  # fails early, naming the dtypes the hardware knows
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")

    def parts(self, shape: StepShape) -> dict[str, float]:
        """Seconds per part of the step (for plots that show where the time goes).

        Each part takes the larger of its compute and memory time (``overlap`` 1), at the rates the hardware
        achieves: matrix products at ``matmul_efficiency`` of peak, less for a step of few tokens; weights and
        K/V streamed at ``bandwidth_efficiency`` of peak; attention at ``attention_efficiency`` of both."""
        if self.replicas > 1:
            shape = shape.scaled(self.replicas)
        hw, dtype = self.hardware, self.dtype
        (lin_flops, lin_bytes), prefill, decode = roofline_terms(self.model, dtype, shape)
        head = 2 * shape.num_sampled * self.model.lm_head_parameters
        # the layers' products see every token of the step; the LM head only the tokens that sample
        compute = (hw.matmul_seconds(lin_flops - head, dtype, shape.num_tokens)
                   + hw.matmul_seconds(head, dtype, shape.num_sampled))
        bandwidth = hw.achievable_bandwidth
        out = {"linear": self._combine(compute, lin_bytes / bandwidth)}
        attn_flops = hw.flops(dtype) * hw.attention_efficiency
        for name, (f, b) in (("prefill_attention", prefill), ("decode_attention", decode)):
            out[name] = self._combine(f / attn_flops, b / bandwidth)
        # elementwise kernels between the products: memory-bound passes over each token's activations
        activations = shape.num_tokens * self.model.activation_bytes_per_token
        out["elementwise"] = hw.elementwise_passes * activations / bandwidth
        out["overhead"] = (hw.step_overhead + hw.token_overhead * shape.num_tokens
                           + hw.sample_overhead * shape.num_sampled + hw.multi_row_overhead * (shape.num_tokens > 1))
        return out

    def _combine(self, compute, memory):
        """The roofline's max when the two overlap (GPU kernels), their sum when they do not (``overlap``)."""
        high = larger(compute, memory)
        return high + (1 - self.hardware.overlap) * (compute + memory - high)

    def step_time(self, shape: StepShape) -> float:
        return float(sum(self.parts(shape).values()))

    def step_times(self, shapes: Sequence[StepShape] | StepShape) -> np.ndarray:
        """Seconds of each of many steps, in one vectorized pass (``shapes``: a list, or ``StepShape.stack``)."""
        stacked = shapes if isinstance(shapes, StepShape) else StepShape.stack(shapes)
        return np.asarray(sum(self.parts(stacked).values()), dtype=float)

    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.dtype)
