"""The CUDA path: decode steps replayed from CUDA graphs, and memory profiling before sizing the KV pool.

**Why graphs.** A decode step of SmolLM2 is on the order of a thousand small kernels (30 layers of
norms, matmuls, rotary, attention; ``scripts/gpu_bench.py`` counts them). On a big GPU each finishes in a
few microseconds, but Python and the CUDA driver need several microseconds to *launch* each one: the GPU
idles, waiting for the CPU. A CUDA graph
records the whole forward pass once; replaying it launches every kernel with one call.

**What a graph fixes.** A graph replays the same kernels on the same memory addresses. So each captured
size gets static input buffers (token ids, positions, slots, block tables, lengths) that every step copies
its real values into, and a batch of ``n`` requests runs on the smallest captured size ``>= n``. The
extra rows are padding: slot ``-1`` (``triton_store_kv`` writes nothing for it) and ``seq_len`` 0 (the
attention kernel reads no key for it), so they touch no block of the pool and cannot disturb real rows
-- every other operation of the model works on each token on its own. Only pure decode steps are
replayed; a step with a prefill chunk has a shape no graph holds, and runs eagerly.

**What a graph needs from the kernels.** Nothing may read a device value on the host during capture
(``.item()``, ``.tolist()``). The Triton attention reads every length from device memory; the PyTorch
reference does not (it loops over chunks on the host), so graphs are used with the Triton backend only.
"""

from __future__ import annotations

import bisect
import warnings

import torch
from torch import Tensor

from minfer.model.llama import LlamaModel
from minfer.ops.attention import AttentionMetadata
from minfer.units import ceil_div


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, ... below ``max_batch``, and ``max_batch`` itself: a batch pads to at most twice its
    size, and padding rows cost only their share of the dense matmuls, which are nearly free in decode."""
    sizes, s = [], 1
    while s < max_batch:
        sizes.append(s)
        s *= 2
    return sizes + [max_batch]


class DecodeGraphs:
    """Stands in for ``ModelRunner.forward``: pure decode batches replay a graph, other steps run eagerly."""

    @torch.inference_mode()
    def __init__(self, runner, max_batch: int, capture: bool = True) -> None:
        """``capture=False`` runs the very same padded static-buffer steps eagerly, without graphs: that is
        how the CPU tests check the padding logic."""
        self.runner = runner
        self.sizes = capture_sizes(max_batch)
        self.replays = 0  # decode steps served by the padded path (tests and benchmarks read it)
        n, dev, bs = self.sizes[-1], runner.device, runner.kv_cache.block_size
        cfg = runner.model.config
        self.max_blocks = min(runner.kv_cache.num_blocks, ceil_div(cfg.max_position_embeddings, bs))  # table width
        # static inputs: every graph reads its first `size` rows; the values here are all "padding"
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.long, device=dev)  # one token per request
        self.seq_lens = torch.zeros(n, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}
        if capture:
            self._capture()

    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()  # all sizes share one memory pool: one replay at a time
        for size in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory
            self._warm_up(size)  # compiles the Triton kernels and picks cuBLAS kernels outside capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.runner.device)

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size],
            num_decodes=size, max_query_len=1, max_seq_len=self.max_blocks * self.runner.kv_cache.block_size,
        )

    def _forward(self, size: int) -> Tensor:
        return self.runner.eager_forward(self.input_ids[:size], self.positions[:size], self._meta(size))

    def _warm_up(self, size: int) -> None:
        stream = torch.cuda.Stream(self.runner.device)
        stream.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(stream):
            self._forward(size)
        torch.cuda.current_stream(self.runner.device).wait_stream(stream)

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata) -> Tensor:
        n = input_ids.shape[0]
        width = meta.block_tables.shape[1]
        if meta.num_decodes != n or n > self.sizes[-1] or width > self.max_blocks:
            return self.runner.eager_forward(input_ids, positions, meta)  # a prefill chunk is in the step
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)  # padding rows: write no K/V ...
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].zero_()  # ... and read none
        self.block_tables[:n, :width].copy_(meta.block_tables)  # columns past `width` are never read
        if self.graphs:
            self.graphs[size].replay()
            out = self.outputs[size]  # the graph's output buffer: the next replay overwrites it, so copy
        else:
            out = self._forward(size)
        self.replays += 1
        return out[:n].clone()


def enable_cuda_graphs(runner, max_batch: int) -> DecodeGraphs | None:
    """Capture decode graphs for batch sizes up to ``max_batch`` and route ``runner.forward`` through them."""
    if runner.device.type != "cuda":
        return None
    backend = runner.kv_cache.backend
    if not backend.graph_safe:
        warnings.warn(f"CUDA graphs need a graph-safe attention backend such as 'triton'; {backend.name!r} reads "
                      "lengths on the host, which a graph cannot capture: decode steps run eagerly", stacklevel=2)
        return None
    graphs = DecodeGraphs(runner, max_batch)
    runner.forward = graphs
    return graphs


@torch.inference_mode()
def profile_forward(model: LlamaModel, num_tokens: int, num_logits: int) -> int:
    """Run one forward pass as large as a step can be, so its activation peak stays reserved in PyTorch's
    caching allocator -- ``num_blocks_for_gpu`` then counts it as in use and leaves it out of the KV pool.
    Attention is stood in for by an identity (same shapes, no cache yet). Returns the peak bytes."""
    dev = model.device
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=dev)
    positions = torch.arange(num_tokens, device=dev) % model.config.max_position_embeddings
    hidden = model(ids, positions, lambda layer, q, k, v: q.clone())
    model.compute_logits(hidden[:num_logits])
    torch.cuda.synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) - before
