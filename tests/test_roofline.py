"""The measured roofline and the workload's least time on it: arithmetic checked by hand, measurements sane."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.model.config import ModelConfig
from minfer.ops.linear import PACKED_BACKENDS, problem
from minfer.roofline import MachineRoofline, ModelMatmuls, layer_shapes, measure, read_bandwidth, workload_bound
from minfer.sim.models import MODELS, ModelSpec

SMOL = MODELS["smollm2-135m"]
TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8, max_position_embeddings=128)


def machine(prefill=1e11, decode=5e10, bandwidth=1e10) -> MachineRoofline:
    return MachineRoofline(prefill_flops=prefill, decode_flops=decode, decode_rows=2, bandwidth=bandwidth, threads=1)


def test_layer_shapes_hold_every_layer_parameter():
    per_layer = sum(i * o for i, o in layer_shapes(SMOL.config))
    assert per_layer * SMOL.config.num_layers == SMOL.layer_matmul_parameters


def test_the_bound_by_hand():
    """Two requests: prompts of 10 and 4 tokens, outputs of 3 and 1 (the second decodes nothing)."""
    m = machine()
    bound = workload_bound(SMOL, m, [10, 4], [3, 1])
    c = SMOL.config
    lin, head = SMOL.layer_matmul_parameters, SMOL.lm_head_parameters
    per_pair = 4 * c.num_layers * c.num_heads * c.head_dim
    prefill_flops = 2 * 14 * lin + 2 * 2 * head + per_pair * (55 + 10)  # causal pairs: 10*11/2 and 4*5/2
    assert bound.prefill_s == pytest.approx(prefill_flops / m.prefill_flops)
    # decode: the first request feeds back two tokens, at positions 10 and 11 (contexts of 11 and 12 keys)
    decode_flops = 2 * 2 * lin + 2 * 2 * head
    weights = (lin + head) * 4
    assert bound.decode_s == pytest.approx(max(decode_flops / m.decode_flops, 2 * weights / m.bandwidth))
    kv = SMOL.kv_bytes_per_token("float32")
    assert bound.attention_s == pytest.approx(max(kv * (23 + 2) / m.bandwidth, per_pair * 23 / m.prefill_flops))
    assert bound.seconds == pytest.approx(bound.prefill_s + bound.decode_s + bound.attention_s)
    assert bound.flops == pytest.approx(prefill_flops + decode_flops + per_pair * 23)


def test_slow_memory_makes_decode_weight_bound():
    """Few requests decoding many tokens: each step must stream all the weights, whatever the FLOP rate."""
    bound = workload_bound(SMOL, machine(bandwidth=1e9), [8], [101])
    assert bound.decode_s == pytest.approx(100 * (SMOL.layer_matmul_parameters + SMOL.lm_head_parameters) * 4 / 1e9)


def test_fewer_bytes_per_weight_lower_a_weight_bound_decode():
    """int8 or 4-bit weights: each decode step's weight read is priced at the bytes given, the arithmetic as before."""
    per_step = (SMOL.layer_matmul_parameters + SMOL.lm_head_parameters) * 4  # float32
    full = workload_bound(SMOL, machine(bandwidth=1e8), [8], [101])
    quarter = workload_bound(SMOL, machine(bandwidth=1e8), [8], [101], weight_bytes=per_step / 4)
    assert full.decode_s == pytest.approx(100 * per_step / 1e8)
    assert quarter.decode_s == pytest.approx(100 * per_step / 4 / 1e8)
    assert (quarter.prefill_s, quarter.attention_s, quarter.flops) == (full.prefill_s, full.attention_s, full.flops)


def test_more_work_takes_longer_and_faster_machines_less():
    small = workload_bound(SMOL, machine(), [100] * 4, [50] * 4).seconds
    assert workload_bound(SMOL, machine(), [100] * 8, [50] * 8).seconds > small
    assert workload_bound(SMOL, machine(2e11, 1e11, 2e10), [100] * 4, [50] * 4).seconds == pytest.approx(small / 2)


def test_matmuls_count_their_flops_and_measure_a_rate():
    mm = ModelMatmuls(TINY)
    assert mm.flops_per_row == 2 * TINY.num_layers * sum(i * o for i, o in layer_shapes(TINY))
    assert mm.nbytes == mm.flops_per_row * 2  # float32: 4 bytes per weight, 2 FLOPs per weight per row
    rate = mm.rate(4, reps=1)
    assert math.isfinite(rate) and rate > 0


@pytest.mark.parametrize("backend", [
    pytest.param(name, marks=pytest.mark.skipif(problem(name, torch.float32, "cpu") is not None,
                                                reason=f"{problem(name, torch.float32, 'cpu')}"))
    for name in PACKED_BACKENDS])
def test_packed_matmuls_do_the_same_work(backend):
    """A packed backend's rate times the same products: same FLOPs, same weights, a measured rate."""
    plain, packed = ModelMatmuls(TINY), ModelMatmuls(TINY, linear_backend=backend)
    assert packed.flops_per_row == plain.flops_per_row and len(packed.packed) == len(packed.weights)
    assert all(p.backend == backend for p in packed.packed)
    assert math.isfinite(rate := packed.rate(4, reps=1)) and rate > 0


def test_measure_reports_this_process():
    m = measure(TINY, decode_rows=3)
    assert m.decode_rows == 3 and m.threads == torch.get_num_threads() and m.dtype == "float32"
    possible = [name for name in ("torch", *PACKED_BACKENDS) if problem(name, torch.float32, "cpu") is None]
    assert m.prefill_backend in possible and m.decode_backend in possible
    assert f"({m.decode_backend})" in m.describe()
    assert m.prefill_flops > 0 and m.decode_flops > 0 and m.bandwidth > 0 and m.seconds > 0
    assert "GFLOP/s" in m.describe() and m.to_dict()["decode_rows"] == 3
    assert read_bandwidth(16 << 20, reps=1) > 0


def test_bound_for_a_custom_model_spec():
    spec = ModelSpec("tiny", TINY)
    assert workload_bound(spec, machine(), [5, 6], [2, 3]).seconds > 0


def test_measure_times_the_largest_step_on_fewer_layers():
    """The prefill rate at a large step comes from fewer layers, for about the arithmetic of 512 rows on all."""
    m = measure(TINY, decode_rows=3, prefill_rows=2048)
    assert m.prefill_rows == 2048 and "at 2048 rows" in m.describe()
    assert math.isfinite(m.prefill_flops) and m.prefill_flops > 0
    few = ModelMatmuls(TINY, num_layers=1)
    assert few.flops_per_row * TINY.num_layers == ModelMatmuls(TINY).flops_per_row
