"""Recorded runs and their replay in the simulator (``minfer.validate.run_record``, ``minfer.validate.replay``).

On the tiny random model and on the simulator: seconds. The replay of the real SmolLM2 at three loads (the table in
docs/simulator.md) is ``python -m minfer.validate.replay --sweep``, a few minutes, not run here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from minfer import EngineConfig, LLMEngine
from minfer.metrics import summarize
from minfer.sim import HARDWARE
from minfer.validate.replay import (
    METRICS,
    PERCENTILES,
    MetricError,
    ReplayReport,
    StepErrors,
    SweepPoint,
    calibration,
    compare,
    load_sweep,
    main,
    replay,
    replay_config,
    sampled_per_step,
    simulate,
    sweep_summary,
)
from minfer.validate.run_record import RUN_VERSION, RunRecord, load_run, save_run
from minfer.workload import poisson, submit

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = dict(prompt_median=24, output_median=8, max_prompt=80, max_output=20)


def real_run(tiny, n: int = 12, rate: float = 40.0, **settings) -> LLMEngine:
    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", **{"max_num_seqs": 4, "num_blocks": 64, **settings}),
                       model=model, tokenizer=tok)
    submit(engine, poisson(n, rate, seed=1, **WORKLOAD))
    engine.run()
    return engine


@pytest.fixture(scope="module")
def sim_run(tiny, tmp_path_factory) -> RunRecord:
    """A run the simulator made (the tiny model's shape on the cpu-2core spec), saved and loaded back."""
    shape = RunRecord.of(real_run(tiny, n=2)).model_spec
    engine = LLMEngine(EngineConfig(executor="sim", model=shape, hardware="cpu-2core", max_num_seqs=4, num_blocks=40))
    submit(engine, poisson(24, 60.0, seed=2, **WORKLOAD))
    engine.run()
    path = tmp_path_factory.mktemp("runs") / "sim.json"
    save_run(engine, path, note="simulated")
    return load_run(path)


def test_a_run_round_trips_through_its_file(tiny, tmp_path):
    engine = real_run(tiny)
    saved = save_run(engine, tmp_path / "run.json", note="tiny, Poisson")
    back = load_run(tmp_path / "run.json")
    assert asdict(back) == asdict(saved)
    assert back.version == RUN_VERSION and back.executor == "model" and back.dtype == "float32"
    assert back.steps == engine.trace
    assert len(back.requests) == 12 and back.num_blocks == 64
    assert back.model_spec.config == engine.model.config
    assert summarize(back.requests).to_dict() == summarize(engine.finished).to_dict()
    r, live = back.requests[0], engine.finished[0]
    assert (r.prompt_token_ids, r.metrics.token_times, r.arrival_time) == (
        live.prompt_token_ids, live.metrics.token_times, live.arrival_time)


def test_loading_refuses_other_files(tmp_path, sim_run):
    data = asdict(sim_run)
    for change, says in ((dict(format="something-else"), "not a minfer run"),
                         (dict(version=RUN_VERSION + 1), "update minfer")):
        (tmp_path / "bad.json").write_text(json.dumps({**data, **change}))
        with pytest.raises(ValueError, match=says):
            load_run(tmp_path / "bad.json")


def test_saving_refuses_a_run_it_cannot_keep_whole(tiny):
    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=64), model=model, tokenizer=tok)
    submit(engine, poisson(3, 10.0, seed=0, **WORKLOAD))
    engine.step()
    with pytest.raises(ValueError, match="unfinished"):
        RunRecord.of(engine)
    cut = real_run(tiny, n=4, trace_window=2)
    with pytest.raises(ValueError, match="whole"):
        RunRecord.of(cut)


def test_sampled_tokens_are_read_back_from_the_trace(tiny):
    """Every output token was sampled in some step -- preempted requests' recompute chunks included."""
    engine = real_run(tiny, n=16, rate=1e6, num_blocks=12, max_num_seqs=8)  # all at once: the pool runs short
    run = RunRecord.of(engine)
    assert any(t.preempted for t in run.steps), "the pool should be small enough to preempt"
    assert sum(sampled_per_step(run)) == sum(r.num_output_tokens for r in run.requests)


def test_a_simulated_run_replays_exactly_on_its_own_spec(sim_run):
    report = replay(sim_run)
    assert "the spec that made the run" in report.calibration
    assert len(report.metrics) == len(METRICS) * len(PERCENTILES)
    assert all(m.recorded > 0 and m.error == 0 for m in report.metrics)
    s = report.steps
    assert s.first_divergence is None and s.matched == s.num_steps == sum(1 for t in sim_run.steps if t.num_tokens)
    assert s.priced_median == s.matched_median == 0 == s.priced_p90


def test_a_perturbed_cost_model_shows_its_error(sim_run):
    """The check can fail: a cost model 20% slower per sampled token (and one that pays a millisecond more per step)
    replays the same run with visible errors -- in the latencies and in the steps."""
    truth = sim_run.hardware_spec
    assert truth is not None
    for wrong in (truth.with_shares({"sample_overhead": 1.2 * truth.sample_overhead}),
                  truth.with_shares({"step_overhead": truth.step_overhead + 1e-3})):
        report = compare(sim_run, simulate(sim_run, wrong), wrong)
        assert max(abs(m.error) for m in report.metrics) > 0.03
        assert report.steps.priced_median > 0.02


def test_wrong_replays_are_caught(sim_run):
    """Mutants of the replay -- each rebuilds the requests wrongly -- give errors where the right one gives none."""
    spec = sim_run.hardware_spec
    assert spec is not None

    def mutant(change) -> RunRecord:
        bad = replace(sim_run, requests=[replace(r, **change(r)) for r in sim_run.requests])
        return simulate(bad, spec)

    mutants = {
        "every request arrives at 0": mutant(lambda r: {"arrival_time": 0.0}),
        "one token more each": mutant(lambda r: {"num_output_tokens": r.num_output_tokens + 1}),
        "the prompts cut in half": mutant(lambda r: {
            "prompt_token_ids": r.prompt_token_ids[:max(1, r.num_prompt_tokens // 2)]}),
    }
    # the replay keeps the recorded KV pool: one of 8 blocks preempts, and the latencies show it
    assert replay_config(sim_run, spec).num_blocks == sim_run.num_blocks == 40
    mutants["a smaller KV pool"] = simulate(replace(sim_run, steps=[replace(t, num_blocks=8) for t in sim_run.steps]),
                                            spec)
    for name, wrong in mutants.items():  # the right replay: every error 0, the schedules never part (test above)
        report = compare(sim_run, wrong, spec)
        assert max(abs(m.error) for m in report.metrics) > 0.01, name
        assert report.steps.first_divergence is not None, name


def test_calibrations(tiny, sim_run):
    real = RunRecord.of(real_run(tiny, n=10))
    with pytest.raises(ValueError, match="this run is real"):
        calibration(real, "recorded")
    spec, says = calibration(real, "self")
    assert "own step times" in says and spec.overlap == 0 and spec.token_overhead == 0
    assert calibration(real, "stored")[0] == HARDWARE["cpu-2core"]
    assert calibration(real, HARDWARE["L4"]) == (HARDWARE["L4"], f"the spec 'L4' as given ({HARDWARE['L4'].source})")
    held_out, says = calibration(real, [RunRecord.of(real_run(tiny, n=10, rate=20.0))])
    assert "held out" in says and held_out.flops("float32") > 0
    report = replay(real, "self")
    assert all(math.isfinite(m.error) for m in report.metrics)


def test_the_command_line(sim_run, tmp_path):
    sim_run.save(tmp_path / "run.json")
    env_cmd = [sys.executable, "-m", "minfer.validate.replay", str(tmp_path / "run.json")]
    out = subprocess.run([*env_cmd, "--json"], capture_output=True, text=True, check=True, cwd=ROOT, timeout=300)
    report = json.loads(out.stdout)
    assert {m["metric"] for m in report["metrics"]} == set(METRICS)
    assert all(m["error"] == 0 for m in report["metrics"])
    table = subprocess.run([*env_cmd, "--calibration", "stored"], capture_output=True, text=True, check=True,
                           cwd=ROOT, timeout=300).stdout
    assert "ttft    p99" in table and "stored cpu-2core" in table and "matched by index" in table


def test_the_sweep_summary_scores_every_load_at_once(sim_run):
    """The target is "a median within 5% across metrics and loads": the summary's last rows take the median and the
    worst p99 over every metric-percentile of every load, not a median of the loads' own medians. Three loads of
    twelve errors each, 1-12%, 2-13% and 30-41%: the loads' medians 6.5%, 7.5% and 35.5% (their median 7.5%), the
    median of all 36 errors 10.0%, the worst p99 41%."""
    def report(errors: list[float]) -> ReplayReport:
        cells = [(x, q) for x in METRICS for q in PERCENTILES]
        metrics = [MetricError(x, q, 1.0, 1.0 + e, e) for (x, q), e in zip(cells, errors)]
        return ReplayReport("held_out", {}, "", 1, metrics, StepErrors(1, 0.03, 0.05, 0, 0.0, 0.0, None))

    def ramp(first: int) -> list[float]:
        return [(first + i) / 100 for i in range(12)]

    points = [SweepPoint(rate, sim_run, report(ramp(first)), report(ramp(first)), report(ramp(first)))
              for rate, first in ((0.5, 1), (1.5, 2), (4.0, 30))]
    lines = sweep_summary(points).splitlines()
    assert [line.split(" | ")[6:8] for line in lines if line.startswith("| all | ")] == [["10.0%", "41.0%"]] * 3
    per_load = [line.split(" | ")[6] for line in lines if " | held out | " in line]
    assert per_load == ["6.5%", "7.5%", "35.5%", "10.0%"], per_load
    single = sweep_summary(points[:1]).splitlines()
    assert not [line for line in single if line.startswith("| all")], "one load: no row over loads"


def test_a_kept_sweep_is_scored_again_without_recording(sim_run, tmp_path, capsys):
    """``--sweep-dir`` reads the runs ``--save-dir`` kept (``run_rate<R>.json``, ``run_rate<R>_again.json``) and
    scores them as the sweep did: each load held out against the others, and the second recording as the noise
    floor -- here the same run twice, so no difference at all."""
    with pytest.raises(ValueError, match="two loads or more"):
        load_sweep(tmp_path)
    for name in ("run_rate0.5", "run_rate4", "run_rate0.5_again"):
        sim_run.save(tmp_path / f"{name}.json")
    points = load_sweep(tmp_path)
    assert [p.rate for p in points] == [0.5, 4.0]
    assert points[0].rerun is not None and all(m.error == 0 for m in points[0].rerun) and points[1].rerun is None
    assert all(p.held_out.calibration != p.self_fit.calibration for p in points)
    main(["--sweep-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| all | held out |" in out and "| 0.5 | the real engine again |" in out
