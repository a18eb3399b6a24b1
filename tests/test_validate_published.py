"""The simulator against published measurements: the table, the engine settings, the front end, the fit."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, replace

import numpy as np
import pytest

from minfer.bench import run_engine
from minfer.sim import HARDWARE, MODELS
from minfer.validate.published import (
    FIT_PARAMETERS,
    METRICS,
    Frontend,
    OnlineRun,
    Point,
    Row,
    Source,
    Table,
    engine_config,
    fit,
    load_table,
    main,
    online_workload,
    point_hardware,
    predict,
    record_offline,
    summaries,
    trtllm_bench_settings,
    validate,
)

SOURCE = Source(key="test", engine="TensorRT-LLM", version="0", where="a test", table="-", method="-", metric="-",
                settings="trtllm-bench")
ONLINE = replace(SOURCE, key="test-online", settings="trtllm-build-defaults", frontend="triton")


def point(**kw) -> Point:
    base = dict(id="p", source="test", gpu="H100-SXM", model="llama-3.1-8b", dtype="float8", input_len=128,
                output_len=64, num_requests=300, rate=None, metric="output_throughput", value=1.0, role="fit")
    return Point(**(base | kw))


# ---- the table ------------------------------------------------------------------------------------------
def test_built_in_table_names_its_sources_and_holds_points_out():
    table = load_table()
    for s in table.sources.values():
        assert s.engine and s.version and s.table and s.method and s.metric
        assert "commit" in s.where and len(s.where.split("commit")[1].split()[0]) == 40, s.where
    for p in table.points:
        assert p.metric in METRICS and p.value > 0 and p.role in ("fit", "heldout", "unscored")
        assert p.gpu in HARDWARE and p.model in MODELS and p.num_requests > 0
        assert p.dtype in HARDWARE[p.gpu].peak_flops, (p.id, "the GPU has no peak for the point's dtype")
    assert len({p.id for p in table.points}) == len(table.points), "ids are unique"
    fit_points, held = table.select("fit"), table.select("heldout")
    assert len(held) > 2 * len(fit_points) > 0
    assert {p.gpu for p in held} - {p.gpu for p in fit_points}, "held-out points on GPUs the fit never saw"
    assert {p.model for p in held} - {p.model for p in fit_points}, "...and a model it never saw"
    assert table.select("heldout", "latency"), "...and online latency"
    # the five A100 points the simulator was first checked against (TensorRT-LLM 0.17, Llama-3.1-8B FP16)
    a100 = {p.lengths: p.value for p in fit_points if p.gpu == "A100-80GB" and p.source == "trtllm-0.17-offline"}
    assert {k: a100[k] for k in ("128/128", "2048/128", "128/2048", "2048/2048", "5000/500")} == {
        "128/128": 6627.27, "2048/128": 799.61, "128/2048": 5255.99, "2048/2048": 2424.16, "5000/500": 825.13}


def test_own_table_is_checked(tmp_path):
    bad = {"sources": {"s": asdict(SOURCE) | {"key": None}}, "points": [asdict(point(source="s", metric="p99"))]}
    del bad["sources"]["s"]["key"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="metric"):
        load_table(path)


# ---- re-creating a run -------------------------------------------------------------------------------------
def test_trtllm_bench_heuristic_by_hand():
    """Llama-3.1-8B FP16 on an A100-80GB, 128/2048: 95% of (80 GiB - 16.06 GB) holds 232.6 requests of 2,176
    tokens x 128 KiB; below 256 that rounds up to a multiple of 32 (256); 232.6 x (1 + 128/2048) = 247 tokens per
    step is below the 2,048 minimum."""
    model, hw = MODELS["llama-3.1-8b"], HARDWARE["A100-80GB"]
    s = trtllm_bench_settings(model, hw, "float16", 128, 2048)
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.kv_fraction) == (256, 2048, 0.95)
    # 128/128: 1,977 requests fit -> a multiple of 256 (2048); 3,955 tokens -> a multiple of 256 (4,096)
    s = trtllm_bench_settings(model, hw, "float16", 128, 128)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (2048, 4096)


def test_engine_config_of_a_point():
    p = point(gpu="A100-80GB", model="llama-3.1-8b", dtype="float16", input_len=128, output_len=2048)
    hw = point_hardware(p)
    config = engine_config(p, SOURCE, hw)
    assert config.admission == "reserve" and config.max_num_seqs == 256 and config.max_num_batched_tokens == 2048
    assert config.hardware.dtype == "float16" and config.max_model_len == 2176
    kv = 0.95 * (80 * 2**30 - MODELS["llama-3.1-8b"].weight_bytes("float16"))
    assert config.num_blocks == int(kv // (128 * 1024 * 16))
    quarter = engine_config(p, SOURCE, hw, replicas=4)
    assert (quarter.max_num_seqs, quarter.max_num_batched_tokens, quarter.num_blocks) == (
        64, 512, config.num_blocks // 4)


def test_offline_extrapolation_and_replicas_match_a_full_run():
    """A few waves of requests, each simulated request standing for several, give the throughput of the
    whole run within 3%."""
    p = point(num_requests=2000, input_len=256, output_len=96, gpu="L4", dtype="bfloat16")
    hw = point_hardware(p)
    schedule = record_offline(p, SOURCE, hw)
    assert schedule.replicas > 1 and schedule.simulated * schedule.replicas < p.num_requests
    assert schedule.steady.any() and not schedule.steady.all()
    from minfer.sim.cost import RooflineCost

    fast = schedule.throughput(RooflineCost(MODELS[p.model], hw, hw.dtype, schedule.replicas))
    items = [w for w in online_workload(replace(p, rate=None))]
    full = run_engine(items, replace(engine_config(p, SOURCE, hw), record_trace=False)).output_throughput
    assert fast == pytest.approx(full, rel=0.03)


# ---- the front end -----------------------------------------------------------------------------------------
def test_frontend_queue_matches_a_loop():
    produced = np.sort(np.array([random.Random(1).uniform(0, 1) for _ in range(300)]))
    f = Frontend(latency=0.01, tokens_per_second=400.0)
    expected, last = [], -math.inf
    for t in produced:
        last = max(t, last) + 1 / 400
        expected.append(last + 0.01)
    assert f.deliver(produced) == pytest.approx(expected)
    assert Frontend(0.005).deliver(produced) == pytest.approx(produced + 0.005), "no rate limit: only latency"
    burst = Frontend(0.0, 100.0).deliver(np.zeros(3))
    assert burst == pytest.approx([0.01, 0.02, 0.03]), "a burst leaves one token per 1/rate seconds"


def test_online_run_metrics():
    run = OnlineRun(np.array([0.0, 1.0]), [np.array([0.1, 0.2, 0.4]), np.array([1.3, 1.4])])
    assert run.metric("ttft_mean") == pytest.approx(1e3 * (0.1 + 0.3) / 2)
    assert run.metric("itl_mean") == pytest.approx(1e3 * (0.1 + 0.2 + 0.1) / 3)
    assert run.metric("output_throughput") == pytest.approx(5 / 1.4)
    assert run.metric("ttft_mean", Frontend(0.02)) == pytest.approx(1e3 * (0.12 + 0.32) / 2)


# ---- validating and fitting ----------------------------------------------------------------------------
def small_table() -> Table:
    """Cheap points of the table's kinds: two offline throughputs and an online run's TTFT and ITL."""
    online = dict(source="test-online", gpu="H100-SXM", model="smollm2-135m", dtype="bfloat16", input_len=300,
                  output_len=40, num_requests=60, rate=20.0)
    points = [point(id="off-a", num_requests=400), point(id="off-b", input_len=1024, output_len=32, role="heldout"),
              point(id="on-ttft", metric="ttft_mean", role="heldout", **online),
              point(id="on-itl", metric="itl_mean", role="heldout", **online)]
    return Table({"test": SOURCE, "test-online": ONLINE}, points)


def test_validate_rows_and_summaries():
    table = small_table()
    rows = validate(table.points, table)
    assert [r.point.id for r in rows] == ["off-a", "off-b", "on-ttft", "on-itl"]
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in rows)
    ttft, itl = rows[2].predicted, rows[3].predicted
    assert ttft > 1e3 * Frontend().latency and 1 < itl < ttft, "ms: a TTFT is a prefill plus the front end"
    roof = validate(table.points, table, hardware=lambda p: HARDWARE[p.gpu].roofline(), frontends={
        "triton": Frontend()})
    assert all(r.predicted > q.predicted for r, q in zip(roof[:2], rows[:2])), "the roofline: more throughput"
    assert all(r.predicted < q.predicted for r, q in zip(roof[2:], rows[2:])), "...and less latency"
    s = summaries([Row(p, p.value * f) for p, f in zip(table.points, (1.1, 0.8, 1.0, 1.3))])
    assert s["all", "all"].median == pytest.approx(15.0) and s["all", "all"].max == pytest.approx(30.0)
    assert s["fit", "all"].count == 1 and s["heldout", "latency"].worst == "on-itl"


def test_command_line_on_your_own_table(tmp_path, capsys):
    table = small_table()
    data = {"sources": {k: {f: v for f, v in asdict(s).items() if f != "key"} for k, s in table.sources.items()},
            "points": [asdict(p) for p in table.points[:2]]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    rows = main(["--table", str(path)])
    out = capsys.readouterr().out
    assert len(rows) == 2 and "off-a" in out and "off-b" in out and "median" in out and "a test" in out


def test_fit_recovers_the_efficiencies_that_made_the_data():
    """Published values made by the simulator itself with known efficiencies: the fit, started elsewhere,
    reproduces them (the table's shapes cannot tell every parameter apart, so the predictions are checked)."""
    truth = dict(matmul_efficiency=0.6, matmul_half_tokens=60.0, bandwidth_efficiency=0.75, step_overhead=3e-3,
                 elementwise_passes=8.0)
    shapes = [(128, 128), (2048, 128), (128, 1024), (1024, 256)]
    points = [point(id=f"{i}/{o}", input_len=i, output_len=o, num_requests=200, gpu="L4", dtype="bfloat16")
              for i, o in shapes]
    made = [replace(p, value=predict(p, SOURCE, replace(HARDWARE["L4"], **truth))) for p in points]
    result = fit(Table({"test": SOURCE}, made))
    assert set(result.parameters) == set(FIT_PARAMETERS) and result.loss < 1e-3
    for p in made:
        assert predict(p, SOURCE, replace(HARDWARE["L4"], **result.parameters)) == pytest.approx(p.value, rel=0.02)


@pytest.mark.long
@pytest.mark.slow
def test_built_in_table_meets_its_targets():
    """The whole table (a few minutes): median error within 15% on throughput and on latency, every scored
    point within 35%, and the points the fit never saw within 25% (median)."""
    table = load_table()
    rows = validate(table.points, table)
    s = summaries(rows)
    assert s["all", "throughput"].median <= 15 and s["all", "latency"].median <= 15, s
    assert s["heldout", "all"].median <= 25, s
    assert s["all", "all"].max <= 35, s["all", "all"]
