"""Replay a recorded run in the simulator, and say how far apart they are -- per metric, per percentile, per step.

A per-step error says how well the cost model prices one step. What a user of the simulator wants to know is
different: does it predict the *latencies* of a run -- TTFT, TPOT, ITL, end-to-end, at the median and in the tail?
Those also depend on the schedule, and the schedule on the step times (a request that arrives during a long step
waits for the next one), so errors can add up or cancel. The honest test is the one LLMServingSim and Vidur report:
record a real run, rebuild the very same requests (arrival times, prompts, output lengths forced with
``ignore_eos``/``max_tokens``), run them through the simulator under the same engine settings and KV pool, and
compare the percentiles.

    python -m minfer.validate.replay RUN.json                    # the table; RUN.json from save_run(engine, ...)
    python -m minfer.validate.replay RUN.json --calibration stored --json
    python -m minfer.validate.replay --sweep                     # record runs at three loads on the real model

Which cost model replays a run (``--calibration``):

* ``self``: the CPU spec fitted to the run's own step times, by chapter 10's constrained fit (effective FLOP/s and
  bandwidth, compute and memory time adding up, a per-sampled-token overhead, and what a step of several tokens pays
  more than a one-token step: four numbers from hundreds of steps). The default for a real run. The metrics are *not*
  fitted: the replay schedules afresh.
* ``stored``: the built-in ``cpu-2core`` spec (``python -m minfer.validate.calibrate``, fitted once on the course
  machine): a spec made at another time, under another load.
* ``recorded``: the spec the run was made on -- for a run the simulator made (the default there); a replay then
  reproduces it exactly, which is what the tests check.
* paths of other recorded runs: the spec fitted to *their* steps (held-out calibration; ``sweep`` does this).
* in Python, also a ``HardwareSpec`` as it is (chapter 10 passes the spec it fitted to other workloads).

Besides the percentiles, two step-time errors: every recorded step priced by the cost model (the cost model's own
error, on the recorded schedule), and the replay's steps against the recorded ones matched by index, where the two
schedules agree (a step that computes the same tokens of the same requests).

This module drives whole engines, so it sits above the engine with the rest of ``minfer.validate``; the simulator
itself (``minfer.sim``) stays a leaf under it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from minfer.config import EngineConfig
from minfer.metrics import percentile
from minfer.request import SamplingParams
from minfer.sim.cost import RooflineCost
from minfer.sim.hardware import CPU_2CORE, HardwareSpec
from minfer.trace import StepTrace
from minfer.validate.calibrate import Sample, fit, shape_of
from minfer.validate.run_record import RequestRecord, RunRecord, load_run

METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)
SERVED = ("stop", "length")


# ---- what a run measured ----------------------------------------------------------------------------
def metric_values(requests: Sequence[RequestRecord], metric: str) -> list[float]:
    """Every value of ``metric`` in a run: one per served request (TTFT, TPOT, e2e), or one per token gap (ITL)."""
    values: list[float] = []
    for r in requests:
        if r.finish_reason not in SERVED:
            continue
        m = r.metrics
        if metric == "itl":
            values += m.itl
        elif (v := getattr(m, metric)) is not None:
            values.append(v)
    return values


def sampled_per_step(run: RunRecord) -> list[int]:
    """Requests that got a token in each step, from the trace alone: every decode, and every prefill chunk that
    reaches the end of what its request holds (its prompt, plus the tokens it had made before a preemption)."""
    prompt = {r.request_id: r.num_prompt_tokens for r in run.requests}
    made = dict.fromkeys(prompt, 0)
    counts = []
    for step in run.steps:
        got = list(step.decode_tokens)
        got += [rid for rid, n in step.prefill_tokens.items()
                if step.positions[rid] + n == prompt.get(rid, -1) + made.get(rid, 0)]
        for rid in got:
            made[rid] = made.get(rid, 0) + 1 + step.accepted_tokens.get(rid, 0)
        counts.append(len(got))
    return counts


def step_samples(run: RunRecord) -> list[Sample]:
    """The run's steps that computed tokens, as the calibration reads them: shape and measured seconds."""
    return [Sample(shape_of(step, n), step.duration)
            for step, n in zip(run.steps, sampled_per_step(run)) if step.num_tokens and step.duration > 0]


# ---- which cost model ----------------------------------------------------------------------------------
# What the constrained fit frees besides the FLOP/s and bandwidth (chapter 10 fits the same): per sampled token, and
# per step of several tokens -- without it, a fit to one load's batch mix misprices another's (docs/simulator.md)
FIT_OVERHEADS = ("sample_overhead", "multi_row_overhead")


def fit_spec(runs: Sequence[RunRecord]) -> HardwareSpec:
    """Chapter 10's constrained fit on the steps of ``runs``: effective FLOP/s and bandwidth, no overlap, no
    per-token overhead, a per-sampled-token overhead and a per-step one for steps of several tokens (the fit that says
    something true about the machine)."""
    first = runs[0]
    samples = [s for run in runs for s in step_samples(run)]
    spec = fit(samples, first.model_spec, first.dtype, overlaps=(0.0,), overheads=FIT_OVERHEADS)
    return replace(spec, name="fitted", source=f"fitted to {len(samples)} recorded steps (minfer.validate.replay)")


Calibration = str | Sequence[RunRecord] | HardwareSpec | None  # a name, runs to fit to, or a spec as it is


def calibration(run: RunRecord, how: Calibration = None) -> tuple[HardwareSpec, str]:
    """The spec that replays ``run`` and a line that says which it is (see the module's docstring)."""
    if how is None:
        how = "recorded" if run.hardware is not None else "self"
    if isinstance(how, HardwareSpec):
        return how, f"the spec {how.name!r} as given ({how.source or 'no source'})"
    if not isinstance(how, str):
        return fit_spec(how), f"fitted to the steps of {len(how)} other recorded run(s) (held out)"
    if how == "recorded":
        spec = run.hardware_spec
        if spec is None:
            raise ValueError("calibration 'recorded' replays a run on the spec that simulated it; this run is real")
        return spec, f"the spec that made the run ({spec.name})"
    if how == "stored":
        return CPU_2CORE, f"the stored {CPU_2CORE.name} spec ({CPU_2CORE.source})"
    if how == "self":
        return fit_spec([run]), "fitted to this run's own step times (chapter 10's constrained fit: in-sample steps)"
    raise ValueError(f"calibration must be 'self', 'stored', 'recorded' or recorded runs, got {how!r}")


# ---- the replay ------------------------------------------------------------------------------------------
def replay_config(run: RunRecord, hardware: HardwareSpec) -> EngineConfig:
    """The run's engine settings on the simulator: the same scheduler limits and the same KV pool."""
    settings = {k: v for k, v in run.engine.items() if k in EngineConfig.field_names()}
    spec = settings.get("speculative_config")
    if spec is not None and spec.get("acceptance_rate") is None:
        raise ValueError("the run used speculative decoding: the simulator needs its acceptance rate")
    settings.update(executor="sim", model=run.model_spec, hardware=hardware, dtype=run.dtype,
                    num_blocks=run.num_blocks, record_trace=True, trace_window=None, finished_window=None,
                    debug_checks=False)
    return EngineConfig(**settings)


def _natural(request_id: str) -> list[Any]:
    """``r2`` before ``r10``: requests that arrive together join the queue in the order they were added."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", request_id)]


def simulate(run: RunRecord, hardware: HardwareSpec) -> RunRecord:
    """The same requests, at the same arrival times, through the simulator on ``hardware``: the replay's run.

    A served request produces exactly the tokens it did (``max_tokens``, EOS ignored); one that was refused or
    timed out asks for what it asked for, and meets the same limits."""
    from minfer.engine import LLMEngine

    engine = LLMEngine(replay_config(run, hardware))
    for r in sorted(run.requests, key=lambda r: (r.arrival_time, _natural(r.request_id))):
        wanted = r.num_output_tokens if r.finish_reason in SERVED else r.max_tokens
        params = SamplingParams(max_tokens=wanted, ignore_eos=True, temperature=0.0)
        engine.add_request(r.request_id, r.prompt_token_ids, params, priority=r.priority, tenant=r.tenant,
                           arrival_time=r.arrival_time)
    engine.run()
    return RunRecord.of(engine, note=f"replay of: {run.note}")


# ---- how far apart -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class MetricError:
    metric: str  # ttft, tpot, itl, e2e
    percentile: int
    recorded: float  # seconds
    simulated: float
    error: float  # (simulated - recorded) / recorded: signed, a fraction

    @classmethod
    def of(cls, metric: str, q: int, recorded: Sequence[float], simulated: Sequence[float]) -> MetricError:
        a, b = percentile(recorded, q), percentile(simulated, q)
        return cls(metric, q, a, b, (b - a) / a if a > 0 else math.nan)


@dataclass(slots=True)
class StepErrors:
    """|simulated - recorded| / recorded of step durations, as fractions."""

    num_steps: int  # recorded steps that computed tokens
    priced_median: float  # every recorded step priced by the cost model (its own error, on the recorded schedule)
    priced_p90: float
    matched: int  # replayed steps equal to the recorded step of the same index (same requests, same tokens)
    matched_median: float
    matched_p90: float
    first_divergence: int | None  # the first index where the schedules differ (None: they never do)


def _same_work(a: StepTrace, b: StepTrace) -> bool:
    return (a.prefill_tokens, a.decode_tokens, a.positions) == (b.prefill_tokens, b.decode_tokens, b.positions)


def _median_p90(errors: Sequence[float]) -> tuple[float, float]:
    return (statistics.median(errors), percentile(errors, 90)) if errors else (math.nan, math.nan)


def step_errors(real: RunRecord, sim: RunRecord, hardware: HardwareSpec) -> StepErrors:
    cost = RooflineCost(real.model_spec, hardware, real.dtype)
    samples = step_samples(real)
    priced = [abs(cost.step_time(s.shape) - s.seconds) / s.seconds for s in samples]
    matched, first = [], None
    for i, (a, b) in enumerate(zip(real.steps, sim.steps)):
        if not _same_work(a, b):
            first = i if first is None else first
        elif a.num_tokens and a.duration > 0:
            matched.append(abs(b.duration - a.duration) / a.duration)
    if first is None and len(real.steps) != len(sim.steps):
        first = min(len(real.steps), len(sim.steps))
    return StepErrors(len(samples), *_median_p90(priced), len(matched), *_median_p90(matched), first)


@dataclass(slots=True)
class ReplayReport:
    calibration: str  # which cost model replayed the run
    hardware: dict[str, Any]  # its spec
    note: str  # the recorded run's note
    num_requests: int
    metrics: list[MetricError]
    steps: StepErrors

    def error(self, metric: str, q: int) -> float:
        return next(m.error for m in self.metrics if m.metric == metric and m.percentile == q)

    def mape(self, metric: str) -> float:
        """Mean |error| of ``metric`` over p50, p90 and p99, as a fraction."""
        return statistics.fmean(abs(m.error) for m in self.metrics if m.metric == metric)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"replay of {self.note or 'a recorded run'} ({self.num_requests} requests)",
                 f"cost model: {self.calibration}", "",
                 "metric  pct    recorded   simulated    error"]
        for m in self.metrics:
            lines.append(f"{m.metric:6s}  p{m.percentile:<3d} {1e3 * m.recorded:8.1f} ms {1e3 * m.simulated:8.1f} ms "
                         f"{100 * m.error:+7.1f}%")
        s = self.steps
        diverged = "never" if s.first_divergence is None else f"at step {s.first_divergence}"
        lines += ["", f"step time |sim - real| / real: every recorded step priced by the cost model ({s.num_steps} "
                      f"steps): median {100 * s.priced_median:.1f}%, p90 {100 * s.priced_p90:.1f}%",
                  f"  replayed steps matched by index where the schedules agree ({s.matched} steps; they first "
                  f"differ {diverged}): median {100 * s.matched_median:.1f}%, p90 {100 * s.matched_p90:.1f}%"]
        return "\n".join(lines)


def metric_errors(real: RunRecord, other: RunRecord) -> list[MetricError]:
    """Every metric at every percentile, ``other`` against ``real`` (a replay, or a second recording)."""
    return [MetricError.of(name, q, metric_values(real.requests, name), metric_values(other.requests, name))
            for name in METRICS for q in PERCENTILES]


def compare(real: RunRecord, sim: RunRecord, hardware: HardwareSpec, how: str = "") -> ReplayReport:
    return ReplayReport(how, asdict(hardware), real.note, len(real.requests), metric_errors(real, sim),
                        step_errors(real, sim, hardware))


def replay(run: RunRecord | str | Path, how: Calibration = None) -> ReplayReport:
    """Replay ``run`` (a record or its file) on the cost model ``how`` names (see ``calibration``) and compare."""
    run = run if isinstance(run, RunRecord) else load_run(run)
    hardware, described = calibration(run, how)
    return compare(run, simulate(run, hardware), hardware, described)


# ---- a sweep on the real model ---------------------------------------------------------------------------------
# Small on purpose: three loads of the real SmolLM2-135M on this CPU take about two minutes together.
SWEEP_SETTINGS: dict[str, Any] = dict(max_num_seqs=8, chunked_prefill_size=128, num_blocks=256)
SWEEP_WORKLOAD: dict[str, Any] = dict(prompt_median=64, output_median=16, max_prompt=256, max_output=48)


def record_real_run(workload: Sequence[Any], model: Any, tokenizer: Any, note: str = "",
                    **settings: Any) -> RunRecord:
    """Run ``workload`` on the real model (warmed up by a throw-away request first) and keep the run."""
    from minfer.engine import LLMEngine
    from minfer.workload import submit

    warm = LLMEngine(EngineConfig(**settings), model=model, tokenizer=tokenizer)
    warm.add_request("warm-up", [1] * 32, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))
    warm.run()
    engine = LLMEngine(EngineConfig(**settings), model=model, tokenizer=tokenizer)
    submit(engine, workload)
    engine.run()
    return RunRecord.of(engine, note)


@dataclass(slots=True)
class SweepPoint:
    rate: float  # requests per second offered
    run: RunRecord
    held_out: ReplayReport  # replayed on a spec fitted to the other loads' steps
    self_fit: ReplayReport  # ... fitted to its own steps
    stored: ReplayReport  # ... the stored cpu-2core spec
    # the same workload recorded a second time on the real engine, against the first: the noise floor (the
    # machine's own run-to-run difference, which no simulator can predict); None where not re-recorded
    rerun: list[MetricError] | None = None


def sweep(rates: Sequence[float] = (0.5, 1.5, 4.0), n: int = 32, seed: int = 0, model: Any = None,
          tokenizer: Any = None, save_dir: str | Path | None = None, threads: int | None = 1,
          settings: dict[str, Any] | None = None, workload: dict[str, Any] | None = None,
          rerun: Sequence[float] | None = None) -> list[SweepPoint]:
    """Record a Poisson run of ``n`` requests at each of ``rates`` on the real SmolLM2-135M, and replay each one
    three ways; record the loads in ``rerun`` (default: the middle rate) a second time, for the noise floor.
    ``threads``: torch threads while recording (1 is steadier on a shared machine)."""
    import torch

    from minfer.model.loader import load_model
    from minfer.workload import poisson

    if model is None:
        model, tokenizer = load_model("smollm2-135m")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rerun = [rates[len(rates) // 2]] if rerun is None else rerun

    def record(rate: float) -> RunRecord:
        return record_real_run(poisson(n, rate, seed=seed, **{**SWEEP_WORKLOAD, **(workload or {})}), model,
                               tokenizer, f"Poisson, {rate:g} requests/s, {n} requests",
                               **{**SWEEP_SETTINGS, **(settings or {})})

    try:
        runs = [record(rate) for rate in rates]
        again = {rate: record(rate) for rate in rerun}
    finally:
        torch.set_num_threads(before)
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        for rate, run in zip(rates, runs):
            run.save(Path(save_dir) / f"run_rate{rate:g}.json")
        for rate, run in again.items():
            run.save(Path(save_dir) / f"run_rate{rate:g}_again.json")
    return score_sweep(dict(zip(rates, runs)), again)


def score_sweep(runs: dict[float, RunRecord], again: dict[float, RunRecord]) -> list[SweepPoint]:
    """Replay each load's run three ways -- held out (a spec fitted to the other loads' steps), self, stored -- and
    score the second recordings in ``again`` against the first (the noise floor)."""
    rates = sorted(runs)
    points = []
    for rate in rates:
        run, others = runs[rate], [runs[r] for r in rates if r != rate]
        points.append(SweepPoint(rate, run, replay(run, others), replay(run, "self"), replay(run, "stored"),
                                 metric_errors(run, again[rate]) if rate in again else None))
    return points


def load_sweep(save_dir: str | Path) -> list[SweepPoint]:
    """Score again the runs a sweep kept (``--save-dir``): after a change to the cost model or the fit, the same
    recordings answer whether it helped, without the machine's run-to-run difference of new ones."""
    runs: dict[float, RunRecord] = {}
    again: dict[float, RunRecord] = {}
    for path in sorted(Path(save_dir).glob("run_rate*.json")):
        rate, _, tail = path.stem.removeprefix("run_rate").partition("_")
        (again if tail == "again" else runs)[float(rate)] = load_run(path)
    if len(runs) < 2:
        raise ValueError(f"{save_dir}: a sweep keeps a run_rate<R>.json for each of two loads or more, found "
                         f"{len(runs)}")
    return score_sweep(runs, again)


def sweep_table(points: Sequence[SweepPoint], which: str = "held_out") -> str:
    """Markdown: per load and metric, the error at p50, p90 and p99 and their mean absolute value (MAPE)."""
    lines = ["| load (req/s) | metric | p50 | p90 | p99 | MAPE |", "|---|---|---|---|---|---|"]
    for p in points:
        report: ReplayReport = getattr(p, which)
        for name in METRICS:
            errs = " | ".join(f"{100 * report.error(name, q):+.1f}%" for q in PERCENTILES)
            lines.append(f"| {p.rate:g} | {name.upper()} | {errs} | {100 * report.mape(name):.1f}% |")
    return "\n".join(lines)


def sweep_summary(points: Sequence[SweepPoint]) -> str:
    """One row per load and cost model: MAPE per metric, the median |error| over every metric and percentile, the
    worst p99 error, and the median step-time error on the recorded schedule; and the noise floor where measured.
    Last, a row per cost model over every load at once (its steps' errors are in the rows above): the figures a target
    "across metrics and loads" is about."""
    lines = ["| load (req/s) | cost model | TTFT | TPOT | ITL | E2E | median all | worst p99 | steps priced |",
             "|---|---|---|---|---|---|---|---|---|"]

    def row(load: str, label: str, errors: Sequence[MetricError], steps: str) -> str:
        mapes = " | ".join(f"{100 * statistics.fmean(abs(m.error) for m in errors if m.metric == x):.1f}%"
                           for x in METRICS)
        median = statistics.median(abs(m.error) for m in errors)
        worst = max(abs(m.error) for m in errors if m.percentile == 99)
        return f"| {load} | {label} | {mapes} | {100 * median:.1f}% | {100 * worst:.1f}% | {steps} |"

    models = ("held out", "self", "stored")
    for p in points:
        for label, report in zip(models, (p.held_out, p.self_fit, p.stored)):
            lines.append(row(f"{p.rate:g}", label, report.metrics, f"{100 * report.steps.priced_median:.1f}%"))
        if p.rerun is not None:
            lines.append(row(f"{p.rate:g}", "the real engine again", p.rerun, ""))
    if len(points) > 1:
        for label, reports in zip(models, zip(*((p.held_out, p.self_fit, p.stored) for p in points))):
            lines.append(row("all", label, [m for r in reports for m in r.metrics], ""))
    return "\n".join(lines)


# ---- the command line -------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minfer.validate.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a recorded run (JSON, from minfer.validate.run_record.save_run)")
    parser.add_argument("--calibration", nargs="+", default=None, metavar="HOW",
                        help="self (fit to the run's steps; default for a real run), stored (cpu-2core), recorded "
                             "(the simulator's spec that made the run; default for a simulated run), or recorded "
                             "runs whose steps to fit to")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--sweep", action="store_true", help="record runs at several loads on the real model, "
                        "replay each, print the MAPE table")
    parser.add_argument("--rates", default="0.5,1.5,4", help="--sweep: requests per second, comma-separated")
    parser.add_argument("-n", type=int, default=32, help="--sweep: requests per run")
    parser.add_argument("--save-dir", default=None, help="--sweep: keep the recorded runs here")
    parser.add_argument("--sweep-dir", default=None, metavar="DIR",
                        help="score again the runs a --sweep kept in DIR (--save-dir), recording nothing")
    args = parser.parse_args(argv)
    if args.sweep or args.sweep_dir:
        points = (load_sweep(args.sweep_dir) if args.sweep_dir else
                  sweep([float(r) for r in args.rates.split(",")], args.n, save_dir=args.save_dir))
        if args.json:
            print(json.dumps([{"rate": p.rate, "held_out": p.held_out.to_dict(), "self": p.self_fit.to_dict(),
                               "stored": p.stored.to_dict(), "rerun": None if p.rerun is None else
                               [asdict(m) for m in p.rerun]} for p in points], indent=1))
        else:
            print(sweep_table(points), "\n", sweep_summary(points), sep="\n")
        return
    if args.run is None:
        parser.error("give a recorded run (RUN.json), --sweep, or --sweep-dir DIR")
    how: str | list[RunRecord] | None = None
    if args.calibration is not None:
        names = args.calibration
        how = names[0] if len(names) == 1 and names[0] in ("self", "stored", "recorded") else [
            load_run(p) for p in names]
    report = replay(args.run, how)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format())


if __name__ == "__main__":
    main(sys.argv[1:])
