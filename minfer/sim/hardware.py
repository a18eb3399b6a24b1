"""Hardware specs for the simulator: the numbers a roofline needs, and the memory that bounds the KV cache.

A step of LLM inference is limited either by arithmetic (FLOP/s) or by how fast weights and K/V can be
read from memory (bytes/s). Each spec gives both, per dtype, plus the memory size (which, after the
weights, decides how many KV blocks fit) and a fixed per-step overhead (host work between forward passes).

GPU figures are vendor datasheet peaks (dense, no sparsity): the simulator then gives the *speed of
light* -- real engines reach perhaps 50-80% of it. The CPU spec of the course machine is different: its
numbers were fitted to measured step times of the real engine (``minfer.sim.calibrate``), so it predicts
what this machine actually does.

Prefix a name with ``"Nx"`` (``"8xH100-SXM"``) for N devices under ideal tensor parallelism: N times the
FLOP/s, bandwidth and memory, with communication ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

GB = 1e9
GiB = 2**30
TFLOPS = 1e12


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    peak_flops: dict[str, float]  # dtype name → dense FLOP/s of large matrix multiplies
    memory_bandwidth: float  # bytes/s
    memory_bytes: float  # device memory (GPU) or RAM (CPU)
    dtype: str = "bfloat16"  # what a model runs in when EngineConfig.dtype is "auto"
    step_overhead: float = 0.0  # seconds per step whatever its size: scheduling, launches, sampling
    token_overhead: float = 0.0  # seconds per token of the step: elementwise work the roofline leaves out
    sample_overhead: float = 0.0  # seconds per sampled token: per-request work (sampling, detokenizing, ...)
    # how much of the shorter of (compute, memory) time hides under the longer: 1 on GPUs, whose kernels
    # stream weights while they compute (the plain roofline: the max); 0 when the two simply add up
    overlap: float = 1.0
    device: str = "cuda"  # "cpu": EngineConfig.kv_cache_memory sizes the KV pool, as in the real engine
    source: str = ""
    # bytes/s one way between device memory and host memory (PCIe, or NVLink-C2C on a Grace Hopper): what
    # swap preemption's KV block copies travel over. None: unknown (the simulator then cannot price a swap)
    host_link_bandwidth: float | None = None

    def flops(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"hardware {self.name!r} has no FLOP/s figure for dtype {dtype!r}; "
                             f"it knows {sorted(self.peak_flops)}")
        return self.peak_flops[dtype]

    def scaled(self, n: int) -> HardwareSpec:
        """``n`` of these devices under ideal tensor parallelism (no communication cost)."""
        flops = {k: v * n for k, v in self.peak_flops.items()}
        link = None if self.host_link_bandwidth is None else self.host_link_bandwidth * n  # a link per device
        return replace(self, name=f"{n}x{self.name}", peak_flops=flops, memory_bandwidth=self.memory_bandwidth * n,
                       memory_bytes=self.memory_bytes * n, host_link_bandwidth=link)


# Host work per step on a GPU server: an assumption (about 1 ms of scheduling, sampling and kernel launches
# with CUDA graphs), not a measurement -- set your own with dataclasses.replace(spec, step_overhead=...).
GPU_STEP_OVERHEAD = 1e-3


def _gpu(name: str, bf16_tflops: float, fp32_tflops: float, bandwidth_gb_s: float, memory_gb: float,
         source: str, host_link_gb_s: float | None = None) -> HardwareSpec:
    bf16 = bf16_tflops * TFLOPS
    return HardwareSpec(name, {"bfloat16": bf16, "float16": bf16, "float32": fp32_tflops * TFLOPS},
                        bandwidth_gb_s * GB, memory_gb * GB, step_overhead=GPU_STEP_OVERHEAD, source=source,
                        host_link_bandwidth=None if host_link_gb_s is None else host_link_gb_s * GB)


# The course machine: 2 cores of an Intel Xeon (AVX-512, no AMX), torch with 2 threads, float32.
# Fitted by `python -m minfer.sim.calibrate` to 154 measured steps of SmolLM2-135M run by LLMEngine (each
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
    source="fitted to measured step times on the course machine (minfer/sim/calibrate.py)",
)

# Host links (host_link_bandwidth, one direction; datasheets give both directions added up): PCIe Gen4 x16 is
# 64 GB/s in all, 32 GB/s each way; PCIe Gen5 x16 is 128 GB/s in all, 64 GB/s each way. (A Grace Hopper GH200's
# NVLink-C2C, not listed here, is 900 GB/s in all: 450 GB/s each way, per NVIDIA's GH200 datasheet.)
HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in [
        # NVIDIA A100 datasheet (80GB SXM): BF16 tensor 312 TFLOPS dense, FP32 19.5 TFLOPS, HBM2e 2,039 GB/s,
        # PCIe Gen4 64 GB/s
        _gpu("A100-80GB", 312, 19.5, 2039, 80, "NVIDIA A100 Tensor Core GPU datasheet (SXM, 80GB)", 32),
        # NVIDIA H100 datasheet (SXM): BF16 tensor 989 TFLOPS dense (1,979 sparse), FP32 67, HBM3 3.35 TB/s,
        # PCIe Gen5 128 GB/s
        _gpu("H100-SXM", 989, 67, 3350, 80, "NVIDIA H100 Tensor Core GPU datasheet (SXM)", 64),
        # NVIDIA H200 datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s, PCIe Gen5 128 GB/s
        _gpu("H200", 989, 67, 4800, 141, "NVIDIA H200 Tensor Core GPU datasheet (SXM)", 64),
        # NVIDIA L4 datasheet: BF16 tensor 121 TFLOPS dense (242 sparse), FP32 30.3, 24 GB GDDR6 at 300 GB/s,
        # PCIe Gen4 x16 64 GB/s
        _gpu("L4", 121, 30.3, 300, 24, "NVIDIA L4 Tensor Core GPU datasheet", 32),
        # NVIDIA Ada whitepaper, GeForce RTX 4090: BF16 tensor (FP32 accumulate) 165.2 TFLOPS dense,
        # FP32 82.6 TFLOPS, 24 GB GDDR6X at 1,008 GB/s; a PCIe Gen4 x16 card
        _gpu("RTX-4090", 165.2, 82.6, 1008, 24, "NVIDIA Ada Lovelace GPU architecture whitepaper (RTX 4090)", 32),
        CPU_2CORE,
    ]
}
ALIASES = {"A100": "A100-80GB", "H100": "H100-SXM", "RTX4090": "RTX-4090", "4090": "RTX-4090",
           "cpu": "cpu-2core"}


def get_hardware(spec: str | HardwareSpec) -> HardwareSpec:
    """A built-in spec by name (case-insensitive, ``"8xH100"`` for 8 devices), or your own spec as is."""
    if isinstance(spec, HardwareSpec):
        return spec
    m = re.fullmatch(r"(?:(\d+)x)?(.+)", str(spec).strip())
    count, name = int(m[1] or 1), m[2]
    known = {k.lower(): v for k, v in HARDWARE.items()} | {k.lower(): HARDWARE[v] for k, v in ALIASES.items()}
    if name.lower() not in known or count < 1:
        raise ValueError(f"unknown hardware {spec!r}: known specs are {', '.join(HARDWARE)} "
                         "(prefix 'Nx' for N devices), or pass a HardwareSpec")
    hw = known[name.lower()]
    return hw.scaled(count) if count > 1 else hw
