"""The decode-step breakdown chapter 01 reads: parts that add up, modules in the right part, no hooks left."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minfer.accelerate import accelerate
from minfer.kv.contiguous import ContiguousKVCache
from minfer.model.llama import DecoderLayer, Linear, RMSNorm
from minfer.step_time import LAYER_CODE, OUTSIDE, PARTS, operator_calls, part_of, time_products, time_step_parts


def decode_step(model, fail: bool = False):
    cfg = model.config
    cache = ContiguousKVCache(cfg, 2, 9)
    pos = torch.full((2, 1), 8)

    @torch.inference_mode()
    def step():
        hidden = model(torch.tensor([5, 6]), pos.flatten(), cache.attention(torch.arange(2), pos))
        if fail:
            raise RuntimeError("boom")
        return model.compute_logits(hidden).argmax(-1)

    return step


def test_parts_add_up_to_the_timed_step(tiny):
    model, _ = tiny
    parts = time_step_parts(decode_step(model), model, reps=3)
    assert list(parts.parts) == [*PARTS, LAYER_CODE, OUTSIDE]
    assert sum(parts.parts.values()) == pytest.approx(parts.timed_wall_s)
    assert all(s > 0 for p, s in parts.parts.items() if p != OUTSIDE)
    assert "the step without the stopwatch" in parts.table()


def test_modules_fall_in_their_part(tiny):
    model, _ = tiny
    assert part_of(model.layers[0].qkv_proj) == "weight products" and isinstance(model.layers[0].qkv_proj, Linear)
    assert part_of(model.norm) == "norms and rotary" and isinstance(model.norm, RMSNorm)
    assert part_of(model.layers[0]) == LAYER_CODE and isinstance(model.layers[0], DecoderLayer)
    fast = accelerate(model, linear_backend="torch", pointwise_backend="torch")
    assert part_of(fast.layers[0].qkv_proj) == "weight products"


@pytest.mark.parametrize("weights", ["int8", "q4"])
def test_every_stand_in_of_the_speed_up_layer_falls_in_its_part(tiny, weights):
    """A stand-in for a product or a norm that the table does not name would be timed as the layers' own code."""
    model, _ = tiny
    fast = accelerate(model, linear_backend="torch", pointwise_backend="torch", weights=weights)
    for name, module in fast.named_modules():
        if type(module).__module__ == "minfer.accelerate":  # a stand-in the layer installed
            assert part_of(module) != LAYER_CODE, f"{name}: {type(module).__name__} is in no part of the step"
    assert part_of(fast.layers[0].gate_up_proj) == "weight products"


def test_no_stopwatch_is_left_on_the_model(tiny):
    model, _ = tiny
    with pytest.raises(RuntimeError, match="boom"):
        time_step_parts(decode_step(model, fail=True), model, reps=1)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_products_alone_run_again_exactly_and_leave_no_hook(tiny):
    """One step records; then the step's product calls, and nothing else, run once to warm up and once a rep."""
    model, _ = tiny
    products = [m for m in model.modules() if part_of(m) == "weight products"]
    counted: list[nn.Module] = []
    counters = [m.register_forward_pre_hook(lambda module, args: counted.append(module)) for m in products]
    steps = []
    step = decode_step(model)
    seconds = time_products(lambda: steps.append(1) or step(), model, reps=3)
    for h in counters:
        h.remove()
    per_step = len(counted) // 5
    assert steps == [1] and seconds > 0
    assert per_step == model.config.num_layers * 4 + 1  # qkv, o, gate/up, down a layer, and the LM head
    assert counted == counted[:per_step] * 5, "the same calls, in the step's order: the step, a warm-up, 3 reps"
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_operators_are_counted_once(tiny):
    model, _ = tiny
    calls = operator_calls(decode_step(model))
    assert calls > 10 * model.config.num_layers  # each layer dispatches dozens
    assert operator_calls(decode_step(model)) == calls  # the same step dispatches the same operators
