"""The simulator against published measurements: how far from what real engines measure is it?

A roofline from datasheet peaks is an upper bound -- no engine reaches it -- so a lesson that says "an H100
serves X tokens per second" needs more: the shares of those peaks that a well-tuned engine achieves
(``HardwareSpec.matmul_efficiency`` and friends), and a check of the result against measurements someone
else published. This module is that check.

``published.json`` (beside this file) holds the measurements, each with its exact source (engine, version,
repository file and commit, table), GPU, model, dtype, input/output lengths, request count or rate, metric
and value. The points marked ``"fit"`` chose the efficiency numbers; the ``"heldout"`` points -- other
GPUs, another model, online latency -- never did, so their error is the honest one.

    python -m minfer.validate.published              # predicted vs published, the error of each point, medians
    python -m minfer.validate.published --roofline   # the same on datasheet peaks: how optimistic a roofline is
    python -m minfer.validate.published --fit        # re-fit the efficiencies on the "fit" points, then validate
    python -m minfer.validate.published --table my.json   # your own points, in the same format

How a published run is re-created on the simulator:

* **The engine's settings.** TensorRT-LLM's ``trtllm-bench`` builds each engine for its dataset: from the
  KV memory left after the weights it derives the maximum batch and the tokens per step
  (``trtllm_bench_settings`` follows its published heuristic), and it schedules "guaranteed no evict": a
  request is admitted only when the KV blocks for its whole prompt and output fit -- minfer's
  ``admission="reserve"``. Runs whose settings were not published use the build defaults (``SETTINGS``).
* **Offline runs** (every request queued at once) of thousands of identical requests: the schedule does not
  depend on time, so the simulator runs it once, recording each step's shape, and prices the steps. Two
  devices keep that fast without changing the answer much: each simulated request stands for ``replicas``
  identical ones in lockstep (``RooflineCost.replicas``), and only a few "waves" of requests are run -- the
  throughput of the steady part, between the first request finishing and the last one starting, prices the
  waves left out.
* **Online runs** (requests arriving at a rate, read as Poisson arrivals) are simulated whole. Their latencies
  were measured by a client, through a serving front end (Triton: HTTP/gRPC, the tokenizer and detokenizer,
  streaming) that the engine does not contain. The ``Frontend`` models it as a fixed latency plus a queue that
  streams a limited number of tokens per second (``FRONTENDS``): below that rate it only adds its latency to
  the TTFT; near it, tokens wait, and it caps the throughput a client can see.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from minfer.config import EngineConfig
from minfer.engine import LLMEngine
from minfer.sim.cost import RooflineCost, StepShape
from minfer.sim.executor import SimExecutor
from minfer.sim.hardware import TUNED_GPU, HardwareSpec, get_hardware
from minfer.sim.models import ModelSpec, get_model_spec
from minfer.workload import WorkItem, poisson, submit

TABLE = "published.json"
METRICS = {"output_throughput": "tok/s", "ttft_mean": "ms", "itl_mean": "ms"}
ROLES = ("fit", "heldout", "unscored")
BLOCK_SIZE = 16
WAVES = 3  # offline runs simulate about this many batches of requests, and extrapolate the rest


@dataclass(frozen=True, slots=True)
class Source:
    """Where a set of measurements was published, and how they were made."""

    key: str
    engine: str
    version: str
    where: str  # repository, file and commit (or URL)
    table: str
    method: str
    metric: str
    settings: str  # how the engine was configured: a key of SETTINGS
    frontend: str | None = None  # a key of FRONTENDS: the metrics were measured by a client through it
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Point:
    """One published number and the run that produced it."""

    id: str
    source: str
    gpu: str  # a hardware spec name
    model: str  # a model spec name
    dtype: str  # "float16", "bfloat16" or "float8" (FP8 weights and KV cache)
    input_len: int
    output_len: int
    num_requests: int
    rate: float | None  # requests per second (Poisson); None: all queued at once (offline)
    metric: str  # "output_throughput" (tok/s), "ttft_mean" or "itl_mean" (ms)
    value: float
    role: str  # "fit": chose the efficiency numbers; "heldout": never did; "unscored": shown, not summarized

    @property
    def kind(self) -> str:
        return "throughput" if self.metric == "output_throughput" else "latency"

    @property
    def lengths(self) -> str:
        return f"{self.input_len}/{self.output_len}"


@dataclass(frozen=True, slots=True)
class Table:
    sources: dict[str, Source]
    points: list[Point]

    def select(self, role: str | None = None, kind: str | None = None) -> list[Point]:
        return [p for p in self.points if role in (None, p.role) and kind in (None, p.kind)]


def load_table(path: str | Path | None = None) -> Table:
    """The built-in table (``minfer/validate/published.json``), or one of your own in the same format."""
    text = (Path(path).read_text() if path is not None
            else resources.files("minfer.validate").joinpath(TABLE).read_text())
    raw = json.loads(text)
    sources = {k: Source(key=k, **v) for k, v in raw["sources"].items()}
    points = [Point(**p) for p in raw["points"]]
    for p in points:
        if p.source not in sources:
            raise ValueError(f"point {p.id!r} names an unknown source {p.source!r}")
        if p.metric not in METRICS:
            raise ValueError(f"point {p.id!r}: metric must be one of {sorted(METRICS)}, got {p.metric!r}")
        if p.role not in ROLES:
            raise ValueError(f"point {p.id!r}: role must be one of {ROLES}, got {p.role!r}")
        if sources[p.source].settings not in SETTINGS:
            raise ValueError(f"source {p.source!r}: settings must be one of {sorted(SETTINGS)}")
    return Table(sources, points)


# ---- the engine's settings ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EngineSettings:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_fraction: float  # share of the memory left after the weights that holds KV blocks


def _round_up(x: float, step: int) -> int:
    return step * math.ceil(x / step)


def trtllm_bench_settings(model: ModelSpec, hw: HardwareSpec, dtype: str, input_len: int,
                          output_len: int) -> EngineSettings:
    """What ``trtllm-bench build --dataset`` chooses for fixed-length requests, by its published heuristic
    (``tensorrt_llm/bench/build/tuning.py``): the requests whose whole sequence fits in 95% of the memory left
    after the weights, rounded up to a batch size; tokens per step for that batch's share of prompt tokens."""
    kv_fraction = 0.95
    per_request = model.kv_bytes_per_token(dtype) * (input_len + output_len)
    fits = kv_fraction * (hw.memory_bytes - model.weight_bytes(dtype)) / per_request
    batch = min(fits, 4096)
    tokens = min(batch * (1 + input_len / output_len), 32768)
    if batch < 256:
        max_batch = max(64, _round_up(batch, 32))
    else:
        max_batch = _round_up(batch, 128 if batch < 1024 else 256)
    if tokens < 4096:
        max_tokens = max(2048, _round_up(tokens, 256))
    else:
        max_tokens = _round_up(tokens, 512 if tokens < 8192 else 1024)
    return EngineSettings(max_batch, max_tokens, kv_fraction)


SETTINGS: dict[str, Callable[[ModelSpec, HardwareSpec, str, int, int], EngineSettings]] = {
    "trtllm-bench": trtllm_bench_settings,
    # trtllm-build's defaults (max_batch_size 2048, max_num_tokens 8192); the Triton backend keeps 90% of the
    # free memory for KV blocks unless told otherwise
    "trtllm-build-defaults": lambda *_: EngineSettings(2048, 8192, 0.90),
}


# ---- re-creating a run ---------------------------------------------------------------------------------
def point_hardware(point: Point, base: HardwareSpec | None = None) -> HardwareSpec:
    """The point's GPU (or ``base``, e.g. a roofline or a candidate fit), running the point's dtype."""
    return replace(base if base is not None else get_hardware(point.gpu), dtype=point.dtype)


def engine_config(point: Point, source: Source, hw: HardwareSpec, replicas: int = 1,
                  record_trace: bool = False) -> EngineConfig:
    """The ``EngineConfig`` of the point's run on the simulator (``replicas``: requests per simulated one)."""
    model = get_model_spec(point.model)
    settings = SETTINGS[source.settings](model, hw, hw.dtype, point.input_len, point.output_len)
    kv_bytes = settings.kv_fraction * (hw.memory_bytes - model.weight_bytes(hw.dtype))
    blocks = int(kv_bytes // (model.kv_bytes_per_token(hw.dtype) * BLOCK_SIZE))
    seqs = math.ceil(settings.max_num_seqs / replicas)
    tokens = max(settings.max_num_batched_tokens // replicas, 1)
    return EngineConfig(executor="sim", model=model, hardware=hw, dtype="auto", block_size=BLOCK_SIZE,
                        num_blocks=blocks // replicas, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                        chunked_prefill_size=tokens, max_prefill_chunks_per_step=seqs, admission="reserve",
                        max_model_len=point.input_len + point.output_len, record_trace=record_trace)


@dataclass(slots=True)
class _Recorder(RooflineCost):
    """The executor's cost model that also keeps the shape of every step it prices."""

    shapes: list[StepShape] = field(default_factory=list)

    def step_time(self, shape: StepShape) -> float:
        self.shapes.append(replace(shape))
        return RooflineCost.step_time(self, shape)  # (zero-argument super() fails in a slots dataclass)


def _record_with(engine: LLMEngine, recorder: _Recorder) -> None:
    """Price ``engine``'s steps with ``recorder``: the engine must run the simulator's executor."""
    if not isinstance(engine.executor, SimExecutor):
        raise TypeError(f"recording a schedule needs executor='sim', got {type(engine.executor).__name__}")
    engine.executor.cost = recorder


@dataclass(slots=True)
class OfflineSchedule:
    """An offline run's steps, recorded once: any cost model prices them (the schedule does not depend on time).

    ``steady``: the steps between the first request finishing and the last one starting -- the part that
    repeats for every further wave of requests."""

    point: Point
    replicas: int
    simulated: int  # requests the simulation ran (each standing for ``replicas``)
    shapes: StepShape  # every step, stacked
    steady: np.ndarray  # boolean mask over the steps

    def throughput(self, cost: RooflineCost) -> float:
        """Output tokens per second of the published run (all ``num_requests`` of it) under ``cost``."""
        p, k = self.point, self.replicas
        seconds = cost.step_times(self.shapes)
        ran = self.simulated * k  # requests the simulated steps stand for
        if ran >= p.num_requests or not self.steady.any():
            return ran * p.output_len / seconds.sum()
        sampled = np.asarray(self.shapes.num_sampled)  # one count per step: the shapes are stacked
        rate = k * sampled[self.steady].sum() / seconds[self.steady].sum()  # tokens/s, steady
        total = seconds.sum() + (p.num_requests - ran) * p.output_len / rate
        return p.num_requests * p.output_len / total


def record_offline(point: Point, source: Source, hw: HardwareSpec) -> OfflineSchedule:
    """Run the point's offline workload once on the simulator, recording its schedule."""
    config = engine_config(point, source, hw)
    assert config.num_blocks is not None and config.max_num_batched_tokens is not None  # engine_config sets both
    per_request = math.ceil((point.input_len + point.output_len) / BLOCK_SIZE)
    concurrency = min(config.max_num_seqs, config.num_blocks // per_request)
    if concurrency < 1:
        raise ValueError(f"{point.id}: not even one request fits in the KV cache")
    # ~16 simulated requests in flight, but each step's token budget still holds a few hundred real tokens
    replicas = max(1, min(concurrency // 16, config.max_num_batched_tokens // 256))
    config = engine_config(point, source, hw, replicas, record_trace=True)
    n = math.ceil(min(point.num_requests, WAVES * concurrency) / replicas)
    engine = LLMEngine(config)
    recorder = _Recorder(get_model_spec(point.model), hw, hw.dtype, replicas)
    _record_with(engine, recorder)
    submit(engine, [WorkItem(0.0, point.input_len, point.output_len) for _ in range(n)])
    engine.run()
    trace = engine.trace
    assert len(trace) == len(recorder.shapes), "one priced shape per traced step"
    first_finish = next(i for i, t in enumerate(trace) if t.finished)
    last_admission = max(i for i, t in enumerate(trace) if t.admitted)
    steady = np.zeros(len(trace), dtype=bool)
    steady[first_finish:last_admission] = True
    return OfflineSchedule(point, replicas, n, StepShape.stack(recorder.shapes), steady)


def online_workload(point: Point) -> list[WorkItem]:
    """The point's requests: fixed lengths, Poisson arrivals at its rate (seed 0), or all at once (INF)."""
    n, i, o = point.num_requests, point.input_len, point.output_len
    if point.rate is None:
        return [WorkItem(0.0, i, o) for _ in range(n)]
    return poisson(n, point.rate, prompt_median=i, output_median=o, max_prompt=i, max_output=o, sigma=0.0)


@dataclass(frozen=True, slots=True)
class Frontend:
    """A serving front end between engine and client: every token reaches the client ``latency`` seconds after
    it leaves a queue that streams ``tokens_per_second`` tokens (detokenize, serialize, send), in the order the
    engine made them. Far below that rate it only adds its latency; near it, tokens wait and throughput caps."""

    latency: float = 0.0
    tokens_per_second: float = math.inf

    def deliver(self, produced: np.ndarray) -> np.ndarray:
        """Client times of tokens made at ``produced`` (sorted). The queue's departures, ``d[k] = max(t[k],
        d[k-1]) + s``, are ``s * (k + 1) + max over j <= k of (t[j] - s * j)``: one cumulative maximum."""
        s = 1.0 / self.tokens_per_second
        k = np.arange(len(produced))
        return np.maximum.accumulate(produced - s * k) + s * (k + 1) + self.latency


# Triton Inference Server with the TensorRT-LLM backend, as TensorRT-LLM 0.14 measured online serving: fitted by
# --fit on the H100's TTFT at 2 requests/s (the latency) and its throughput with every request at once (the rate).
FRONTENDS = {"triton": Frontend(latency=4.69e-3, tokens_per_second=11630.0)}


@dataclass(slots=True)
class OnlineRun:
    """A simulated online run: each request's arrival and the engine-clock times of its tokens."""

    arrivals: np.ndarray
    token_times: list[np.ndarray]

    def metric(self, metric: str, frontend: Frontend | None = None) -> float:
        """Mean TTFT or ITL (ms), or output tokens per second, as a client behind ``frontend`` sees them."""
        frontend = frontend or Frontend()
        lengths = [len(t) for t in self.token_times]
        produced = np.concatenate(self.token_times)
        order = np.argsort(produced, kind="stable")
        client = np.empty_like(produced)
        client[order] = frontend.deliver(produced[order])
        per_request = np.split(client, np.cumsum(lengths)[:-1])
        if metric == "ttft_mean":
            return 1e3 * float(np.mean([t[0] for t in per_request] - self.arrivals))
        if metric == "itl_mean":
            return 1e3 * float(np.concatenate([np.diff(t) for t in per_request]).mean())
        return len(produced) / float(client.max() - self.arrivals.min())


def simulate_online(point: Point, source: Source, hw: HardwareSpec) -> OnlineRun:
    """The point's whole online run on the simulator (Poisson arrivals; INF: all at once)."""
    engine = LLMEngine(engine_config(point, source, hw))
    submit(engine, online_workload(point))
    engine.run()
    done = sorted(engine.finished, key=lambda r: r.metrics.arrival_time)
    return OnlineRun(np.array([r.metrics.arrival_time for r in done]),
                     [np.array(r.metrics.token_times) for r in done])


RunKey = tuple[str, str, int, int, int, float | None, str]


def _run_key(point: Point, hw: HardwareSpec) -> RunKey:
    """Points that share a run (its TTFT, ITL and throughput) share this key."""
    return (point.source, point.model, point.input_len, point.output_len, point.num_requests, point.rate, repr(hw))


def predict(point: Point, source: Source, hardware: HardwareSpec | None = None,
            frontend: Frontend | None = None, runs: dict[RunKey, OnlineRun] | None = None) -> float:
    """What the simulator predicts for ``point``, in the point's unit. ``hardware``: instead of the built-in spec
    of the point's GPU (e.g. its roofline); ``frontend``: instead of the source's; ``runs``: a cache of online
    runs, so that the TTFT, ITL and throughput of one run are simulated once."""
    hw = point_hardware(point, hardware)
    if source.frontend is None and point.rate is None and point.metric == "output_throughput":
        schedule = record_offline(point, source, hw)
        return schedule.throughput(RooflineCost(get_model_spec(point.model), hw, hw.dtype, schedule.replicas))
    key = _run_key(point, hw)
    runs = {} if runs is None else runs
    if key not in runs:
        runs[key] = simulate_online(point, source, hw)
    if frontend is None:
        frontend = FRONTENDS[source.frontend] if source.frontend else Frontend()
    return runs[key].metric(point.metric, frontend)


# ---- the table -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    point: Point
    predicted: float

    @property
    def error(self) -> float:
        """(simulated - published) / published, in percent: the simulator is optimistic when a throughput's error
        is positive or a latency's negative."""
        return 100 * (self.predicted - self.point.value) / self.point.value

    @property
    def abs_error(self) -> float:
        return abs(self.error)


def validate(points: Iterable[Point], table: Table, hardware: Callable[[Point], HardwareSpec | None] | None = None,
             frontends: dict[str, Frontend] | None = None, progress: bool = False) -> list[Row]:
    """Predict every point (``hardware(point)``: a spec to use instead of the built-in one; ``frontends``:
    instead of ``FRONTENDS``)."""
    from tqdm.auto import tqdm

    frontends = FRONTENDS if frontends is None else frontends
    points = list(points)
    runs: dict[RunKey, OnlineRun] = {}
    rows: list[Row] = []
    for p in tqdm(points, disable=not progress, desc="points", unit="pt"):
        source = table.sources[p.source]
        frontend = frontends[source.frontend] if source.frontend else None
        rows.append(Row(p, predict(p, source, hardware(p) if hardware else None, frontend, runs)))
    return rows


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    median: float  # median absolute error, percent
    max: float
    worst: str  # the point with the largest error


def summarize_errors(rows: Sequence[Row]) -> Summary:
    if not rows:
        return Summary(0, math.nan, math.nan, "")
    worst = max(rows, key=lambda r: r.abs_error)
    return Summary(len(rows), statistics.median(r.abs_error for r in rows), worst.abs_error, worst.point.id)


def summaries(rows: Sequence[Row]) -> dict[tuple[str, str], Summary]:
    """Error summaries by (role, kind), with "all" for either ("unscored" points are in none of them)."""
    out = {}
    scored = [r for r in rows if r.point.role != "unscored"]
    for role in ("fit", "heldout", "all"):
        for kind in ("throughput", "latency", "all"):
            out[role, kind] = summarize_errors([r for r in scored if role in ("all", r.point.role)
                                                and kind in ("all", r.point.kind)])
    return out


def format_rows(rows: Sequence[Row]) -> str:
    head = (f"{'point':42s} {'GPU':14s} {'dtype':8s} {'in/out':>10s} {'load':>7s} {'metric':>9s} "
            f"{'published':>10s} {'simulated':>10s} {'error':>7s}  role")
    lines = [head, "-" * len(head)]
    for r in rows:
        p = r.point
        load = "at once" if p.rate is None else f"{p.rate:g}/s"  # every request queued at once, or a rate
        metric = {"output_throughput": "tok/s", "ttft_mean": "TTFT ms", "itl_mean": "ITL ms"}[p.metric]
        lines.append(f"{p.id:42s} {p.gpu:14s} {p.dtype:8s} {p.lengths:>10s} {load:>7s} {metric:>9s} "
                     f"{p.value:10,.1f} {r.predicted:10,.1f} {r.error:+6.1f}%  {p.role}")
    return "\n".join(lines)


def format_summaries(rows: Sequence[Row]) -> str:
    lines = ["absolute error      points   median      max   (worst point)"]
    for (role, kind), s in summaries(rows).items():
        if s.count:
            lines.append(f"{role:8s} {kind:10s} {s.count:7d} {s.median:7.1f}% {s.max:7.1f}%   ({s.worst})")
    return "\n".join(lines)


# ---- fitting the efficiencies --------------------------------------------------------------------------
# The shares fitted. The attention kernels' share is not: published microbenchmarks give it (FlashAttention-2
# reaches about 70% of an A100's peak on long sequences; FlashAttention-3 about 75% of an H100's), and the
# table's long prompts are too few to pin it down beside the matrix products' share.
FitParameter = Literal["matmul_efficiency", "matmul_half_tokens", "bandwidth_efficiency", "step_overhead",
                       "elementwise_passes"]
FIT_PARAMETERS: tuple[FitParameter, ...] = get_args(FitParameter)
UPPER = {"matmul_efficiency": 1.0, "bandwidth_efficiency": 1.0}  # shares of a peak; the others are >= 0


@dataclass(slots=True)
class OnlineSchedule:
    """An online run's steps, recorded: re-priced, they give its mean inter-token latency (each running request
    decodes in every step, so a token's gap is the step that made it). Arrivals interleave with step times,
    so a schedule recorded under one cost model is only close under another: ``fit`` records twice."""

    point: Point
    shapes: StepShape

    def itl_ms(self, cost: RooflineCost) -> float:
        seconds = cost.step_times(self.shapes)
        decodes = np.asarray(self.shapes.num_decode_tokens)
        return 1e3 * float((decodes * seconds).sum() / decodes.sum())


def record_online(point: Point, source: Source, hw: HardwareSpec) -> OnlineSchedule:
    engine = LLMEngine(engine_config(point, source, hw))
    recorder = _Recorder(get_model_spec(point.model), hw, hw.dtype)
    _record_with(engine, recorder)
    submit(engine, online_workload(point))
    engine.run()
    return OnlineSchedule(point, StepShape.stack(recorder.shapes))


@dataclass(slots=True)
class FitResult:
    parameters: dict[str, float]  # the GPU efficiency numbers (FIT_PARAMETERS)
    frontends: dict[str, Frontend]  # the serving front ends
    points: list[str]  # the points fitted
    loss: float  # sum of squared log errors of the efficiency fit


def fit(table: Table, start: dict[str, float] | None = None, progress: bool = False) -> FitResult:
    """Choose the efficiency numbers that best reproduce the "fit" points measured at the engine -- offline
    throughput and online inter-token latency (least squared log error: 10% over counts as much as 10% under)
    -- then each front end from the "fit" points it shaped: TTFT at a low rate (its latency) and throughput with
    every request at once (its token rate).

    Schedules are recorded once and only re-priced per candidate (vectorized), so a simple pattern search --
    try each parameter a step up and down, keep what helps, halve the steps -- takes seconds. Online
    schedules depend a little on the step times: they are recorded again after a first fit, and fitted again."""
    from tqdm.auto import tqdm

    params = dict(start or {k: TUNED_GPU[k] for k in FIT_PARAMETERS})
    chosen = table.select("fit")
    offline = [p for p in chosen if table.sources[p.source].frontend is None]
    online = [p for p in chosen if p.metric == "itl_mean"]  # the engine's step time: no front end in it
    hardware = {p.id: point_hardware(p) for p in offline + online}
    model = {p.id: get_model_spec(p.model) for p in offline + online}
    offline_schedules = {p.id: record_offline(p, table.sources[p.source], hardware[p.id])
                         for p in tqdm(offline, disable=not progress, desc="recording offline runs", unit="pt")}
    online_schedules: dict[str, OnlineSchedule] = {}

    def loss(values: dict[str, float]) -> float:
        total = 0.0
        for p in offline + online:
            hw = hardware[p.id].with_shares(values)
            if p in offline:
                schedule = offline_schedules[p.id]
                value = schedule.throughput(RooflineCost(model[p.id], hw, hw.dtype, schedule.replicas))
            else:
                value = online_schedules[p.id].itl_ms(RooflineCost(model[p.id], hw, hw.dtype))
            total += math.log(value / p.value) ** 2
        return total

    for _ in range(2):
        for p in tqdm(online, disable=not progress, desc="recording online runs", unit="pt"):
            online_schedules[p.id] = record_online(p, table.sources[p.source], hardware[p.id].with_shares(params))
        params, best = _pattern_search(loss, params)

    frontends = {}
    names = {table.sources[p.source].frontend for p in chosen}
    for name in {n for n in names if n is not None}:
        shaped = [p for p in chosen if table.sources[p.source].frontend == name and p not in online]
        runs: dict[RunKey | str, OnlineRun] = {}  # a run by its key, and again by each point it gives
        for p in tqdm(shaped, disable=not progress, desc=f"simulating {name} runs", unit="pt"):
            hw = point_hardware(p).with_shares(params)
            runs.setdefault(_run_key(p, hw), simulate_online(p, table.sources[p.source], hw))
            runs[p.id] = runs[_run_key(p, hw)]

        def frontend_loss(values: dict[str, float], runs=runs, shaped=shaped) -> float:
            f = Frontend(values["latency"], 1 / max(values["seconds_per_token"], 1e-9))
            return sum(math.log(runs[p.id].metric(p.metric, f) / p.value) ** 2 for p in shaped)

        start_frontend = {"latency": 5e-3, "seconds_per_token": 1e-4}
        values, _ = _pattern_search(frontend_loss, start_frontend)
        frontends[name] = Frontend(values["latency"], 1 / max(values["seconds_per_token"], 1e-9))
    return FitResult(params, frontends, [p.id for p in chosen], best)


def _pattern_search(loss: Callable[[dict[str, float]], float], params: dict[str, float],
                    step: float = 0.25, tolerance: float = 1e-3) -> tuple[dict[str, float], float]:
    """Minimise ``loss`` over ``params``: move one parameter by ``step`` (relative) up or down while that
    helps; when nothing does, halve the step. Parameters stay in their physical ranges."""
    best = loss(params)
    while step > tolerance:
        improved = False
        for name in params:
            for direction in (1, -1):
                value = min(max(params[name] * (1 + direction * step), 0.0), UPPER.get(name, math.inf))
                candidate = {**params, name: value}
                if (err := loss(candidate)) < best:
                    params, best, improved = candidate, err, True
                    break
        if not improved:
            step /= 2
    return params, best


# ---- the command line ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(prog="python -m minfer.validate.published", description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", help="a validation table in the format of minfer/validate/published.json")
    ap.add_argument("--roofline", action="store_true", help="datasheet peaks only, no efficiency or overhead")
    ap.add_argument("--fit", action="store_true", help="re-fit the efficiencies on the 'fit' points first")
    ap.add_argument("--role", choices=("fit", "heldout"), help="only these points")
    args = ap.parse_args(argv)

    table = load_table(args.table)
    hardware = None
    if args.fit:
        result = fit(table, progress=True)
        print(f"fitted on {len(result.points)} points (squared log error {result.loss:.4f}):")
        print("  GPU: " + ", ".join(f"{k}={v:.4g}" for k, v in result.parameters.items()))
        for name, f in result.frontends.items():
            print(f"  front end {name!r}: latency {1e3 * f.latency:.2f} ms, {f.tokens_per_second:,.0f} tokens/s")
        frontends = result.frontends
        hardware = lambda p: get_hardware(p.gpu).with_shares(result.parameters)  # noqa: E731
    elif args.roofline:
        hardware = lambda p: get_hardware(p.gpu).roofline()  # noqa: E731
        frontends = dict.fromkeys(FRONTENDS, Frontend())  # nothing but the engine
    else:
        frontends = None
    points = [p for p in table.points if args.role in (None, p.role)]
    rows = validate(points, table, hardware, frontends, progress=True)
    print(format_rows(rows))
    print()
    print(format_summaries(rows))
    print("\nsources:")
    for s in table.sources.values():
        print(f"  {s.key}: {s.engine} {s.version}; {s.where}; {s.table}")
        if s.notes:
            print(f"    note: {s.notes}")
    return rows


if __name__ == "__main__":
    main()
