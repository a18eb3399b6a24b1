"""Hardware specs for the simulator: the numbers a roofline needs, what an engine achieves of them, and memory.

A step of LLM inference is limited either by arithmetic (FLOP/s) or by how fast weights and K/V can be
read from memory (bytes/s). Each spec gives both, per dtype, plus the memory size (which, after the
weights, decides how many KV blocks fit).

Two kinds of numbers live here, and the difference is a lesson of its own:

* **Datasheet peaks** (dense, no sparsity): the *speed of light*. No kernel reaches them; a roofline built
  from them is an upper bound on throughput and a lower bound on latency. ``spec.roofline()`` (or
  ``get_hardware(name, efficiency=False)``) gives a spec with nothing else.
* **What a well-tuned engine achieves** of those peaks: a large matrix product reaches perhaps 70-80% of
  peak FLOP/s, and a small one far less (a step of a few dozen tokens leaves most of the GPU idle: tiles
  are padded, waves are short); streaming kernels reach most but not all of the bandwidth; attention
  kernels (FlashAttention for prompts, paged attention for decodes) reach less than a plain matrix product;
  and every step pays a fixed host cost (scheduling, launches, sampling). The GPU specs carry these
  fractions, fitted to TensorRT-LLM's published measurements -- ``minfer.validate.published`` holds the table, the
  fit, and the error on measurements the fit never saw.

The CPU spec of the course machine is different again: its numbers were fitted to measured step times of
this very engine (``minfer.validate.calibrate``), so it predicts what this machine actually does.

Prefix a name with ``"Nx"`` (``"8xH100-SXM"``) for N devices under ideal tensor parallelism: N times the
FLOP/s, bandwidth and memory, with communication ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import numpy as np

GB, GiB = 1e9, 2**30  # a decimal and a binary gigabyte
TFLOPS = 1e12


def larger(a: Any, b: Any) -> Any:
    """The larger of ``a`` and ``b``: element by element where either is a numpy array (a whole recorded schedule
    priced at once), Python's ``max`` for two numbers. A simulation prices one step at a time, and ``np.maximum`` on
    two floats returns a numpy scalar that makes every operation after it slower: half of a step's pricing."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    peak_flops: dict[str, float]  # dtype name → dense FLOP/s of large matrix multiplies (datasheet)
    memory_bandwidth: float  # bytes/s (datasheet)
    memory_bytes: float  # device memory (GPU) or RAM (CPU)
    dtype: str = "bfloat16"  # what a model runs in when EngineConfig.dtype is "auto"
    step_overhead: float = 0.0  # seconds per step whatever its size: scheduling, launches, sampling
    token_overhead: float = 0.0  # seconds per token of the step: elementwise work the roofline leaves out
    sample_overhead: float = 0.0  # seconds per sampled token: per-request work (sampling, detokenizing, ...)
    # seconds a step of two or more tokens pays that a one-token step does not: on a CPU, a BLAS product of several
    # rows first copies its weight's tiles into the order its kernel reads (packing); one row is a matrix-vector
    # product that streams the weight as it is
    multi_row_overhead: float = 0.0
    # how much of the shorter of (compute, memory) time hides under the longer: 1 on GPUs, whose kernels
    # stream weights while they compute (the plain roofline: the max); 0 when the two simply add up
    overlap: float = 1.0
    # What an engine achieves of the peaks (all 1 and 0: the datasheet roofline, the speed of light).
    matmul_efficiency: float = 1.0  # share of peak FLOP/s a large matrix product reaches
    matmul_half_tokens: float = 0.0  # a step of this many tokens reaches half of that (small steps run slow)
    bandwidth_efficiency: float = 1.0  # share of peak bytes/s that streaming weights and K/V reaches
    attention_efficiency: float = 1.0  # share of peak FLOP/s that attention kernels reach (K/V stream as above)
    # times each token's activations (hidden and MLP vectors, 16-bit) are read or written per layer outside
    # the matrix products: norms, rotary, the activation function, residual adds, FP8 (de)quantization
    elementwise_passes: float = 0.0
    device: str = "cuda"  # "cpu": EngineConfig.kv_cache_memory sizes the KV pool, as in the real engine
    source: str = ""
    # bytes/s one way between device memory and host memory (PCIe, or NVLink-C2C on a Grace Hopper): what
    # swap preemption's KV block copies travel over. None: unknown (the simulator then cannot price a swap)
    host_link_bandwidth: float | None = None

    def flops(self, dtype: str) -> float:
        """Datasheet peak FLOP/s in ``dtype``."""
        if dtype not in self.peak_flops:
            raise ValueError(f"hardware {self.name!r} has no FLOP/s figure for dtype {dtype!r}; "
                             f"it knows {sorted(self.peak_flops)}")
        return self.peak_flops[dtype]

    def matmul_seconds(self, flops: float, dtype: str, tokens: int) -> float:
        """Time of the matrix products of a step of ``tokens`` tokens that do ``flops`` FLOPs.

        Efficiency rises with the tokens in the step as ``tokens / (tokens + half)``: a step of ``n`` tokens
        computes as fast as ``n + half`` tokens would at the large-matrix efficiency -- the price of tiles
        and waves that a small step cannot fill."""
        # (a step without tokens has no FLOPs: dividing by at least 1 keeps that 0, for arrays of steps too)
        return flops * (tokens + self.matmul_half_tokens) / larger(tokens, 1) / (
            self.flops(dtype) * self.matmul_efficiency)

    @property
    def achievable_bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_efficiency

    def roofline(self) -> HardwareSpec:
        """The same device at its datasheet peaks: no efficiency losses, no overheads -- the speed of light.
        (The CPU spec's numbers are fitted effective rates; its roofline drops only the overheads.)"""
        return replace(self, step_overhead=0.0, token_overhead=0.0, sample_overhead=0.0, multi_row_overhead=0.0,
                       matmul_efficiency=1.0,
                       matmul_half_tokens=0.0, bandwidth_efficiency=1.0, attention_efficiency=1.0,
                       elementwise_passes=0.0,
                       name=self.name if self.name.endswith("-peak") else f"{self.name}-peak")

    def scaled(self, n: int) -> HardwareSpec:
        """``n`` of these devices under ideal tensor parallelism (no communication cost)."""
        flops = {k: v * n for k, v in self.peak_flops.items()}
        link = None if self.host_link_bandwidth is None else self.host_link_bandwidth * n  # a link per device
        return replace(self, name=f"{n}x{self.name}", peak_flops=flops, memory_bandwidth=self.memory_bandwidth * n,
                       memory_bytes=self.memory_bytes * n, host_link_bandwidth=link)

    def with_shares(self, shares: dict[str, float]) -> HardwareSpec:
        """This spec with some achieved shares or overheads changed by name (``{"matmul_efficiency": 0.7}``).

        A fit chooses which of them it varies at run time, so their names are checked here."""
        unknown = sorted(set(shares) - set(SHARE_FIELDS))
        if unknown:
            raise ValueError(f"{unknown} are not shares or overheads of a HardwareSpec; they are {SHARE_FIELDS}")
        changes: dict[str, Any] = dict(shares)  # every name is a float field: checked above
        return replace(self, **changes)


# The fields of a HardwareSpec that say what an engine achieves of the peaks and what it pays besides them.
SHARE_FIELDS = ("matmul_efficiency", "matmul_half_tokens", "bandwidth_efficiency", "attention_efficiency",
                "elementwise_passes", "step_overhead", "token_overhead", "sample_overhead", "multi_row_overhead",
                "overlap")


class TunedShares(TypedDict):
    """The shares and the overhead a tuned GPU engine reaches: ``HardwareSpec`` fields by name."""

    matmul_efficiency: float
    matmul_half_tokens: float
    bandwidth_efficiency: float
    attention_efficiency: float
    elementwise_passes: float
    step_overhead: float


# What a well-tuned engine achieves on a data-centre GPU, as shares of the datasheet peaks, and its fixed cost
# per step: TensorRT-LLM, the engine that published the measurements (vLLM and SGLang reach less; see
# chapter 10). Fitted by `python -m minfer.validate.published --fit` to the points marked "fit" in
# minfer/validate/published.json: TensorRT-LLM's offline throughput for Llama-3.1-8B on one A100 (FP16, 0.17) and
# one H100 (FP8, 0.17; FP16, 0.14), and the H100's inter-token latency at 2 requests/s (BF16, 0.14). Points the
# fit never saw -- other GPUs, another model, online latency at other rates -- measure how well these numbers
# transfer: their median error is in docs/simulator.md's table (`python -m minfer.validate.published`, chapter
# 10). Not fitted: the attention share, from published microbenchmarks (FlashAttention-2 reaches about 70% of
# an A100's peak on long sequences, FlashAttention-3 about 75% of an H100's). For comparison, cuBLAS reaches
# 70-85% of peak on large GEMMs and streaming kernels 85-90% of HBM bandwidth.
TUNED_GPU = TunedShares(
    matmul_efficiency=0.8275,
    matmul_half_tokens=106.8,
    bandwidth_efficiency=0.8865,
    attention_efficiency=0.70,
    elementwise_passes=12.58,
    step_overhead=2.27e-3,
)
TUNED_SOURCE = "fitted to TensorRT-LLM's published measurements (minfer/validate/published.json, points marked 'fit')"


def _gpu(name: str, flops: dict[str, float], bandwidth_gb_s: float, memory: float, source: str,
         host_link_gb_s: float | None = None) -> HardwareSpec:
    peak = {dtype: tflops * TFLOPS for dtype, tflops in flops.items()}
    peak.setdefault("float16", peak["bfloat16"])
    return HardwareSpec(name, peak, bandwidth_gb_s * GB, memory, **TUNED_GPU,
                        source=f"peaks: {source}; achieved shares: {TUNED_SOURCE}",
                        host_link_bandwidth=None if host_link_gb_s is None else host_link_gb_s * GB)


# The course machine: 2 cores of an Intel Xeon (AVX-512, no AMX), torch with 2 threads, float32.
# Fitted by `python -m minfer.validate.calibrate` to 154 measured steps of SmolLM2-135M run by LLMEngine (each
# step's fastest of 7 runs), it predicts 61 held-out steps with a median error of 9%. These are effective
# numbers of *this engine* on this CPU: compute and memory time add up (overlap 0), and each sampled token
# costs ~2.8 ms of per-request work (LM-head row, sampling, detokenizing, a decode's attention setup).
# Measured peaks for comparison (torch, 2 threads): float32 matmul ~235 GFLOP/s; bfloat16 ~48 GFLOP/s (no
# native bf16 units: it is emulated; bf16 below is that peak, not fitted); torch reading a 256 MB tensor
# ~10 GB/s (a naive figure: the engine's matrix products stream their weights faster).
CPU_2CORE = HardwareSpec(
    name="cpu-2core",
    peak_flops={"float32": 2.35e11, "bfloat16": 4.8e10},
    memory_bandwidth=1.85e10,
    memory_bytes=16 * GiB,
    dtype="float32",
    step_overhead=0.0,
    token_overhead=0.0,
    sample_overhead=2.78e-3,
    overlap=0.0,
    device="cpu",
    source="fitted to measured step times on the course machine (minfer/validate/calibrate.py)",
)

# Datasheet figures: dense tensor-core FLOP/s (sparsity doubles them; not used), memory bandwidth, memory.
# "80GB" HBM cards hold 80 GiB (nvidia-smi: 81,920 MiB on an A100); the H200's 141 GB are decimal
# (131 GiB; TensorRT-LLM's tables call it "H200 131GB").
# Host links (host_link_bandwidth, one direction; datasheets give both directions added up): PCIe Gen4 x16 is
# 64 GB/s in all, 32 GB/s each way; PCIe Gen5 x16 is 128 GB/s in all, 64 GB/s each way; a Grace Hopper GH200's
# NVLink-C2C is 900 GB/s in all, 450 GB/s each way (NVIDIA's GH200 datasheet).
HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in [
        # A100 datasheet (SXM4 80GB): BF16/FP16 tensor 312 TFLOPS, FP32 19.5, HBM2e 2,039 GB/s; no FP8 units;
        # PCIe Gen4
        _gpu("A100-80GB", {"bfloat16": 312, "float32": 19.5}, 2039, 80 * GiB,
             "NVIDIA A100 Tensor Core GPU datasheet (SXM, 80GB)", 32),
        # A100 datasheet (PCIe 80GB): the same chip at a lower clock budget, HBM2e 1,935 GB/s; PCIe Gen4
        _gpu("A100-PCIe-80GB", {"bfloat16": 312, "float32": 19.5}, 1935, 80 * GiB,
             "NVIDIA A100 Tensor Core GPU datasheet (PCIe, 80GB)", 32),
        # H100 datasheet (SXM): BF16 989 TFLOPS dense, FP8 1,979, FP32 67, HBM3 3.35 TB/s; PCIe Gen5
        _gpu("H100-SXM", {"bfloat16": 989, "float8": 1979, "float32": 67}, 3350, 80 * GiB,
             "NVIDIA H100 Tensor Core GPU datasheet (SXM)", 64),
        # H200 datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s; PCIe Gen5
        _gpu("H200", {"bfloat16": 989, "float8": 1979, "float32": 67}, 4800, 141 * GB,
             "NVIDIA H200 Tensor Core GPU datasheet (SXM)", 64),
        # GH200 datasheet, the 96 GB HBM3 version ("GH200 480GB": 480 GB of CPU LPDDR5X beside it): H100 compute;
        # NVLink-C2C to the CPU's memory
        _gpu("GH200", {"bfloat16": 989, "float8": 1979, "float32": 67}, 4000, 96 * GiB,
             "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3)", 450),
        # L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse), FP8 733 dense, FP32 91.6, 48 GB GDDR6 864 GB/s;
        # PCIe Gen4
        _gpu("L40S", {"bfloat16": 362.05, "float8": 733, "float32": 91.6}, 864, 48 * GiB,
             "NVIDIA L40S GPU datasheet", 32),
        # L4 datasheet: BF16 121 TFLOPS dense (242 sparse), FP8 242.5, FP32 30.3, 24 GB GDDR6 at 300 GB/s; PCIe Gen4
        _gpu("L4", {"bfloat16": 121, "float8": 242.5, "float32": 30.3}, 300, 24 * GiB,
             "NVIDIA L4 Tensor Core GPU datasheet", 32),
        # Ada whitepaper, GeForce RTX 4090: BF16 tensor (FP32 accumulate) 165.2 TFLOPS dense, FP32 82.6,
        # 24 GB GDDR6X at 1,008 GB/s; a PCIe Gen4 x16 card
        _gpu("RTX-4090", {"bfloat16": 165.2, "float32": 82.6}, 1008, 24 * GiB,
             "NVIDIA Ada Lovelace GPU architecture whitepaper (RTX 4090)", 32),
        CPU_2CORE,
    ]
}
ALIASES = {"A100": "A100-80GB", "A100-SXM": "A100-80GB", "A100-PCIe": "A100-PCIe-80GB", "H100": "H100-SXM",
           "RTX4090": "RTX-4090", "4090": "RTX-4090", "cpu": "cpu-2core"}


def get_hardware(spec: str | HardwareSpec, efficiency: bool = True) -> HardwareSpec:
    """A built-in spec by name (case-insensitive, ``"8xH100"`` for 8 devices), or your own spec as is.

    ``efficiency=False`` gives the datasheet roofline (``spec.roofline()``): an upper bound on speed."""
    if isinstance(spec, HardwareSpec):
        return spec if efficiency else spec.roofline()
    m = re.fullmatch(r"(?:(\d+)x)?(.+)", str(spec).strip())
    count, name = (int(m[1] or 1), m[2]) if m else (1, "")  # no match: an empty name, which no spec has
    known = {k.lower(): v for k, v in HARDWARE.items()} | {k.lower(): HARDWARE[v] for k, v in ALIASES.items()}
    if name.lower() not in known or count < 1:
        raise ValueError(f"unknown hardware {spec!r}: known specs are {', '.join(HARDWARE)} "
                         "(prefix 'Nx' for N devices), or pass a HardwareSpec")
    hw = known[name.lower()]
    hw = hw.scaled(count) if count > 1 else hw
    return hw if efficiency else hw.roofline()
