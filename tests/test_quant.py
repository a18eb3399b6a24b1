"""Weights in int8 and 4 bits: the formats' rounding bounds, the C++ kernel against its PyTorch reference, the GGUF
block reader against the ``gguf`` package's own dequantization, and whole engine runs with ``weights=``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import run_checked, tiny_engine
from minfer import EngineConfig, SamplingParams
from minfer.accelerate import QuantizedGateUp, QuantizedLinear, QuantizedLMHead, accelerate, describe, quantized_copy
from minfer.ops import quant_linear
from minfer.quant import gguf as gguf_blocks
from minfer.quant.formats import (
    Int8Weight,
    Q4Weight,
    expand_groups,
    max_rounding_error,
    quantize_int8,
    quantize_q4,
)

needs_kernel = pytest.mark.skipif(quant_linear.cpp_problem(torch.float32, "cpu") is not None,
                                  reason="the quantized C++ kernel does not build here")
QUANTIZE = {"int8": quantize_int8, "q4": quantize_q4}


def matrix(k: int, n: int, seed: int = 0) -> torch.Tensor:
    """A weight-like matrix: small values with a few outliers (which groups exist for)."""
    g = torch.Generator().manual_seed(seed)
    w = 0.05 * torch.randn(k, n, generator=g)
    w[torch.rand(k, n, generator=g) < 0.01] *= 20
    return w


# ---- the formats --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["int8", "q4"])
@pytest.mark.parametrize("shape,group", [((96, 192), 32), ((70, 33), 32), ((64, 5), 64), ((40, 7), 40)])
def test_dequantize_is_within_half_a_step_of_every_weight(fmt, shape, group):
    w = matrix(*shape)
    q = QUANTIZE[fmt](w, group)
    groups = -(-shape[0] // group)
    assert q.q.shape == shape and q.scales.shape == (groups, shape[1]) and q.scales.dtype == torch.float16
    low, high = (-127, 127) if fmt == "int8" else (0, 15)
    assert int(q.q.min()) >= low and int(q.q.max()) <= high
    error = (q.dequantize() - w).abs()
    bound = expand_groups(max_rounding_error(q), group, shape[0])
    assert (error <= bound).all(), float((error - bound).max())
    # and the bound is not slack: some weight of the matrix comes within a fifth of it
    assert float((error / bound).max()) > 0.2


def test_the_formats_bytes_per_weight():
    w = matrix(576, 1536)
    assert quantize_int8(w).nbytes() * 8 / w.numel() == 8.5  # a byte, and a float16 per 32
    assert quantize_q4(w).nbytes() * 8 / w.numel() == 5.0  # half a byte, and two float16 per 32


def test_int8_of_its_own_dequantization_is_itself():
    """A symmetric group's largest weight lands on +-127 exactly, so quantizing the dequantized matrix finds the
    same scale and values (why int8 of SmolLM2's LM head is bit for bit the GGUF's Q8_0)."""
    q = quantize_int8(matrix(96, 64))
    again = quantize_int8(q.dequantize())
    assert torch.equal(again.q, q.q) and torch.equal(again.scales, q.scales)


def test_a_zero_group_has_scale_zero_and_dequantizes_to_zero():
    w = matrix(64, 4)
    w[:32, 1] = 0
    for fmt in ("int8", "q4"):
        q = QUANTIZE[fmt](w)
        assert float(q.scales[0, 1]) == 0 and torch.equal(q.dequantize()[:32, 1], torch.zeros(32))


# ---- the kernel against the reference ------------------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("fmt", ["int8", "q4"])
@pytest.mark.parametrize("rows,k,n,group", [(1, 96, 192, 32), (3, 70, 33, 32), (12, 64, 17, 64), (13, 576, 100, 32),
                                            (40, 40, 50, 40), (130, 160, 65, 32)])
def test_the_kernel_computes_x_times_the_dequantized_weight(fmt, rows, k, n, group):
    """Shapes around the kernel's edges: 1 row (decode) to many row tiles, columns that fill no panel or leave a
    partial one, inputs that end in a partial group, and a group as long as the whole input. The sums run in another
    order than the reference's: outputs of size ~1 agree to a few float32 units in the last place (atol 5e-5)."""
    g = torch.Generator().manual_seed(rows * k + n)
    w, x, bias = QUANTIZE[fmt](matrix(k, n), group), torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    y = quant_linear.quantized_linear(x, quant_linear.pack_weight(w), bias)
    torch.testing.assert_close(y, quant_linear.reference_linear(x, w, bias), rtol=1e-5, atol=5e-5)


@needs_kernel
@pytest.mark.parametrize("fmt", ["int8", "q4"])
@pytest.mark.parametrize("rows,n", [(1, 192), (13, 66)])
def test_the_gated_kernel_applies_silu_gate_times_up(fmt, rows, n):
    w, x = QUANTIZE[fmt](matrix(96, n)), torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    gate, up = quant_linear.reference_linear(x, w).chunk(2, dim=1)
    y = quant_linear.quantized_linear(x, quant_linear.pack_weight(w, gated=True))
    torch.testing.assert_close(y, F.silu(gate) * up, rtol=1e-5, atol=5e-5)


@needs_kernel
def test_the_kernel_refuses_a_packing_for_other_inputs():
    packed = quant_linear.pack_weight(quantize_q4(matrix(64, 32)))
    with pytest.raises(RuntimeError, match="packed must be"):
        quant_linear.quantized_linear(torch.randn(2, 96), packed)


# ---- the GGUF's blocks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_gguf_blocks_dequantize_as_the_gguf_package_does(kind):
    """Raw blocks made by the ``gguf`` package's own quantizer, read by minfer: the same floats as its dequantizer."""
    from gguf import GGMLQuantizationType, quants

    rows = matrix(64, 10).t().contiguous().numpy()  # a GGUF matrix is [out, in]
    qtype = getattr(GGMLQuantizationType, kind)
    raw = quants.quantize(rows, qtype)
    ours = (gguf_blocks.q4_1_rows if kind == "Q4_1" else gguf_blocks.q8_0_rows)(raw)
    assert isinstance(ours, Q4Weight if kind == "Q4_1" else Int8Weight)
    theirs = torch.from_numpy(quants.dequantize(raw, qtype))
    assert torch.equal(gguf_blocks.transpose(ours).dequantize(), theirs.t())


def test_query_rows_go_back_in_the_order_transformers_puts_them():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows, heads = 24, 3
    expected = LlamaTensorProcessor()._reverse_permute_weights(np.arange(rows), heads, heads)
    assert gguf_blocks.unpermute_order(rows, heads).tolist() == expected.tolist()


def test_the_file_reader_reads_a_written_gguf(tmp_path):
    """A small GGUF written by the ``gguf`` package: minfer's reader finds its Q4_1 and Q8_0 tensors, at the right
    places, and skips the rest (and a long string array in the metadata, as a tokenizer's)."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    a, b = matrix(64, 6).t().contiguous().numpy(), matrix(32, 4, seed=1).t().contiguous().numpy()
    writer = GGUFWriter(tmp_path / "m.gguf", "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"word{i}" for i in range(300)])
    writer.add_tensor("a", quants.quantize(a, GGMLQuantizationType.Q4_1), raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("f", np.ones((3, 5), dtype=np.float32))
    writer.add_tensor("b", quants.quantize(b, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    architecture, tensors = gguf_blocks.quantized_tensors(tmp_path / "m.gguf")
    assert architecture == "llama" and set(tensors) == {"a", "b"}
    for name, kind, rows in (("a", "Q4_1", a), ("b", "Q8_0", b)):
        assert tensors[name][0] == kind
        assert np.array_equal(tensors[name][1], quants.quantize(rows, getattr(GGMLQuantizationType, kind)))


def test_a_files_blocks_are_taken_only_when_they_are_exactly_the_weight():
    w = matrix(64, 48)
    blocks = quantize_q4(w)
    exact = blocks.dequantize()
    taken, source = quantized_copy("q4", "layers.0.o_proj.weight", exact, {"layers.0.o_proj.weight": blocks})
    assert taken is blocks and source == "q4: the GGUF's own Q4_1 blocks"
    other, source = quantized_copy("q4", "layers.0.o_proj.weight", w, {"layers.0.o_proj.weight": blocks})
    assert other is not blocks and source == "q4: quantized at build, groups of 32"
    head, source = quantized_copy("q4", "embed_tokens.weight", w, {}, lm_head=True)
    assert isinstance(head, Int8Weight) and source.startswith("int8")


# ---- the engine ----------------------------------------------------------------------------------------------------
def test_a_bad_weights_value_names_the_choices():
    with pytest.raises(ValueError, match=r"weights.*'dtype', 'int8', 'q4'"):
        EngineConfig(model="tiny-random", weights="int4")
    with pytest.raises(ValueError, match="not 'onednn'"):
        EngineConfig(model="tiny-random", weights="q4", linear_backend="onednn")


def test_the_reference_runs_where_linear_backend_is_torch(tiny):
    model, _ = tiny
    fast = accelerate(model, "torch", "torch", "int8")
    layer = fast.layers[0]
    assert isinstance(layer.qkv_proj, QuantizedLinear) and layer.qkv_proj.packed is None
    assert isinstance(layer.gate_up_proj, QuantizedGateUp) and isinstance(fast.logits, QuantizedLMHead)
    text = " ".join(describe(fast).split())
    assert "x Linear -> QuantizedLinear (torch, int8: quantized at build, groups of 32)" in text, text
    assert "linear_backend='torch': dequantize, then x @ W" in text
    x = torch.randn(5, model.config.hidden_size)
    expected = x @ quantize_int8(model.layers[0].qkv_proj.weight).dequantize()
    torch.testing.assert_close(layer.qkv_proj(x), expected)


@needs_kernel
def test_a_weight_written_after_the_swap_is_quantized_again(tiny):
    model, _ = tiny
    model = type(model)(model.config)  # a model of our own to write into
    model.load_state_dict(tiny[0].state_dict())
    fast = accelerate(model, "cpp", "torch", "q4")
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.layers[0].o_proj.weight.mul_(2)
    expected = x @ quantize_q4(model.layers[0].o_proj.weight).dequantize()
    torch.testing.assert_close(fast.layers[0].o_proj(x), expected, rtol=1e-5, atol=5e-5)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@needs_kernel
@pytest.mark.parametrize("fmt", ["int8", "q4"])
def test_an_engine_with_quantized_weights_preempts_chunks_and_caches_prefixes_as_any(tiny, fmt):
    """The weight format is below the scheduler: a pool too small for the load (preemption), prompts longer than a
    chunk and a shared prefix give the same tokens as an engine with room for everything, invariants checked after
    every step. The kernel and the reference agree on every token too."""
    rng = random.Random(1)
    shared = [rng.randrange(3, 300) for _ in range(24)]
    prompts = [shared + [rng.randrange(3, 300) for _ in range(n)] for n in (30, 5, 50, 12)]
    lengths = [60, 40, 30, 45]

    def run(**config) -> tuple[dict, object]:
        e = tiny_engine(tiny, weights=fmt, pointwise_backend="torch", **config)
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            e.add_request(f"r{i}", p, greedy(n))
        return {rid: o.outputs[0].token_ids for rid, o in run_checked(e).items()}, e

    tight, engine = run(linear_backend="cpp", num_blocks=16, block_size=8, chunked_prefill_size=16, max_num_seqs=4,
                        enable_prefix_caching=True)
    assert sum(len(t.preempted) for t in engine.trace) > 0  # the pool was too small: someone was preempted
    assert any(sum(t.prefill_tokens.values()) == 16 for t in engine.trace)  # prompts were chunked
    assert "QuantizedLinear (cpp" in describe(engine.executor.model)
    roomy, _ = run(linear_backend="cpp", num_blocks=128)
    reference, _ = run(linear_backend="torch", num_blocks=128)
    assert tight == roomy == reference
    assert all(len(tight[f"r{i}"]) == n for i, n in enumerate(lengths))
