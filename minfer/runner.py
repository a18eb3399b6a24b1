"""ModelRunner: one SchedulerOutput in, one sampled token per finishing chunk out.

It flattens the step's chunks into the tensors the model and the paged KV cache need:

* ``input_ids``, ``positions``: every new token of every scheduled request, one flat list;
* ``slot_mapping``: where each new token's K/V goes (``block_table[pos // B] * B + pos % B``);
* ``block_tables``, ``seq_lens``, ``query_start_loc``: what each request's queries may read.

Decodes go first (the attention reference batches them, longest first), then prefill chunks. The model
runs once; logits are computed only for the last token of chunks that reach the end of their request -- a
mid-prompt chunk samples nothing. Everything comes from the ``SchedulerOutput``: each chunk carries its
request's block table, so the runner never asks the block pool. Before the forward pass it makes the step's KV
block copies (swap preemption): swap-outs first, since a device block one frees may be refilled in this step.

With speculative decoding a decode may come with lookahead slots: the runner asks its proposer for guesses
(``minfer.spec``), appends them to the decode's token -- a short query, like a prompt chunk's -- computes logits at
the token and at every guess, and keeps the guesses the target model agrees with (``spec/verify.py``).

``build_model_executor`` builds it in three named steps -- load the model (``load_weights``), swap in the speed-ups
that this machine runs (``minfer/accelerate.py``, once), size and allocate the paged KV cache (``kv_blocks``) -- and
returns the runner in an ``ExecutorSetup`` (the simulator's counterpart is ``sim/executor.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from minfer.config import EngineConfig
from minfer.executor import ExecutorSetup, ModelOutput, Query, num_swap_blocks
from minfer.kv.cache import PagedKVCache
from minfer.model.llama import LlamaModel
from minfer.ops.attention import AttentionMetadata
from minfer.plan import SchedulerOutput, StepBudget
from minfer.request import Request
from minfer.sampler import sample
from minfer.spec import Proposer, make_proposer
from minfer.spec.verify import verify
from minfer.units import parse_bytes


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, seed: int = 0) -> None:
        self.model, self.kv_cache = model, kv_cache  # the model as the engine runs it (accelerated or plain)
        self.device = model.device
        self.generator = torch.Generator().manual_seed(seed)
        self.proposer: Proposer | None = None  # speculative decoding's guesses (minfer.spec); None: off
        # forward(input_ids, positions, meta) -> hidden; the CUDA path swaps in a graph-replaying version
        self.forward: Callable[[Tensor, Tensor, AttentionMetadata], Tensor] = self.eager_forward

    def eager_forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata) -> Tensor:
        return self.model(input_ids, positions, self.kv_cache.attention(meta))

    def prepare(self, queries: list[Query], num_decodes: int) -> tuple[Tensor, Tensor, AttentionMetadata]:
        """Flat token ids and positions, and the attention metadata, for ``queries`` in the given order (the first
        ``num_decodes`` are one-token decodes)."""
        bs = self.kv_cache.block_size
        tables = [q.block_table for q in queries]
        query_lens = np.fromiter((len(q.token_ids) for q in queries), dtype=np.int64, count=len(queries))
        starts = np.fromiter((q.start for q in queries), dtype=np.int64, count=len(queries))
        query_start_loc = np.zeros(len(queries) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        seq_lens = starts + query_lens
        # each token's position: its query's start plus its offset inside the query
        owner = np.repeat(np.arange(len(queries)), query_lens)
        positions = starts[owner] + np.arange(int(query_start_loc[-1])) - query_start_loc[owner]
        block_tables = np.zeros((len(queries), max(map(len, tables))), dtype=np.int64)
        for i, t in enumerate(tables):
            block_tables[i, : len(t)] = t
        slot_mapping = block_tables[owner, positions // bs] * bs + positions % bs
        ids = [t for q in queries for t in q.token_ids]

        def to(x: np.ndarray | list, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.as_tensor(x, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=to(slot_mapping), query_start_loc=to(query_start_loc), seq_lens=to(seq_lens),
            block_tables=to(block_tables, torch.int32), num_decodes=num_decodes,
            max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
        )
        return to(ids), to(positions), meta

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        """Run the step; returns the sampled token per request id (its time is the engine's wall clock)."""
        if self.device.type == "cuda":  # Triton launches on the *current* device: make it this engine's
            with torch.cuda.device(self.device):
                return self._execute(out)
        return self._execute(out)

    def _execute(self, out: SchedulerOutput) -> ModelOutput:
        for copies in [*out.swap_out.values(), out.spill]:  # to host memory first: a block copied out may be
            self.kv_cache.swap_out(copies)  # refilled at once, by a copy back or by this step's forward pass
        for copies in [*out.swap_in.values(), *out.load.values()]:
            self.kv_cache.swap_in(copies)
        if not out.chunks:
            return ModelOutput()
        # speculative decoding: guesses for the decodes that have lookahead slots, verified in this same pass
        speculating = [c for c in out.chunks if c.lookahead]
        guesses = self.proposer.propose(speculating) if speculating and self.proposer is not None else {}
        queries = {c.request.request_id: Query(c.request.token_ids(c.start, c.start + c.num_tokens)
                                               + guesses.get(c.request.request_id, []), c.start, c.block_table)
                   for c in out.chunks}
        # one-token decodes first, longest context first (the reference attention batches them); a decode with
        # guesses is a short query like a prompt chunk's
        chunks = sorted(out.chunks, key=lambda c: (len(queries[c.request.request_id].token_ids) > 1, -c.start))
        num_decodes = sum(len(queries[c.request.request_id].token_ids) == 1 and c.is_decode for c in chunks)
        input_ids, positions, meta = self.prepare([queries[c.request.request_id] for c in chunks], num_decodes)
        hidden = self.forward(input_ids, positions, meta)
        # logits at each sampling chunk's last token, and at each of its guesses
        rows: list[int] = []
        owners: list[tuple[Request, int]] = []  # each sampling request, and its rows of logits
        for i, c in enumerate(chunks):
            if c.samples:
                n = 1 + len(guesses.get(c.request.request_id, ()))
                end = int(meta.query_start_loc[i + 1])
                rows.extend(range(end - n, end))
                owners.append((c.request, n))
        if not rows:
            return ModelOutput()
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        result, at = ModelOutput(), 0
        plain = []  # (row, request): one token each, sampled together
        for req, n in owners:
            if n == 1:
                plain.append((at, req))
            else:
                rid = req.request_id
                tokens = verify(logits[at:at + n], guesses[rid], req.params, req.generator or self.generator)
                result.proposed[rid], result.accepted[rid], result.sampled[rid] = n - 1, tokens[:-1], tokens[-1]
            at += n
        if plain:
            reqs = [r for _, r in plain]
            picked = sample(logits[[i for i, _ in plain]], [r.params for r in reqs], [r.generator for r in reqs],
                            self.generator)
            result.sampled.update((r.request_id, t) for r, t in zip(reqs, picked))
        return result


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``"auto"``: bfloat16 on CUDA, float32 on the CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def build_model_executor(config: EngineConfig, model: Any = None, tokenizer: Any = None) -> ExecutorSetup:
    """Load (or reuse) the model, swap in the speed-ups this machine runs, size and allocate the paged KV cache,
    and build the runner.

    The attention backend is loaded *before* any weights: on the CPU, Triton's interpreter must be switched
    on before ``transformers`` imports ``triton``."""
    from minfer.accelerate import accelerate
    from minfer.cpu_malloc import keep_freed_memory
    from minfer.kv.cache import bytes_per_block
    from minfer.ops.backends import load_backend, resolve_backend

    cfg = config
    dtype = resolve_dtype(cfg.dtype, cfg.device)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU (is a CUDA build of torch installed?)")
    ops = load_backend(resolve_backend(cfg.attention_backend, cfg.device), cfg.device)
    if cfg.device == "cpu":  # each step's activations reuse the last step's memory (see cpu_malloc.py)
        keep_freed_memory()
    model, tokenizer = load_weights(cfg, dtype, model, tokenizer)
    from minfer.model.loader import gguf_file

    gguf = gguf_file(cfg.checkpoint) if cfg.weights == "q4" else None  # the blocks q4 takes as they are
    fast = accelerate(model, cfg.linear_backend, cfg.pointwise_backend, cfg.weights, gguf)  # shares the weights
    mcfg = model.config
    max_model_len = min(cfg.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
    num_blocks = kv_blocks(cfg, fast, dtype, max_model_len)
    block_bytes = bytes_per_block(mcfg, cfg.block_size, dtype)
    swap_blocks = num_swap_blocks(cfg, block_bytes)
    kv_cache = PagedKVCache(mcfg, num_blocks, cfg.block_size, dtype, cfg.device, ops,
                            num_host_blocks=swap_blocks + cfg.host_cache_blocks)  # the host tier's after the swaps'
    runner = ModelRunner(fast, kv_cache, seed=cfg.seed)
    if cfg.speculative is not None:
        runner.proposer = make_proposer(cfg.speculative, fast, kv_cache, runner.prepare)
    if cfg.device.startswith("cuda") and cfg.cuda_graphs:
        from minfer.cuda_graphs import enable_cuda_graphs

        with torch.cuda.device(torch.device(cfg.device)):  # capture on this engine's GPU, not the current one
            enable_cuda_graphs(runner, max_batch=cfg.max_num_seqs)
    return ExecutorSetup(
        executor=runner, num_blocks=num_blocks, max_model_len=max_model_len, tokenizer=tokenizer,
        vocab_size=mcfg.vocab_size, eos_token_ids=tuple(sorted({tokenizer.eos_token_id, *mcfg.eos_token_ids})),
        model=model, kv_cache=kv_cache, kv_block_bytes=block_bytes, num_swap_blocks=swap_blocks,
    )


def load_weights(config: EngineConfig, dtype: torch.dtype, model: Any = None, tokenizer: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer): loaded from ``config.checkpoint``, or the preloaded pair moved to the engine's device and
    dtype (the plain model: engines that share it each swap in their own speed-ups)."""
    from minfer.model.loader import load_model

    if model is None:
        return load_model(config.checkpoint, config.device, dtype)
    if tokenizer is None:
        raise ValueError("pass the tokenizer together with a preloaded model")
    return model.to(device=config.device, dtype=dtype), tokenizer


def kv_blocks(config: EngineConfig, model: LlamaModel, dtype: torch.dtype, max_model_len: int) -> int:
    """How many KV blocks the memory budget holds: ``num_blocks`` when given; on the CPU, what ``kv_cache_memory``
    holds; on CUDA, what ``gpu_memory_utilization`` leaves once the largest step's activations are counted."""
    from minfer.kv.cache import num_blocks_for_gpu, num_blocks_for_memory

    cfg, mcfg = config, model.config
    num_blocks = cfg.num_blocks
    if num_blocks is None:
        if cfg.device.startswith("cuda"):
            from minfer.cuda_graphs import profile_forward

            # the largest step's activations stay reserved by PyTorch, so the pool leaves room for them
            # (CUDA-graph capture empties that cache and allocates its own; the 1 - gpu_memory_utilization
            # left over, 10% by default, is the margin that covers the difference)
            profile_forward(model, StepBudget.from_config(cfg, max_model_len).tokens, cfg.max_num_seqs)
            num_blocks = num_blocks_for_gpu(mcfg, cfg.block_size, dtype, cfg.gpu_memory_utilization, cfg.device)
        else:
            num_blocks = num_blocks_for_memory(mcfg, cfg.block_size, dtype, parse_bytes(cfg.kv_cache_memory))
    if num_blocks < 1:
        raise ValueError("no memory left for KV cache blocks: lower the model size or raise the memory budget")
    return num_blocks
