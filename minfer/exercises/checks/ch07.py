"""Chapter 07: the online-softmax loop of the Triton paged-attention kernel (E7.1) and the bytes the
reference moves (E7.2). Without a GPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``,
which ``python -m minfer.exercises`` sets before Triton is imported)."""

from __future__ import annotations

import torch

from minfer.exercises.checks.common import tiny_model
from minfer.exercises.harness import Measurement, Tester
from minfer.ops.paged_attention import gather_kv, paged_attention, store_kv
from minfer.ops.testing import PagedBatch, random_paged_batch


def kernel_module():
    import minfer.ops.triton_paged_attention as module

    kind = type(module.paged_attention_kernel).__name__
    if not torch.cuda.is_available() and kind != "InterpretedFunction":
        raise RuntimeError("Triton was imported in compiled mode on a machine without a GPU: run the check with "
                           "TRITON_INTERPRET=1 set before anything imports triton (python -m minfer.exercises does)")
    return module


def compare(b: PagedBatch, what: str, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    store_kv(b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)  # the step's own keys, as the engine stores them
    with torch.inference_mode():
        want = paged_attention(b.q, b.k_cache, b.v_cache, b.meta)
        got = kernel_module().triton_paged_attention(b.q, b.k_cache, b.v_cache, b.meta)
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: the output holds NaN or inf -- an exp() overflowed or divided 0 by 0")
    err = ((got - want).abs() / (want.abs() + 1e-3)).max().item()
    assert torch.allclose(got, want, atol=atol, rtol=rtol), (
        f"{what}: the kernel's output differs from the PyTorch reference (largest relative error {err:.2e})")


def check_online_softmax(t: Tester) -> None:
    with t.case("one decode token that sees only itself (context 0)",
                hint="a query at position p sees keys 0..p: `k_pos <= q_pos`, and keys past kv_end are masked"):
        compare(random_paged_batch([(0, 1)], seed=1), "context 0")

    with t.case("decodes over 1, 2 and 3 tiles of keys (contexts 5, 63, 64, 65, 150)",
                hint="each tile: load its blocks through the block table (k_pos // BLOCK_SIZE, k_pos % BLOCK_SIZE), "
                     "then fold its scores into m_i, l_i and acc"):
        compare(random_paged_batch([(5, 1), (63, 1), (64, 1), (65, 1), (150, 1)], seed=2), "multi-tile decodes")

    with t.case("scores that grow from tile to tile: what was summed must be rescaled",
                hint="when the maximum rises from m_i to m_new, multiply both l_i and acc by exp2(m_i - m_new)"):
        b = random_paged_batch([(190, 1), (130, 1)], seed=3, num_kv_heads=2, group=3, head_dim=64)
        b.q.copy_(torch.ones_like(b.q) * 0.3)
        keys, bs = b.k_cache.view(-1, *b.k_cache.shape[2:]), b.k_cache.shape[1]
        for i, n in enumerate(b.meta.seq_lens.tolist()):
            table = b.meta.block_tables[i].tolist()
            for pos in range(n):  # the key at position p scores in proportion to p: every tile raises the max
                keys[table[pos // bs] * bs + pos % bs] = pos / 40
        b.k.copy_(torch.ones_like(b.k) * 5.0)  # the newest key (stored by the step) scores highest
        compare(b, "growing scores")

    with t.case("large scores (q * 60, up to 2^200 in exp2): exp would overflow without the running maximum",
                hint="never exponentiate a raw score: use exp2(s - m_new), where m_new is the running maximum"):
        b = random_paged_batch([(40, 1), (100, 1), (0, 9)], seed=4)
        b.q.mul_(60.0)
        compare(b, "large scores", atol=1e-4, rtol=1e-3)  # near one-hot: rounding in the scores shows more

    with t.case("prefill chunks: a fresh 23-token prompt, a 9-token chunk starting mid-block, decodes beside them",
                hint="causality inside a chunk: query i sits at position context + i and sees keys up to it"):
        compare(random_paged_batch([(0, 1), (17, 1), (40, 1), (0, 23), (21, 9)], seed=5), "mixed step")

    with t.case("GQA 1 and 3, head_dim 48 (no power of two), block_size 32",
                hint="keep the masks on d_ok and k_ok in both loads; rows of one K/V head share each K/V tile"):
        compare(random_paged_batch([(70, 1), (3, 1), (10, 40)], block_size=32, num_kv_heads=3, group=1,
                                   head_dim=48, seed=6), "GQA 1, head_dim 48")
        compare(random_paged_batch([(33, 1), (0, 17)], block_size=32, num_kv_heads=2, group=3, head_dim=48,
                                   seed=7), "GQA 3, head_dim 48")

    with t.case("the tiny model: attention_backend='triton' gives the reference backend's greedy tokens",
                hint="the kernel cases above pass but the engine differs: look at what differs between calls"):
        from minfer import EngineConfig, LLMEngine, SamplingParams
        from minfer.model.tokenizer import ByteTokenizer

        tokens = {}
        for backend in ("torch", "triton"):
            engine = LLMEngine(EngineConfig(model="tiny-random", attention_backend=backend, num_blocks=24,
                                            max_num_seqs=3, chunked_prefill_size=13),
                               model=tiny_model(), tokenizer=ByteTokenizer())
            for i, n in enumerate((7, 30, 2)):
                engine.add_request(f"r{i}", [10 + j for j in range(n)],
                                   SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
            tokens[backend] = {k: o.outputs[0].token_ids for k, o in t.run(engine).items()}
        assert tokens["triton"] == tokens["torch"], "the Triton backend changed the generated tokens"


def measure_bytes_ratio() -> Measurement:
    gen = torch.Generator().manual_seed(0)
    contexts = torch.randint(20, 600, (32,), generator=gen)
    layers, kv_heads, head_dim, bf16 = 30, 3, 64, 2
    b = random_paged_batch([(int(c), 1) for c in contexts], num_kv_heads=kv_heads, head_dim=head_dim, group=3)
    keys = gather_kv(b.k_cache, b.meta.block_tables, int(b.meta.seq_lens.max()))
    padded = 2 * keys.numel() * bf16 * layers
    needed = 2 * int(b.meta.seq_lens.sum()) * kv_heads * head_dim * bf16 * layers
    ratio = (needed + 2 * padded) / needed
    return Measurement(
        ratio, "x", rel_tol=0.25,
        explain=f"The kernel reads each cached key and value once: {needed / 1e6:.1f} MB. The reference reads them "
                f"too, writes a copy padded to the longest context ({keys.shape[2]} tokens x 32 requests: "
                f"{padded / 1e6:.1f} MB), then attention reads that copy again: {(needed + 2 * padded) / 1e6:.1f} MB, "
                f"{ratio:.1f}x. Padding is what makes it this large: the mean context is about half the longest. "
                "Without padding it would be 3x (read, write the copy, read it again); a guess near 2x forgets that "
                "attention reads the copy a second time.")
