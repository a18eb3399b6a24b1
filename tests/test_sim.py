"""The simulator: roofline arithmetic, KV pool sizing, determinism, specs (against measurements: test_validate_*)."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from conftest import run_checked
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.sim import HARDWARE, MODELS, HardwareSpec, ModelSpec, RooflineCost, StepShape, get_hardware
from minfer.workload import poisson, submit


def sim_engine(**kw) -> LLMEngine:
    kw.setdefault("model", "llama-3-8b")
    kw.setdefault("hardware", "H100-SXM")
    return LLMEngine(EngineConfig(executor="sim", **kw))


def decode_shape(batch: int, context: int) -> StepShape:
    shape = StepShape()
    for _ in range(batch):
        shape.add(context - 1, 1, True, True)
    return shape


def prefill_shape(n: int, start: int = 0) -> StepShape:
    shape = StepShape()
    shape.add(start, n, False, True)
    return shape


# ---- the cost model ---------------------------------------------------------------------------------
def test_decode_step_is_the_weight_read():
    """One decode on an H100's roofline: memory-bound, so the step is (almost exactly) the weight read."""
    spec, hw = MODELS["llama-3-8b"], HARDWARE["H100-SXM"].roofline()
    cost = RooflineCost(spec, hw, "bfloat16")
    parts = cost.parts(decode_shape(1, 100))
    weights = (spec.layer_matmul_parameters + spec.lm_head_parameters) * 2 / hw.memory_bandwidth
    assert parts["linear"] == pytest.approx(weights)
    kv_read = spec.kv_bytes_per_token("bfloat16") * 101  # 100 cached tokens read, 1 written
    assert parts["decode_attention"] == pytest.approx(kv_read / hw.memory_bandwidth)
    assert parts["overhead"] == parts["elementwise"] == 0, "the roofline has nothing but the peaks"
    assert cost.step_time(decode_shape(1, 100)) == pytest.approx(weights + parts["decode_attention"])


def test_achievable_spec_is_slower_than_its_roofline_on_every_part():
    """The built-in GPU specs carry what an engine achieves; .roofline() (or efficiency=False) is the upper bound."""
    spec = MODELS["llama-3-8b"]
    for name in ("A100-80GB", "H100-SXM", "L40S"):
        hw = HARDWARE[name]
        assert get_hardware(name, efficiency=False) == hw.roofline()
        assert hw.roofline().matmul_efficiency == hw.roofline().bandwidth_efficiency == 1.0
        real, ideal = RooflineCost(spec, hw, "bfloat16"), RooflineCost(spec, hw.roofline(), "bfloat16")
        for shape in (decode_shape(1, 100), decode_shape(256, 2000), prefill_shape(4096), prefill_shape(512, 8000)):
            a, b = real.parts(shape), ideal.parts(shape)
            assert all(a[k] >= b[k] for k in a) and real.step_time(shape) > 1.2 * ideal.step_time(shape), (name, a, b)
    h100 = HARDWARE["H100-SXM"]
    weights = (spec.layer_matmul_parameters + spec.lm_head_parameters) * 2
    one = RooflineCost(spec, h100, "bfloat16").parts(decode_shape(1, 100))
    assert one["linear"] == pytest.approx(weights / (h100.memory_bandwidth * h100.bandwidth_efficiency))
    assert one["overhead"] == h100.step_overhead


def test_small_steps_run_below_peak():
    """Matrix products reach tokens / (tokens + half) of their large-step efficiency: per token, a 16-token step
    costs several times what a 4,096-token step does (when both are priced by their FLOPs)."""
    hw = HARDWARE["H100-SXM"]
    per_token = {n: hw.matmul_seconds(2e9 * n, "bfloat16", n) / n for n in (16, 4096)}
    half = hw.matmul_half_tokens
    assert per_token[16] / per_token[4096] == pytest.approx((16 + half) / 16 / ((4096 + half) / 4096))
    assert per_token[16] > 3 * per_token[4096]
    assert hw.matmul_seconds(0.0, "bfloat16", 0) == 0.0, "a step without tokens has no product"
    peak = hw.roofline()
    assert peak.matmul_seconds(2e12, "bfloat16", 8) == pytest.approx(2e12 / peak.flops("bfloat16"))


def test_vectorized_pricing_and_replicas_match_step_by_step():
    cost = RooflineCost(MODELS["llama-3-8b"], HARDWARE["A100-80GB"], "bfloat16")
    shapes = [decode_shape(b, c) for b, c in ((1, 10), (7, 300), (64, 2048))] + [prefill_shape(512, 1000), StepShape()]
    assert cost.step_times(shapes) == pytest.approx([cost.step_time(s) for s in shapes])
    four = RooflineCost(MODELS["llama-3-8b"], HARDWARE["A100-80GB"], "bfloat16", replicas=4)
    for s in shapes:
        assert four.step_time(s) == pytest.approx(cost.step_time(s.scaled(4)))
    assert decode_shape(3, 50).scaled(4) == decode_shape(12, 50)
    with pytest.raises(ValueError, match="replicas"):
        RooflineCost(MODELS["llama-3-8b"], HARDWARE["A100-80GB"], "bfloat16", replicas=0)


def test_a_step_of_several_rows_pays_the_multi_row_overhead_and_one_row_does_not():
    """``multi_row_overhead``: a step of two or more tokens pays it once (not per token); a one-token step and an
    empty one do not; step by step and vectorized alike; the roofline drops it with the other overheads."""
    base = HARDWARE["cpu-2core"]
    extra = replace(base, multi_row_overhead=5e-3)
    model = MODELS["smollm2-135m"]
    shapes = [decode_shape(1, 40), decode_shape(2, 40), decode_shape(8, 40), prefill_shape(64, 0), StepShape()]
    added = [RooflineCost(model, extra, "float32").step_time(s) - RooflineCost(model, base, "float32").step_time(s)
             for s in shapes]
    assert added == pytest.approx([0.0, 5e-3, 5e-3, 5e-3, 0.0], abs=1e-12)
    vectorized = RooflineCost(model, extra, "float32").step_times(shapes)
    assert vectorized == pytest.approx([RooflineCost(model, extra, "float32").step_time(s) for s in shapes])
    assert extra.roofline().multi_row_overhead == 0.0


def test_batching_decodes_is_nearly_free_until_compute_bound():
    for hw in (HARDWARE["H100-SXM"], HARDWARE["H100-SXM"].roofline()):
        cost = RooflineCost(MODELS["llama-3-8b"], hw, "bfloat16")
        one, many = cost.parts(decode_shape(1, 1)), cost.parts(decode_shape(32, 1))
        assert many["linear"] == one["linear"], "32 decodes read the same weights once"
        # a 4096-token prefill is compute-bound: FLOPs / peak exceeds the weight read
        big = cost.parts(prefill_shape(4096))
        flops = 2 * 4096 * MODELS["llama-3-8b"].layer_matmul_parameters
        assert big["linear"] > one["linear"] and big["linear"] >= flops / hw.flops("bfloat16")


def test_attention_cost_grows_with_context():
    cost = RooflineCost(MODELS["llama-3-8b"], HARDWARE["H100-SXM"], "bfloat16")
    short, long = cost.step_time(decode_shape(32, 128)), cost.step_time(decode_shape(32, 8000))
    assert long > 1.5 * short
    # the second chunk of a prompt attends to the first: more pairs than the first chunk
    assert prefill_shape(512, 512).prefill_pairs == 512 * 512 + prefill_shape(512).prefill_pairs


def test_step_shape_counts():
    shape = StepShape()
    shape.add(0, 4, False, False)  # positions 0..3: 1+2+3+4 pairs
    shape.add(9, 1, True, True)  # a decode at position 9 reads 10 keys
    assert (shape.num_prefill_tokens, shape.num_decode_tokens, shape.prefill_pairs, shape.decode_context,
            shape.num_sampled, shape.num_tokens) == (4, 1, 10, 10, 1, 5)


def test_unknown_dtype_for_hardware():
    hw = HardwareSpec("toy", {"float32": 1e9}, 1e9, 1e9)
    with pytest.raises(ValueError, match="float32"):
        RooflineCost(MODELS["smollm2-135m"], hw, "bfloat16")


# ---- specs --------------------------------------------------------------------------------------------
def test_model_specs_match_published_sizes():
    billions = {"smollm2-135m": 0.1345, "qwen3-0.6b": 0.596, "llama-3-8b": 8.03, "llama-3.1-8b": 8.03,
                "mistral-7b": 7.24, "llama-3-70b": 70.55}
    for name, b in billions.items():
        assert MODELS[name].num_parameters / 1e9 == pytest.approx(b, rel=2e-3), name
    # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes = 128 KiB per token; FP8 half that
    assert MODELS["llama-3-8b"].kv_bytes_per_token("bfloat16") == 128 * 1024
    assert MODELS["llama-3-8b"].kv_bytes_per_token("float8") == 64 * 1024


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="H100-SXM.*L4"):
        sim_engine(hardware="TPU-v9")
    with pytest.raises(ValueError, match="llama-3-8b"):
        sim_engine(model="gpt-5")
    with pytest.raises(ValueError, match="hardware"):
        EngineConfig(executor="sim", model="llama-3-8b")


def test_hardware_aliases_and_multi_device():
    assert get_hardware("h100") is HARDWARE["H100-SXM"]
    eight = get_hardware("8xH100-SXM")
    assert eight.memory_bandwidth == 8 * HARDWARE["H100-SXM"].memory_bandwidth
    assert eight.flops("bfloat16") == 8 * HARDWARE["H100-SXM"].flops("bfloat16")


def test_kv_pool_sized_from_memory_minus_weights():
    e = sim_engine()
    spec = MODELS["llama-3-8b"]
    budget = 80 * 2**30 * 0.9 - spec.weight_bytes("bfloat16")  # an "80GB" H100 holds 80 GiB
    assert e.block_pool.num_blocks == int(budget // (spec.kv_bytes_per_token("bfloat16") * 16))
    assert sim_engine(num_blocks=77).block_pool.num_blocks == 77
    assert sim_engine(gpu_memory_utilization=0.5).block_pool.num_blocks < e.block_pool.num_blocks
    h200 = sim_engine(hardware="H200")
    assert h200.block_pool.num_blocks > 1.8 * e.block_pool.num_blocks, "H200: 141 GB, about twice the KV room"


def test_model_too_big_for_one_device():
    with pytest.raises(ValueError, match="8xH100"):
        sim_engine(model="llama-3-70b")
    assert sim_engine(model="llama-3-70b", hardware="8xH100-SXM").block_pool.num_blocks > 0


def test_cpu_spec_uses_the_cpu_kv_budget_and_float32():
    e = sim_engine(model="smollm2-135m", hardware="cpu-2core", kv_cache_memory="64MiB")
    spec = MODELS["smollm2-135m"]
    assert e.executor.cost.dtype == "float32"
    assert e.block_pool.num_blocks == 64 * 2**20 // (spec.kv_bytes_per_token("float32") * 16)
    bf16 = sim_engine(model="smollm2-135m", hardware="cpu-2core", dtype="bfloat16")
    assert bf16.executor.cost.dtype == "bfloat16"


def test_user_specs():
    hw = HardwareSpec("my-gpu", {"bfloat16": 100e12}, 1e12, 24e9, source="made up for a test")
    base = MODELS["smollm2-135m"]
    model = ModelSpec("tiny-llama", replace(base.config, num_layers=2), "a test")
    e = LLMEngine(EngineConfig(executor="sim", model=model, hardware=hw, max_model_len=1000, num_blocks=100))
    e.add_request("a", [1] * 10, SamplingParams(max_tokens=3))
    out = run_checked(e)
    assert len(out["a"].outputs[0].token_ids) == 3 and e.max_model_len == 1000


# ---- the executor inside the engine ----------------------------------------------------------------
def test_output_lengths_come_from_max_tokens_and_eos_is_ignored():
    e = sim_engine(num_blocks=500)  # small pools keep check_invariants (every step) fast
    lengths = {f"r{i}": 1 + 7 * i for i in range(6)}
    for rid, n in lengths.items():
        prompt = list(range(1, 40 + 30 * int(rid[1:])))
        e.add_request(rid, prompt, SamplingParams(max_tokens=n))  # EOS not ignored: the simulator has none
    out = run_checked(e)
    assert {rid: len(o.outputs[0].token_ids) for rid, o in out.items()} == lengths
    assert all(o.outputs[0].finish_reason == "length" for o in out.values())


def test_engine_clock_is_the_modelled_time():
    e = sim_engine(max_num_seqs=4, num_blocks=2000)
    submit(e, poisson(12, rate=50.0, max_output=256, seed=3))
    run_checked(e)
    assert all(t.duration > HARDWARE["H100-SXM"].step_overhead for t in e.trace), "each step costs the overhead"
    for a, b in zip(e.trace, e.trace[1:]):
        assert b.start_time >= a.end_time - 1e-12, "steps do not overlap on the engine clock"
    cost = e.executor.cost
    step = next(t for t in e.trace if t.num_decode_tokens and not t.num_prefill_tokens)
    assert step.duration == pytest.approx(cost.step_time(
        sum_shape([(step.positions[r], 1, True) for r in step.decode_tokens])))


def sum_shape(chunks):
    shape = StepShape()
    for start, n, is_decode in chunks:
        shape.add(start, n, is_decode, True)
    return shape


def traces_of(config: EngineConfig, seed: int) -> list[dict]:
    e = LLMEngine(config)
    submit(e, poisson(60, rate=40.0, max_prompt=1024, max_output=256, seed=seed))
    run_checked(e)
    rows = []
    for t in e.trace:
        row = asdict(t)
        row.pop("scheduler_time")  # the CPU time the scheduler took: the one wall-clock field
        rows.append(row)
    return rows


def test_two_runs_give_identical_traces():
    config = EngineConfig(executor="sim", model="llama-3-8b", hardware="L4", max_num_seqs=16, num_blocks=200,
                          enable_prefix_caching=True)
    first, second = traces_of(config, seed=5), traces_of(config, seed=5)
    assert first == second
    assert any(t["preempted"] for t in first), "the small pool should preempt (a harder case to reproduce)"
    assert traces_of(config, seed=6) != first


def test_with_shares_changes_named_shares_and_rejects_other_fields():
    h100 = HARDWARE["H100-SXM"]
    tuned = h100.with_shares({"matmul_efficiency": 0.5, "step_overhead": 1e-3})
    assert tuned == replace(h100, matmul_efficiency=0.5, step_overhead=1e-3)
    with pytest.raises(ValueError, match="memory_bandwidth"):
        h100.with_shares({"memory_bandwidth": 1e12})  # a datasheet figure, not a share


def test_spec_arguments_fail_with_clear_errors():
    with pytest.raises(ValueError, match="unknown hardware ''"):
        get_hardware("")
    with pytest.raises(ValueError, match="model must name a checkpoint"):
        _ = EngineConfig(model=MODELS["llama-3-8b"]).checkpoint
    with pytest.raises(ValueError, match="a name or a ModelSpec"):
        LLMEngine(EngineConfig(executor="sim", model=object(), hardware="H100-SXM"))  # type: ignore[arg-type]
