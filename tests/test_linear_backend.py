"""The model's matrix products on packed weights (``linear_backend``: minfer's C++ kernel, oneDNN) against ``x @ W``."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import check_engines_sharing_a_model, whole_sequence_hidden
from minfer import EngineConfig
from minfer.accelerate import PackedLinear, PackedLMHead, accelerate
from minfer.model.llama import Linear, LMHead
from minfer.model.loader import load_model
from minfer.notices import say_once
from minfer.ops.linear import (
    PACKED_BACKENDS,
    cpp_problem,
    kernels,
    onednn_problem,
    pack,
    pack_gated,
    pack_weight,
    packed_linear,
    padded_rows,
    problem,
    resolve_linear_backend,
    shared_pack,
)

needs_onednn = pytest.mark.skipif(onednn_problem(torch.float32, "cpu") is not None,
                                  reason=f"{onednn_problem(torch.float32, 'cpu')}")
needs_cpp = pytest.mark.skipif(cpp_problem(torch.float32, "cpu") is not None,
                               reason=f"{cpp_problem(torch.float32, 'cpu')}")
packing_backends = pytest.mark.parametrize("backend", [
    pytest.param(name, marks=pytest.mark.skipif(problem(name, torch.float32, "cpu") is not None,
                                                reason=f"{problem(name, torch.float32, 'cpu')}"))
    for name in PACKED_BACKENDS])


def logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits for one sequence (no engine, only the model's products)."""
    with torch.inference_mode():
        return model.compute_logits(whole_sequence_hidden(model, ids))


@packing_backends
def test_packed_products_give_the_same_logits(backend):
    """Same weights, same logits up to float32 rounding, for every product including the LM head; the plain model
    the stand-ins were made from still multiplies ``x @ W``."""
    model, _ = load_model("tiny-random")
    ids = list(range(3, 40))
    plain = logits(model, ids)
    fast = accelerate(model, linear_backend=backend, pointwise_backend="torch")
    assert all(isinstance(layer.qkv_proj, PackedLinear) and layer.qkv_proj.packed.backend == backend
               for layer in fast.layers)
    assert isinstance(fast.logits, PackedLMHead) and fast.logits.packed.backend == backend
    assert type(model.layers[0].qkv_proj) is Linear and type(model.logits) is LMHead  # left as it was
    torch.testing.assert_close(logits(fast, ids), plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits(model, ids), plain)


@packing_backends
def test_a_weight_written_after_packing_is_packed_again(backend):
    """The packed copy follows its weight: new weights loaded into the model are what the next product multiplies,
    in the model and in every accelerated copy of it (they share the weights)."""
    model, _ = load_model("tiny-random")
    ids = list(range(3, 30))
    fast = accelerate(model, linear_backend=backend, pointwise_backend="torch")
    first = fast.layers[0].gate_up_proj.packed
    assert accelerate(model, linear_backend=backend).layers[0].gate_up_proj.packed is first  # shared, not repacked
    before = logits(fast, ids)
    with torch.no_grad():
        model.layers[0].gate_up_proj.weight.mul_(2.0)
        model.embed_tokens.weight.mul_(0.5)  # the tied LM head
    after = logits(fast, ids)
    assert fast.layers[0].gate_up_proj.packed is not first
    torch.testing.assert_close(after, logits(model, ids), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(after, before)


@packing_backends
def test_shared_copies_are_one_per_weight_and_go_with_it(backend):
    """``shared_pack`` hands out one copy per weight while it is unchanged, a new one once it is written, and drops
    it with the weight (a model that is gone leaves no packed copy behind)."""
    import gc

    from minfer.ops import linear

    weight = torch.randn(16, 24)
    first = shared_pack(weight, transposed=True, backend=backend)
    assert shared_pack(weight, transposed=True, backend=backend) is first
    assert shared_pack(weight.clone(), transposed=True, backend=backend) is not first  # another weight, equal values
    weight.add_(1.0)
    assert shared_pack(weight, transposed=True, backend=backend) is not first
    keys = [k for k in linear._SHARED if k[0] == id(weight)]
    del weight
    gc.collect()
    assert keys and not any(k in linear._SHARED for k in keys)


def test_auto_picks_the_first_backend_that_runs():
    """``auto``: minfer's C++ kernel for float32 on a CPU where it builds, else oneDNN where it runs, else ``x @ W``."""
    assert resolve_linear_backend("auto", torch.float32, "cuda") == "torch"
    assert resolve_linear_backend("torch", torch.float32, "cpu") == "torch"
    assert resolve_linear_backend("auto", torch.float16, "cpu") == "torch"
    onednn = "torch" if onednn_problem(torch.float32, "cpu") else "onednn"
    expected = "cpp" if cpp_problem(torch.float32, "cpu") is None else onednn
    assert resolve_linear_backend("auto", torch.float32, "cpu") == expected
    bf16 = "torch" if onednn_problem(torch.bfloat16, "cpu") else "onednn"  # the C++ kernel is float32 only
    assert resolve_linear_backend("auto", torch.bfloat16, "cpu") == bf16
    with pytest.raises(ValueError, match="linear_backend='onednn' cannot run here: .*float16"):
        resolve_linear_backend("onednn", torch.float16, "cpu")
    with pytest.raises(ValueError, match="linear_backend='cpp' cannot run here: .*float32, not torch.bfloat16"):
        resolve_linear_backend("cpp", torch.bfloat16, "cpu")
    for name in PACKED_BACKENDS:
        with pytest.raises(ValueError, match=f"linear_backend='{name}' packs weights for CPU kernels"):
            EngineConfig(device="cuda", linear_backend=name)
    with pytest.raises(ValueError, match="linear_backend must be one of"):
        EngineConfig(linear_backend="mkl")


@packing_backends
def test_engines_sharing_a_model_each_get_their_own_products(tiny, backend):
    check_engines_sharing_a_model(tiny, "linear_backend", ("torch", backend),
                                  lambda model: model.logits.backend if isinstance(model.logits, PackedLMHead)
                                  else "torch")


def test_padded_rows_bound_the_shapes_onednn_compiles():
    """oneDNN compiles and keeps a kernel per row count: padded, every count up to 4,096 meets 70 shapes."""
    assert [padded_rows(n) for n in (1, 8, 9, 39, 64, 65, 128, 129, 512)] == [8, 8, 16, 40, 64, 128, 128, 192, 512]
    assert len({padded_rows(n) for n in range(1, 4097)}) == 8 + (4096 - 64) // 64
    assert all(n <= padded_rows(n) < n + 64 for n in range(1, 4097))


@needs_onednn
def test_padding_rows_leaves_each_row_its_own_product():
    """Odd row counts are padded with zero rows and cut back: each row's result is its own, whatever the count."""
    weight = torch.randn(24, 40)
    packed = pack_weight(weight, transposed=True)
    x = torch.randn(70, 24)
    for rows in (1, 7, 9, 65, 70):
        out = packed_linear(x[:rows], packed)
        assert out.shape == (rows, 40)
        torch.testing.assert_close(out, x[:rows] @ weight, rtol=1e-5, atol=1e-5)


def test_pack_lays_out_column_panels():
    """Panel ``p`` is columns ``p * width`` onwards, row after row; the last panel is padded with zeros."""
    w = torch.arange(3 * 5, dtype=torch.float32).view(3, 5)  # [in=3, out=5]
    panels = pack(w, 2)
    assert panels.shape == (3, 3, 2) and panels.is_contiguous()
    torch.testing.assert_close(panels[1], w[:, 2:4])
    torch.testing.assert_close(panels[2], torch.stack([w[:, 4], torch.zeros(3)], dim=1))


@needs_cpp
@pytest.mark.parametrize("shape", [(24, 40), (7, 33), (64, 96), (1, 1)])
def test_cpp_kernel_equals_x_at_w_for_any_rows_and_columns(shape):
    """Every row count (tiles of 1 to 12 rows, several tiles), columns not a multiple of a panel, an ``[out, in]``
    weight (the LM head's layout), a strided input and a bias: each result is ``x @ W``'s to float32 rounding."""
    torch.manual_seed(0)
    k, n = shape
    weight = torch.randn(k, n)
    packed = pack_weight(weight, transposed=True, backend="cpp")
    from_out_in = pack_weight(weight.t().contiguous(), transposed=False, backend="cpp")
    assert packed.tensor.shape == (-(-n // kernels().panel_width()), k, kernels().panel_width())
    x = torch.randn(70, 2 * k)[:, ::2]  # every other column: not contiguous
    bias = torch.randn(n)
    for rows in (0, 1, 5, 11, 12, 13, 25, 33, 70):
        out = packed_linear(x[:rows], packed)
        assert out.shape == (rows, n)
        torch.testing.assert_close(out, x[:rows] @ weight, rtol=1e-5, atol=1e-4)
        assert torch.equal(packed_linear(x[:rows], from_out_in), out)
        torch.testing.assert_close(packed_linear(x[:rows], packed, bias), x[:rows] @ weight + bias, rtol=1e-5,
                                   atol=1e-4)


def test_pack_gated_alternates_gate_and_up_panels():
    """Gate's panel j, then up's panel j: each half packed as ``pack`` packs it (its own last panel padded)."""
    w = torch.arange(3 * 6, dtype=torch.float32).view(3, 6)  # [in=3, 2 * 3]: gate's 3 columns, then up's
    panels = pack_gated(w, 2)
    gate, up = pack(w[:, :3], 2), pack(w[:, 3:], 2)
    assert panels.shape == (4, 3, 2) and panels.is_contiguous()
    for j in range(2):
        assert torch.equal(panels[2 * j], gate[j]) and torch.equal(panels[2 * j + 1], up[j])


@needs_cpp
@pytest.mark.parametrize("shape", [(24, 80), (7, 2 * 33), (1536 // 8, 2 * 96)])
def test_gated_product_is_the_product_then_silu_mul(shape):
    """A gated copy returns ``silu(x @ W_gate) * (x @ W_up)``: the very floats of the plain product followed by the
    SiLU-and-mul kernel (same sums, same activation arithmetic), for any rows, and close to the PyTorch reference."""
    from minfer.model.llama import silu_mul
    from minfer.ops.pointwise import kernels as pointwise_kernels

    torch.manual_seed(0)
    k, n = shape
    weight = torch.randn(k, n) / k**0.5
    plain = pack_weight(weight, transposed=True, backend="cpp")
    gated = pack_weight(weight, transposed=True, backend="cpp", gated=True)
    assert gated.gated and not plain.gated
    x = torch.randn(40, k)
    for rows in (0, 1, 12, 13, 40):
        out = packed_linear(x[:rows], gated)
        assert out.shape == (rows, n // 2)
        assert torch.equal(out, pointwise_kernels().silu_mul(packed_linear(x[:rows], plain)))
        torch.testing.assert_close(out, silu_mul(x[:rows] @ weight), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="gated product takes no bias"):
        packed_linear(x, gated, torch.zeros(n))
    assert not pack_weight(weight, transposed=True, backend="onednn", gated=True).gated  # only the C++ kernel


@needs_cpp
def test_every_panel_is_computed_once_whatever_the_threads():
    """The threads share the panels out and take each other's leftovers: with 1, 2, 3 or more threads than panels
    the result is the same, bit for bit (a panel skipped would leave uninitialized memory, one done twice by two
    threads would still be equal -- so the count of panels, 5, is odd and smaller than some thread counts)."""
    torch.manual_seed(0)
    weight = torch.randn(48, 5 * kernels().panel_width())
    packed = pack_weight(weight, transposed=True, backend="cpp")
    x = torch.randn(30, 48)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3, 8):
            torch.set_num_threads(count)
            results.append(packed_linear(x, packed))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(results[0], x @ weight, rtol=1e-5, atol=1e-4)
    assert all(torch.equal(r, results[0]) for r in results[1:])


@needs_cpp
def test_cpp_kernel_rejects_what_it_cannot_multiply():
    packed = pack_weight(torch.randn(8, 16), transposed=True, backend="cpp")
    with pytest.raises(RuntimeError, match="contiguous .* float32"):
        kernels().linear(torch.randn(3, 8, dtype=torch.float64), packed.tensor, 16)
    with pytest.raises(RuntimeError, match="packed must be"):
        kernels().linear(torch.randn(3, 9), packed.tensor, 16)
    with pytest.raises(RuntimeError, match="packed must be"):  # a gated weight has twice the panels of its result
        kernels().linear(torch.randn(3, 8), packed.tensor, 16, True)


def test_auto_falls_back_to_onednn_with_a_notice_where_the_kernel_does_not_build(monkeypatch, capsys):
    import minfer.ops.linear as linear

    monkeypatch.setattr(linear, "cpp_problem", lambda dtype, device: "no C++ compiler found")
    say_once.cache_clear()
    expected = "torch" if onednn_problem(torch.float32, "cpu") else "onednn"
    assert resolve_linear_backend("auto", torch.float32, "cpu") == expected
    assert "linear_backend='auto' skips 'cpp' (no C++ compiler found)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=re.escape("linear_backend='cpp' cannot run here: no C++ compiler found")):
        resolve_linear_backend("cpp", torch.float32, "cpu")


def test_whole_model_dtypes_says_bfloat16_or_why_not():
    import torch

    from minfer.ops.linear import onednn_problem, whole_model_dtypes

    dtypes, why = whole_model_dtypes()
    native = onednn_problem(torch.bfloat16, "cpu") is None
    assert (dtypes, why is None) == ((("bfloat16",), True) if native else ((), False))
