"""This machine's roofline, measured, and the least time a workload can take on it.

A benchmark that says "100 tokens/s" does not say whether that is good. The roofline does: every token costs
arithmetic (``2 x parameters`` FLOPs through the matrix products, plus attention) and memory traffic (each
step streams every weight; each decode reads its request's cached K/V), and the machine has a measurable
rate for each. The workload's FLOPs at the machine's matmul rate, and its bytes at the machine's memory
bandwidth, give a time no engine running the same float32 products can beat -- a system's fraction of it says
how much of the machine the system uses.

What is measured, in a few seconds, at start (datasheet peaks say nothing about a shared 2-core VM):

* **the matmul rate at the model's own shapes**: every layer's products (q/k/v, o, gate/up, down; all
  ``num_layers`` of them, so the weights stream from memory as in a real forward pass), once with the rows
  of the largest step the engines take (``prefill_rows``: 512, the engine's prefill chunk; the benchmark passes
  ``LLM()``'s 2,048) and once with the rows of a decode step (one per running request). A decode step's
  products are short and wide: the library reaches a lower rate there, and streaming the weights counts;
* **the read bandwidth**: one pass over a tensor far larger than any cache.

Each product rate is the fastest of the ways minfer multiplies (``minfer/ops/linear.py``): plain ``x @ W``, and
minfer's C++ kernel and oneDNN on packed weights where they run. The bound is what the machine can do, whichever
engine gets there.

The bound prices the workload's prompt tokens at the prefill rate and its output tokens at the decode rate of
a batch holding every request at once -- the best any schedule of this workload can do, if decodes run in
products of their own (as they mostly do in every engine measured here) -- and decode attention at the
bandwidth (each output token reads its request's whole K/V). Not in it: the norms, rotary, softmax and
sampling (small), and the fact that a batch shrinks as requests finish (so the bound is generous). It is a
bound for float32 engines; a 4-bit engine reads a sixth of the bytes and multiplies in integers, so it can
beat it.

FLOPs and bytes come from the simulator's cost model (``minfer.sim.cost.roofline_terms``), one
implementation of "what a token costs" for the whole course.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from minfer.model.config import ModelConfig
from minfer.ops.linear import PACKED_BACKENDS, pack_weight, packed_linear, problem
from minfer.sim.cost import StepShape, roofline_terms
from minfer.sim.models import ModelSpec

PREFILL_ROWS = 512  # a prefill chunk: the engine's default chunked_prefill_size (LLM() takes up to 2048 a step)


def best_time(fn: Callable[[], object], reps: int = 3, device: str | torch.device = "cpu") -> float:
    """The fastest of ``reps`` timed calls, after one warm-up call. The fastest, not the median: on a
    shared machine interference only ever adds time, so the minimum is the closest to the machine's own.
    On a GPU each call is waited for (kernels launch asynchronously), else the clock would time the launch."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def layer_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """``(in, out)`` of one decoder layer's matrix products, fused as minfer runs them."""
    h, d = config.hidden_size, config.head_dim
    q, kv, inter = config.num_heads * d, config.num_kv_heads * d, config.intermediate_size
    return [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]


class ModelMatmuls:
    """Every layer's weight matrices (random, the model's shapes, ``[in, out]`` as minfer stores them).
    ``rate(rows)`` runs them all once on ``rows`` input rows, as one forward pass would, and returns FLOP/s,
    through ``linear_backend`` (``"torch"``: ``x @ W``; ``"cpp"``, ``"onednn"``: packed weights, as the engine runs
    them).
    ``num_layers``: fewer layers than the model's, to time many rows in less time (at hundreds of rows a product
    is bound by arithmetic, and a few layers' weights already stream from memory)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 linear_backend: str = "torch", num_layers: int | None = None) -> None:
        self.dtype, self.device, self.linear_backend = dtype, device, linear_backend
        self.weights = [torch.randn(i, o, dtype=dtype, device=device) * 0.02
                        for _ in range(num_layers or config.num_layers) for i, o in layer_shapes(config)]
        self.packed = ([pack_weight(w, transposed=True, backend=linear_backend) for w in self.weights]
                       if linear_backend in PACKED_BACKENDS else [])
        self.flops_per_row = 2 * sum(w.numel() for w in self.weights)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    @torch.inference_mode()
    def rate(self, rows: int, reps: int = 3) -> float:
        inputs = {w.shape[0]: torch.randn(rows, w.shape[0], dtype=self.dtype, device=self.device)
                  for w in self.weights}
        outputs = {w.shape[1]: torch.empty(rows, w.shape[1], dtype=self.dtype, device=self.device)
                   for w in self.weights}

        def forward() -> None:
            if self.packed:
                for w, packed in zip(self.weights, self.packed):
                    packed_linear(inputs[w.shape[0]], packed)
            else:
                for w in self.weights:
                    torch.mm(inputs[w.shape[0]], w, out=outputs[w.shape[1]])

        return rows * self.flops_per_row / best_time(forward, reps, self.device)


@torch.inference_mode()
def read_bandwidth(nbytes: int = 256 << 20, reps: int = 5, device: str | torch.device = "cpu") -> float:
    """Bytes per second of one pass reading ``nbytes`` (``sum`` reads each element once and writes nothing)."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return x.nbytes / best_time(x.sum, reps, device)


@dataclass(slots=True)
class MachineRoofline:
    """What this machine's PyTorch reaches: matmul FLOP/s at a prefill chunk's and at a decode step's rows,
    and read bandwidth. Measured by ``measure``; every figure is of this process, these threads."""

    prefill_flops: float  # FLOP/s of the model's layer products at ``prefill_rows`` rows
    decode_flops: float  # ... at ``decode_rows`` rows
    decode_rows: int
    bandwidth: float  # bytes/s, one read pass
    threads: int
    dtype: str = "float32"
    seconds: float = 0.0  # how long measuring took
    prefill_backend: str = "torch"  # the linear backend that reached prefill_flops (the faster one measured)
    decode_backend: str = "torch"  # ... and decode_flops
    prefill_rows: int = PREFILL_ROWS

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"matmul {self.prefill_flops / 1e9:.0f} GFLOP/s at {self.prefill_rows} rows ({self.prefill_backend}), "
                f"{self.decode_flops / 1e9:.0f} at {self.decode_rows} rows ({self.decode_backend}); read bandwidth "
                f"{self.bandwidth / 1e9:.1f} GB/s ({self.threads} threads, {self.dtype})")


def measure(config: ModelConfig, decode_rows: int, dtype: torch.dtype = torch.float32,
            device: str | torch.device = "cpu", prefill_rows: int = PREFILL_ROWS) -> MachineRoofline:
    """Measure this machine's roofline at ``config``'s shapes (a few seconds on 2 cores), on ``device`` (the
    one the engine being judged runs on: a GPU's roofline bounds a GPU engine, never the CPU's). ``prefill_rows``:
    the largest step the engines judged take (a product's rate grows with its rows, so a bound measured at fewer
    rows than they use would not bound them); beyond 512 rows, fewer layers are timed, for the same arithmetic."""
    start = time.perf_counter()
    backends = [name for name in ("torch", *PACKED_BACKENDS) if problem(name, dtype, device) is None]
    prefill_layers = max(1, config.num_layers * PREFILL_ROWS // max(prefill_rows, PREFILL_ROWS))
    prefill: dict[str, float] = {}
    decode: dict[str, float] = {}
    for backend in backends:
        matmuls = ModelMatmuls(config, dtype, device, backend)
        decode[backend] = matmuls.rate(decode_rows, reps=5)
        if prefill_layers < config.num_layers:
            del matmuls  # one set of weights (and packed copies) at a time
            matmuls = ModelMatmuls(config, dtype, device, backend, num_layers=prefill_layers)
        prefill[backend] = matmuls.rate(prefill_rows, reps=2)
        del matmuls
    best_prefill, best_decode = max(prefill, key=prefill.__getitem__), max(decode, key=decode.__getitem__)
    bandwidth = read_bandwidth(device=device)
    return MachineRoofline(prefill[best_prefill], decode[best_decode], decode_rows, bandwidth,
                           torch.get_num_threads(), str(dtype).removeprefix("torch."), time.perf_counter() - start,
                           best_prefill, best_decode, prefill_rows)


@dataclass(slots=True)
class WorkloadBound:
    """The least time a workload can take on a measured machine, part by part (seconds)."""

    prefill_s: float  # prompt tokens' products (and their causal attention) at the prefill rate
    decode_s: float  # output tokens' products at the decode rate, or their steps' weight reads if longer
    attention_s: float  # output tokens' attention: their requests' K/V read once each, at the bandwidth
    flops: float
    bytes: float

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s + self.attention_s

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds}


def workload_bound(model: ModelSpec, machine: MachineRoofline, prompt_lens: Sequence[int],
                   output_lens: Sequence[int], weight_bytes: float | None = None) -> WorkloadBound:
    """The roofline time of requests with these prompt and output lengths (every output token computed, EOS
    ignored). Prefill: every prompt token through every layer, each request's last one through the LM head.
    Decode: every later output token, one step per token of the longest output at least. ``weight_bytes``: what
    one decode step reads of the products' weights, where they are not stored in ``machine.dtype`` (int8 or 4-bit
    weights: ``minfer.quality.weight_bytes``); their arithmetic is still priced at the machine's rates."""
    dtype = machine.dtype
    prefill, decode = StepShape(), StepShape()
    for p, o in zip(prompt_lens, output_lens):
        prefill.add(0, p, is_decode=False, samples=True)
        for position in range(p, p + o - 1):  # token i of the output is fed back at position p + i
            decode.add(position, 1, is_decode=True, samples=True)
    (p_lin, _), (p_attn, p_kv), _ = roofline_terms(model, dtype, prefill)
    (d_lin, weights), _, (d_attn, d_kv) = roofline_terms(model, dtype, decode)
    weights = weights if weight_bytes is None else weight_bytes
    steps = max(output_lens) - 1  # decodes of one request run one after another
    prefill_s = (p_lin + p_attn) / machine.prefill_flops
    decode_s = max(d_lin / machine.decode_flops, steps * weights / machine.bandwidth)
    attention_s = max(d_kv / machine.bandwidth, d_attn / machine.prefill_flops)
    return WorkloadBound(prefill_s, decode_s, attention_s, p_lin + p_attn + d_lin + d_attn,
                         weights + p_kv + d_kv)
