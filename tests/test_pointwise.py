"""The compiled CPU kernels for RMSNorm, rotary and SiLU-and-mul (``pointwise_backend="cpp"``) against PyTorch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import check_engines_sharing_a_model, whole_sequence_hidden
from minfer import EngineConfig
from minfer.accelerate import CompiledGateUp, CompiledRMSNorm, CompiledRotary, accelerate
from minfer.model.llama import ApplyRotary, RMSNorm, apply_rotary, silu_mul
from minfer.model.loader import load_model
from minfer.notices import say_once
from minfer.ops import pointwise
from minfer.ops.cpp_build import have_compiler

needs_kernels = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler: the kernels cannot build")


@pytest.fixture(scope="module")
def kernels():
    if not have_compiler():
        pytest.skip("no C++ compiler")
    return pointwise.kernels()


def tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_reference_for_strided_rows_and_heads(kernels, dtype):
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    wide = torch.randn(37, 200, dtype=dtype) * 3
    rows = wide[:, 10:74]  # rows 200 apart, as a slice of a fused product is
    torch.testing.assert_close(kernels.rms_norm(rows, norm.weight, norm.eps), norm(rows), **tolerance(dtype))
    heads = torch.randn(5, 9, 64, dtype=dtype)  # [tokens, heads, head size]: Qwen3's q and k norms
    out = kernels.rms_norm(heads, norm.weight, norm.eps)
    assert out.shape == heads.shape
    torch.testing.assert_close(out, norm(heads), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_in_place_equals_the_reference(kernels, dtype):
    torch.manual_seed(1)
    t, heads, d = 23, 12, 64
    product = torch.randn(t, heads * d + 100, dtype=dtype)  # q and k heads at the front of a wider product
    qk = product[:, : heads * d].view(t, heads, d)
    angles = torch.rand(t, 1, d // 2) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    want = apply_rotary(qk, cos, sin)
    rest = product[:, heads * d:].clone()
    kernels.rotary_(qk, cos, sin)
    torch.testing.assert_close(qk, want, **tolerance(dtype))
    assert torch.equal(product[:, heads * d:], rest)  # the columns beside q and k are not touched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_equals_the_reference_over_the_whole_range(kernels, dtype):
    """The kernel's own exp (a polynomial) holds to float32 rounding from far below zero to far above."""
    gate = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(999) * 4])
    gate_up = torch.cat([gate, torch.randn(5000)]).view(1, -1).repeat(3, 1).to(dtype)
    got, want = kernels.silu_mul(gate_up), silu_mul(gate_up)
    assert got.shape == (3, 5000)
    torch.testing.assert_close(got, want, **tolerance(dtype))
    assert torch.isfinite(got).all()


def test_kernels_refuse_tensors_they_cannot_read(kernels):
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight must be contiguous, one value per column"):
        kernels.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="the last contiguous"):
        kernels.rms_norm(x.t(), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="cos and sin must be contiguous"):
        kernels.rotary_(torch.randn(4, 2, 8), torch.ones(4, 8, dtype=torch.float64), torch.ones(4, 8))
    with pytest.raises(RuntimeError, match="gate and up side by side"):
        kernels.silu_mul(torch.randn(4, 7))


@needs_kernels
def test_the_model_gives_the_same_hidden_states_with_either_backend():
    model, _ = load_model("tiny-random")
    ids = list(range(3, 60))
    reference = whole_sequence_hidden(model, ids)
    fast = accelerate(model, linear_backend="torch", pointwise_backend="cpp")
    assert isinstance(fast.norm, CompiledRMSNorm) and isinstance(fast.layers[0].rotate, CompiledRotary)
    assert all(isinstance(layer.input_layernorm, CompiledRMSNorm) and isinstance(layer.gate_up_proj, CompiledGateUp)
               for layer in fast.layers)
    compiled = whole_sequence_hidden(fast, ids)
    assert type(model.layers[0].input_layernorm) is RMSNorm and type(model.layers[0].rotate) is ApplyRotary
    torch.testing.assert_close(compiled, reference, atol=1e-5, rtol=1e-5)


def test_auto_picks_the_kernels_only_where_they_build(monkeypatch, capsys):
    assert pointwise.resolve_pointwise_backend("torch", "cpu") == "torch"
    assert pointwise.resolve_pointwise_backend("auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="pointwise_backend='cpp' is CPU kernels"):
        EngineConfig(device="cuda", pointwise_backend="cpp")
    with pytest.raises(ValueError, match="pointwise_backend must be one of"):
        EngineConfig(pointwise_backend="numba")
    monkeypatch.setattr(pointwise, "problem", lambda kind: "no C++ compiler was found")
    say_once.cache_clear()
    assert pointwise.resolve_pointwise_backend("auto", "cpu") == "torch"
    assert "skips 'cpp' (no C++ compiler was found)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pointwise_backend='cpp' cannot run here: no C\\+\\+ compiler"):
        pointwise.resolve_pointwise_backend("cpp", "cpu")
    monkeypatch.setattr(pointwise, "problem", lambda kind: None)
    assert pointwise.resolve_pointwise_backend("auto", "cpu") == "cpp"


@needs_kernels
def test_engines_sharing_a_model_each_get_their_own_pointwise_steps(tiny):
    check_engines_sharing_a_model(tiny, "pointwise_backend", ("torch", "cpp"),
                                  lambda model: "cpp" if isinstance(model.norm, CompiledRMSNorm) else "torch")


def test_silu_reference_is_the_gate_times_up():
    gate_up = torch.randn(3, 10)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate_up[:, :5]) * gate_up[:, 5:])
