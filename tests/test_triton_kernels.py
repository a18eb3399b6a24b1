"""The Triton kernels against their PyTorch references, under Triton's interpreter on the CPU (float32).

Triton decides once per process whether it compiles or interprets: each ``@triton.jit`` reads
``TRITON_INTERPRET`` when it decorates a kernel -- Triton's own helpers such as ``tl.zeros`` included,
when ``triton`` is first imported (and importing ``transformers`` imports it). So this module sets the
variable at import time, before it imports the kernels. That cannot break other tests: without a GPU the
interpreter is the only way Triton runs at all. With a GPU the compiled kernels are tested by
``test_cuda.py`` and this module is skipped, unless the run asks for the interpreter
(``TRITON_INTERPRET=1 pytest tests/test_triton_kernels.py``, as ``scripts/gpu_check.sh`` does).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("a GPU is present: Triton runs compiled in this process (see test_cuda.py)",
                allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
if "triton.language" in sys.modules and type(sys.modules["triton.language"].zeros).__name__ == "JITFunction":
    pytest.fail("triton was imported (compiled mode) before this module could set TRITON_INTERPRET=1; "
                "set it in the environment (tests/conftest.py does, on a machine without CUDA)",
                pytrace=False)

from conftest import greedy_run  # noqa: E402
from minfer.model.loader import tiny_random_model  # noqa: E402
from minfer.ops.paged_attention import AttentionMetadata, store_kv  # noqa: E402
from minfer.ops.paged_attention import paged_attention as _paged_attention  # noqa: E402
from minfer.ops.testing import random_chunks, random_mixed_step, random_paged_batch  # noqa: E402
from minfer.ops.triton_paged_attention import paged_attention_kernel, triton_paged_attention  # noqa: E402
from minfer.ops.triton_store_kv import store_kv_kernel, triton_store_kv  # noqa: E402

# the reference as the engine runs it: under inference mode (it keeps scratch buffers between calls)
paged_attention = torch.inference_mode()(_paged_attention)
TOL = dict(atol=2e-5, rtol=1e-4)  # float32 on both sides; only the summation order differs


def test_kernels_run_under_the_interpreter():
    for kernel in (store_kv_kernel, paged_attention_kernel):
        assert type(kernel).__name__ == "InterpretedFunction", f"{kernel} would need a GPU"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_kv_heads, head_dim", [(2, 64), (3, 48), (1, 80)])
def test_store_kv_matches_reference(block_size, num_kv_heads, head_dim):
    rng = random.Random(block_size * 1000 + head_dim)
    b = random_paged_batch(random_chunks(rng, block_size), block_size=block_size, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, seed=rng.randrange(10**6))
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    store_kv(b.k, b.v, k_ref, v_ref, b.meta.slot_mapping)
    v_new = b.v.transpose(0, 1).contiguous().transpose(0, 1)  # a strided input, as the model's views are
    triton_store_kv(b.k, v_new, b.k_cache, b.v_cache, b.meta.slot_mapping)
    assert torch.equal(b.k_cache, k_ref) and torch.equal(b.v_cache, v_ref)  # a copy: bit for bit


def test_store_kv_skips_negative_slots():
    """CUDA-graph padding rows carry slot -1: they must write nothing anywhere."""
    b = random_paged_batch([(3, 1), (0, 5)], block_size=16, num_kv_heads=2, head_dim=48)
    slots = b.meta.slot_mapping.clone()
    slots[[1, 4]] = -1
    k_ref, v_ref = b.k_cache.clone(), b.v_cache.clone()
    keep = slots >= 0
    store_kv(b.k[keep], b.v[keep], k_ref, v_ref, slots[keep])
    triton_store_kv(b.k, b.v, b.k_cache, b.v_cache, slots)
    assert torch.equal(b.k_cache, k_ref) and torch.equal(b.v_cache, v_ref)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 48, 80])
def test_paged_attention_matches_reference_on_a_mixed_step(block_size, group, head_dim):
    b, chunks = random_mixed_step(f"{block_size}-{group}-{head_dim}", block_size, group, head_dim)
    ref = paged_attention(b.q, b.k_cache, b.v_cache, b.meta)
    out = triton_paged_attention(b.q, b.k_cache, b.v_cache, b.meta)
    torch.testing.assert_close(out, ref, **TOL, msg=lambda m: f"chunks {chunks}: {m}")


@pytest.mark.parametrize("chunks", [
    [(0, 1), (15, 1), (16, 1), (47, 1), (100, 1)],  # decodes only: empty context, block edges, long
    [(0, 33), (5, 11), (17, 64)],  # prefill chunks only, one longer than a program's query tile
])
def test_paged_attention_single_phase_steps(chunks):
    b = random_paged_batch(chunks, block_size=16, num_kv_heads=3, group=3, head_dim=64, seed=7)
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
    torch.testing.assert_close(triton_paged_attention(b.q, b.k_cache, b.v_cache, b.meta),
                               paged_attention(b.q, b.k_cache, b.v_cache, b.meta), **TOL)


def test_padding_rows_of_a_decode_batch_change_nothing():
    """What a CUDA graph replay relies on: rows with seq_len 0 and slot -1 read nothing, write nothing,
    output zeros, and leave the real rows' outputs exactly as without them."""
    b = random_paged_batch([(9, 1), (30, 1), (0, 1)], block_size=16, num_kv_heads=2, group=3, head_dim=48)
    m, pad = b.meta, 2
    padded = AttentionMetadata(
        slot_mapping=torch.cat([m.slot_mapping, torch.full((pad,), -1)]),
        query_start_loc=torch.arange(len(m.seq_lens) + pad + 1),
        seq_lens=torch.cat([m.seq_lens, torch.zeros(pad, dtype=torch.long)]),
        block_tables=torch.cat([m.block_tables, torch.zeros(pad, m.block_tables.shape[1]).int()]),
        num_decodes=len(m.seq_lens) + pad, max_query_len=1, max_seq_len=m.max_seq_len,
    )
    q = torch.cat([b.q, torch.randn(pad, *b.q.shape[1:])])
    k = torch.cat([b.k, torch.randn(pad, *b.k.shape[1:])])
    v = torch.cat([b.v, torch.randn(pad, *b.v.shape[1:])])
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
    triton_store_kv(b.k, b.v, b.k_cache, b.v_cache, m.slot_mapping)
    triton_store_kv(k, v, k_cache, v_cache, padded.slot_mapping)
    assert torch.equal(k_cache, b.k_cache) and torch.equal(v_cache, b.v_cache)
    out = triton_paged_attention(q, k_cache, v_cache, padded)
    assert torch.equal(out[:-pad], triton_paged_attention(b.q, b.k_cache, b.v_cache, m))
    assert torch.equal(out[-pad:], torch.zeros_like(out[-pad:]))


def test_padded_decode_steps_give_the_same_tokens():
    """What the CUDA graphs replay -- static buffers, batches padded up to a captured size -- checked on
    the CPU without the graphs: the padding rows must not change a single token."""
    model = tiny_random_model(seed=4)
    lengths = (14, 3, 9, 6)  # requests finish at different steps: decode batches of 3, 2 and 1
    _, expected = greedy_run(model, "torch", max_tokens=lengths)
    engine, got = greedy_run(model, "triton", max_tokens=lengths, padded_decode=True)
    padded = engine.executor.forward
    assert padded.replays >= 5, "too few pure decode steps took the padded path"
    assert {len(t.decode_tokens) for t in engine.trace if not t.prefill_tokens} >= {1, 2, 3}
    assert got == expected


def test_a_clear_error_when_triton_was_imported_compiled_first():
    """In a fresh process that imports Triton (via transformers) before asking for the CPU kernels, the
    engine says what went wrong instead of failing deep inside the interpreter."""
    script = ("import transformers.models.llama.modeling_llama, triton\n"
              "from minfer import LLMEngine\n"
              "LLMEngine(model='tiny-random', attention_backend='triton', num_blocks=8)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "needs Triton's interpreter, but Triton code was already" in run.stderr, run.stderr[-2000:]
