"""The speed-up layer (``minfer/accelerate.py``): stand-ins swapped in once, in a copy of the model that shares its
weights; the plain model untouched; ``describe`` says what runs where and why."""

from __future__ import annotations

import pytest
import torch

from conftest import whole_sequence_hidden
from minfer import LLM, EngineConfig, LLMEngine, SamplingParams
from minfer.accelerate import (
    CompiledRMSNorm,
    PackedGateUp,
    PackedLinear,
    accelerate,
    choose_pointwise,
    choose_products,
    describe,
    share_weights,
)
from minfer.config import SPEED_UPS
from minfer.engine import OFFLINE_DEFAULTS
from minfer.model.llama import ApplyRotary, GateUp, Linear, LMHead, RMSNorm
from minfer.model.loader import load_model
from minfer.notices import say_once
from minfer.ops import linear, pointwise

PLAIN_CLASSES = (Linear, GateUp, LMHead, RMSNorm, ApplyRotary)
needs_cpp = pytest.mark.skipif(linear.cpp_problem(torch.float32, "cpu") is not None or pointwise.problem("cpu"),
                               reason="the C++ kernels do not build here")


def plain_only(model: torch.nn.Module) -> bool:
    """No module of ``model`` is a stand-in of the speed-up layer."""
    return all(type(m).__module__ != "minfer.accelerate" for m in model.modules())


def test_share_weights_copies_the_tree_not_the_weights():
    model, _ = load_model("tiny-random")
    twin = share_weights(model)
    assert twin is not model and twin.layers[0] is not model.layers[0]
    assert all(a is b for a, b in zip(twin.parameters(), model.parameters()))
    assert twin.rotary.cos is model.rotary.cos
    twin.layers[0].o_proj = torch.nn.Identity()  # a swap in the copy...
    assert isinstance(model.layers[0].o_proj, Linear)  # ...is not seen by the model


def test_torch_everywhere_keeps_every_module_and_says_why():
    model, _ = load_model("tiny-random")
    fast = accelerate(model, "torch", "torch")
    assert plain_only(fast)
    text = " ".join(describe(fast).split())  # (describe pads its columns)
    for cls in ("Linear", "GateUp", "LMHead", "RMSNorm", "ApplyRotary"):
        assert f"x {cls} -> kept" in text, text
    assert "linear_backend='torch'" in text and "pointwise_backend='torch'" in text
    assert describe(model) == "the plain model: every module runs as written in minfer/model/llama.py"


@needs_cpp
def test_auto_swaps_every_module_it_can_and_counts_them():
    model, _ = load_model("tiny-random")
    layers = model.config.num_layers
    fast = accelerate(model, "auto", "auto")
    assert plain_only(model)  # the model itself is left as it was
    kinds = {type(m).__name__ for m in fast.modules()}
    assert not kinds & {c.__name__ for c in PLAIN_CLASSES}, kinds
    text = " ".join(describe(fast).split())
    assert f"{3 * layers} x Linear -> PackedLinear (cpp)" in text, text  # qkv, o, down in each layer
    assert f"{layers} x GateUp -> PackedGateUp (cpp)" in text and "1 x LMHead -> PackedLMHead (cpp)" in text
    assert f"{2 * layers + 1} x RMSNorm -> CompiledRMSNorm (cpp)" in text
    assert all(isinstance(layer.gate_up_proj, PackedGateUp) and layer.gate_up_proj.packed.gated
               for layer in fast.layers)
    ids = list(range(3, 50))
    torch.testing.assert_close(whole_sequence_hidden(fast, ids), whole_sequence_hidden(model, ids), atol=1e-4,
                               rtol=1e-4)


def test_choices_say_why_a_backend_was_not_taken(monkeypatch):
    cuda = choose_products("auto", torch.float32, torch.device("cuda"))
    assert cuda.backend == "torch" and "minfer's C++ products run on the CPU" in cuda.why
    assert "oneDNN's packed products run on the CPU" in cuda.why
    assert choose_products("torch", torch.float32, torch.device("cpu")).why == "linear_backend='torch'"
    monkeypatch.setattr(pointwise, "problem", lambda kind: "no C++ compiler was found")
    say_once.cache_clear()
    assert choose_pointwise("auto", torch.device("cpu")) == type(cuda)("torch", "auto: no C++ compiler was found")


@needs_cpp
def test_onednn_products_with_compiled_pointwise_apply_the_compiled_activation():
    if linear.onednn_problem(torch.float32, "cpu"):
        pytest.skip("oneDNN's packed products do not run here")
    model, _ = load_model("tiny-random")
    fast = accelerate(model, "onednn", "cpp")
    gate_up = fast.layers[0].gate_up_proj
    assert isinstance(gate_up, PackedGateUp) and not gate_up.packed.gated
    assert gate_up.activation is pointwise.kernels().silu_mul
    x = torch.randn(5, model.config.hidden_size)
    torch.testing.assert_close(gate_up(x), model.layers[0].gate_up_proj(x), atol=1e-5, rtol=1e-5)


def test_llm_engine_runs_the_plain_model_and_llm_the_speed_ups(tiny):
    """LLMEngine's defaults are the chapters' engine; LLM() (and the server) ask for every speed-up."""
    assert EngineConfig().linear_backend == "torch" and EngineConfig().pointwise_backend == "torch"
    assert {k: OFFLINE_DEFAULTS[k] for k in SPEED_UPS} == SPEED_UPS == {"linear_backend": "auto",
                                                                      "pointwise_backend": "auto"}
    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=16), model=model, tokenizer=tok)
    assert plain_only(engine.executor.model) and engine.model is model
    text = describe(LLM("tiny-random", num_blocks=16).engine.executor.model)
    assert "auto" in text and "linear_backend='torch'" not in text, text


@needs_cpp
def test_nothing_is_swapped_or_packed_again_while_an_engine_steps(tiny, monkeypatch):
    """The swap happens once, at build; steps only multiply (no accelerate, no packing) while weights are
    unchanged."""
    import minfer.accelerate as layer

    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=32, debug_checks=True, **SPEED_UPS),
                       model=model, tokenizer=tok)
    assert isinstance(engine.executor.model.layers[0].qkv_proj, PackedLinear)
    assert isinstance(engine.executor.model.norm, CompiledRMSNorm)
    calls = []
    monkeypatch.setattr(layer, "accelerate", lambda *a, **k: calls.append("accelerate"))
    monkeypatch.setattr(linear, "pack_weight", lambda *a, **k: calls.append("pack"))
    engine.add_request("r0", list(range(5, 40)), SamplingParams(max_tokens=6, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        engine.scheduler.check_invariants()
    assert calls == [] and len(engine.finished[0].output_token_ids) == 6


@pytest.mark.parametrize("faster", [("bfloat16",), ()], ids=["bfloat16-native", "float32-only"])
def test_the_fast_engine_says_once_why_it_stays_in_float32(tiny, monkeypatch, capsys, faster):
    """Where the CPU multiplies bfloat16 natively, the engine with every speed-up (LLM()) says in one line, once per
    process, why it runs float32 and how to choose the faster dtype; where float32 is the fastest, it says nothing.
    The chapters' engine (no speed-ups) and an explicit backend say nothing either."""
    import minfer.accelerate as layer

    monkeypatch.setattr(linear, "whole_model_dtypes", lambda: (faster, None if faster else "no bfloat16 here"))
    say_once.cache_clear()
    model, tok = tiny
    capsys.readouterr()
    LLMEngine(EngineConfig(model="tiny-random", num_blocks=16), model=model, tokenizer=tok)
    LLMEngine(EngineConfig(model="tiny-random", num_blocks=16, linear_backend="torch", pointwise_backend="auto"),
              model=model, tokenizer=tok)
    assert capsys.readouterr().err.count("minfer: the model runs in float32") == 0
    for _ in range(2):
        LLM("tiny-random", num_blocks=16)
    lines = [line for line in capsys.readouterr().err.splitlines() if "runs in float32" in line]
    if faster:
        assert lines == [layer.float32_notice()], lines
        assert "dtype='bfloat16' chooses it" in lines[0] and "python -m minfer.quality" in lines[0]
    else:
        assert lines == [] and layer.float32_notice() is None
    say_once.cache_clear()  # the next engine may say this machine's own line
