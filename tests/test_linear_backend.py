"""The model's matrix products through oneDNN's packed weights (``linear_backend``) against ``x @ W``."""

from __future__ import annotations

import pytest
import torch

from conftest import check_engines_sharing_a_model, whole_sequence_hidden
from minfer import EngineConfig
from minfer.model.loader import load_model
from minfer.ops.linear import onednn_supports, packed_linear, padded_rows, repack, resolve_linear_backend

needs_onednn = pytest.mark.skipif(onednn_supports(torch.float32, "cpu") is not None,
                                  reason=f"{onednn_supports(torch.float32, 'cpu')}")


def logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits for one sequence (no engine, only the model's products)."""
    with torch.inference_mode():
        return model.compute_logits(whole_sequence_hidden(model, ids))


@needs_onednn
def test_packed_products_give_the_same_logits():
    """Same weights, same logits up to float32 rounding, for every product including the LM head."""
    model, _ = load_model("tiny-random")
    ids = list(range(3, 40))
    model.use_linear_backend("torch")
    plain = logits(model, ids)
    model.use_linear_backend("onednn")
    assert all(layer.qkv_proj.packed is not None for layer in model.layers) and model.lm_head_packed is not None
    packed = logits(model, ids)
    model.use_linear_backend("torch")  # drops the copies again
    assert model.layers[0].down_proj.packed is None and model.lm_head_packed is None
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-4)


@needs_onednn
def test_a_weight_written_after_packing_is_packed_again():
    """The packed copy follows its weight: new weights loaded into the model are what the next step multiplies."""
    model, _ = load_model("tiny-random")
    ids = list(range(3, 30))
    model.use_linear_backend("onednn")
    first = model.layers[0].gate_up_proj.packed
    model.use_linear_backend("onednn")
    assert model.layers[0].gate_up_proj.packed is first  # unchanged weight: the same copy, not packed again
    before = logits(model, ids)
    with torch.no_grad():
        model.layers[0].gate_up_proj.weight.mul_(2.0)
        model.embed_tokens.weight.mul_(0.5)  # the tied LM head
    model.use_linear_backend("onednn")
    assert model.layers[0].gate_up_proj.packed is not first
    model_plain, _ = load_model("tiny-random")
    with torch.no_grad():
        model_plain.layers[0].gate_up_proj.weight.mul_(2.0)
        model_plain.embed_tokens.weight.mul_(0.5)
    torch.testing.assert_close(logits(model, ids), logits(model_plain, ids), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits(model, ids), before)


def test_auto_picks_onednn_only_where_it_runs():
    assert resolve_linear_backend("auto", torch.float32, "cuda") == "torch"
    assert resolve_linear_backend("torch", torch.float32, "cpu") == "torch"
    assert resolve_linear_backend("auto", torch.float16, "cpu") == "torch"
    expected = "torch" if onednn_supports(torch.float32, "cpu") else "onednn"
    assert resolve_linear_backend("auto", torch.float32, "cpu") == expected
    with pytest.raises(ValueError, match="linear_backend='onednn' cannot run here: .*float16"):
        resolve_linear_backend("onednn", torch.float16, "cpu")
    with pytest.raises(ValueError, match="linear_backend='onednn' packs weights for CPU kernels"):
        EngineConfig(device="cuda", linear_backend="onednn")
    with pytest.raises(ValueError, match="linear_backend must be one of"):
        EngineConfig(linear_backend="mkl")


@needs_onednn
def test_engines_sharing_a_model_each_get_their_own_products(tiny):
    check_engines_sharing_a_model(tiny, "linear_backend", ("torch", "onednn"),
                                  lambda model: "torch" if model.lm_head_packed is None else "onednn")


def test_padded_rows_bound_the_shapes_onednn_compiles():
    """oneDNN compiles and keeps a kernel per row count: padded, every count up to 4,096 meets 70 shapes."""
    assert [padded_rows(n) for n in (1, 8, 9, 39, 64, 65, 128, 129, 512)] == [8, 8, 16, 40, 64, 128, 128, 192, 512]
    assert len({padded_rows(n) for n in range(1, 4097)}) == 8 + (4096 - 64) // 64
    assert all(n <= padded_rows(n) < n + 64 for n in range(1, 4097))


@needs_onednn
def test_padding_rows_leaves_each_row_its_own_product():
    """Odd row counts are padded with zero rows and cut back: each row's result is its own, whatever the count."""
    weight = torch.randn(24, 40)
    packed = repack(weight, None, transposed=True)
    x = torch.randn(70, 24)
    for rows in (1, 7, 9, 65, 70):
        out = packed_linear(x[:rows], packed)
        assert out.shape == (rows, 40)
        torch.testing.assert_close(out, x[:rows] @ weight, rtol=1e-5, atol=1e-5)
