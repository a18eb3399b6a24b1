"""Calibration: fit the CPU spec to step times measured on this machine, and say how well it predicts.

Datasheet peaks are not what an engine achieves: Python between kernels, a readable attention that
gathers K/V before it attends, threads that do not scale perfectly. So for the course machine the
simulator's numbers are *fitted*. We run the real engine (SmolLM2-135M, float32) on varied traffic,
record each step's shape and measured duration, and choose the effective FLOP/s, bandwidth and
overheads that make the roofline predict those durations best. Then we check the fit on steps it
never saw -- a different workload, other batch limits -- and report the median absolute percentage error.

The fit is small and needs nothing but numpy: for every (FLOP/s, bandwidth) pair on a log grid, and each
``overlap`` (do compute and memory time hide one another, or add up?), the overheads enter linearly, so a
least-squares solve finds them; the best pair is refined on finer grids. Errors are relative (a 10 ms step
matters as much as a 100 ms one), so each step is weighted by 1/time.

    python -m minfer.validate.calibrate   # measure, fit, report; prints the spec to paste into sim/hardware.py
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from minfer.engine import LLMEngine
from minfer.model.loader import load_model
from minfer.sim.cost import RooflineCost, StepShape, roofline_terms
from minfer.sim.hardware import CPU_2CORE, HardwareSpec
from minfer.sim.models import MODELS, ModelSpec
from minfer.trace import StepTrace
from minfer.workload import WorkItem, fixed_mix, submit


@dataclass(slots=True)
class Sample:
    """One measured step: its shape and how long it took."""

    shape: StepShape
    seconds: float


def shape_of(step: StepTrace, num_sampled: int) -> StepShape:
    """The cost model's view of a traced step (``num_sampled``: requests that got a token in it)."""
    shape = StepShape()
    for rid, n in step.prefill_tokens.items():
        shape.add(step.positions[rid], n, False, False)
    for rid, n in step.decode_tokens.items():
        shape.add(step.positions[rid], n, True, False)
    shape.num_sampled = num_sampled
    return shape


# ---- measuring -----------------------------------------------------------------------------------
def run_steps(engine: LLMEngine, items: Sequence[WorkItem], seed: int = 0) -> list[Sample]:
    """Run ``items`` (a workload) on a real-model ``engine``; one sample per step that computed tokens."""
    submit(engine, items, seed=seed)
    samples = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        step = engine.trace[-1]
        if step.num_tokens:
            samples.append(Sample(shape_of(step, sum(1 for o in outputs if o.new_token_ids)), step.duration))
    return samples


def measure(make_engine, items, repeats: int = 3, skip: int = 1) -> list[Sample]:
    """The steps of ``items`` on fresh engines from ``make_engine()``, each step's time the *minimum* over
    ``repeats`` runs. Every request arrives at time 0, so the schedule does not depend on timing and
    each run computes the very same steps; other programs on the machine can only make a step slower,
    so the minimum is the cleanest measurement. The first ``skip`` steps (one-off warm-up) are dropped."""
    if any(w.arrival_time for w in items):
        raise ValueError("calibration workloads must arrive at time 0 (their steps must repeat exactly)")
    runs = [run_steps(make_engine(), items) for _ in range(repeats)]
    for other in runs[1:]:
        assert [s.shape for s in other] == [s.shape for s in runs[0]], "runs scheduled different steps"
    return [Sample(s.shape, min(r[i].seconds for r in runs)) for i, s in enumerate(runs[0])][skip:]


def training_runs() -> list[tuple[dict, dict]]:
    """(engine settings, ``fixed_mix`` arguments) of the fitting runs: small and large batches, short and
    long prefill chunks, so the fit sees memory-bound and compute-bound steps alike."""
    return [
        (dict(max_num_seqs=2, chunked_prefill_size=128), dict(n=6, prompt_median=96, output_median=12,
                                                               max_prompt=384, max_output=24, seed=101)),
        (dict(max_num_seqs=32, chunked_prefill_size=256), dict(n=40, prompt_median=48, output_median=16,
                                                                max_prompt=512, max_output=40, seed=102)),
        (dict(max_num_seqs=8, chunked_prefill_size=512), dict(n=12, prompt_median=300, output_median=8,
                                                               max_prompt=900, max_output=24, seed=103)),
    ]


def heldout_runs() -> list[tuple[dict, dict]]:
    """A workload and limits the fit never saw."""
    return [
        (dict(max_num_seqs=12, chunked_prefill_size=192), dict(n=20, prompt_median=128, output_median=16,
                                                                max_prompt=700, max_output=40, seed=201)),
    ]


def collect(runs: Sequence[tuple[dict, dict]], model=None, tokenizer=None, repeats: int = 3) -> list[Sample]:
    """Measure every run on the real SmolLM2-135M (float32, CPU)."""
    if model is None:
        model, tokenizer = load_model("smollm2-135m")
    samples = []
    for settings, load in runs:
        make = functools.partial(LLMEngine, model=model, tokenizer=tokenizer, **settings)
        samples += measure(make, fixed_mix(**load), repeats)
    return samples


# ---- fitting ---------------------------------------------------------------------------------------
# The overheads a fit may free (they enter linearly), each paid per what ``_features`` counts: per token, per sampled
# token, per step of more than one token. Not the fixed per-step one: every step also reads the weights exactly
# once, so the two cannot be told apart -- the fitted bandwidth absorbs it (step_overhead keeps the base's value).
FITTABLE_OVERHEADS = ("token_overhead", "sample_overhead", "multi_row_overhead")
OVERHEADS = ("token_overhead", "sample_overhead")  # what ``fit`` frees unless told otherwise


def _features(samples: Sequence[Sample], model: ModelSpec, dtype: str) -> tuple[np.ndarray, ...]:
    """Per step: FLOPs and bytes of the three roofline parts ([n, 3] each), and what each of
    ``FITTABLE_OVERHEADS`` is paid per ([n, 3]: tokens, sampled tokens, 1 for a step of several tokens)."""
    terms = [roofline_terms(model, dtype, s.shape) for s in samples]
    flops = np.array([[f for f, _ in t] for t in terms], dtype=float)
    nbytes = np.array([[b for _, b in t] for t in terms], dtype=float)
    counts = np.array([[s.shape.num_tokens, s.shape.num_sampled, s.shape.num_tokens > 1] for s in samples],
                      dtype=float)
    return flops, nbytes, counts


class _Overheads:
    """Best non-negative overheads for given roofline times, by least squares on relative errors.

    The overheads enter linearly, so for every subset of them (the others held at 0) the solution is one
    matrix product with a pseudo-inverse computed once; the best subset whose solution is non-negative wins --
    exact for three unknowns, and no optimiser needed."""

    def __init__(self, counts: np.ndarray, y: np.ndarray, fixed: float = 0.0) -> None:
        self.w = 1.0 / y  # relative errors: a 10 ms step matters as much as a 100 ms one
        self.fixed = fixed  # seconds every step pays that are not fitted (the base spec's step_overhead)
        self.a = counts * self.w[:, None]
        self.y = y
        n = self.a.shape[1]
        subsets = itertools.chain.from_iterable(itertools.combinations(range(n), k) for k in range(1, n + 1))
        self.solvers = [(list(cols), np.linalg.pinv(self.a[:, list(cols)])) for cols in subsets]

    def solve(self, roof: np.ndarray) -> tuple[float, np.ndarray]:
        """(weighted squared relative error, overheads) for roofline times ``roof``."""
        b = (self.y - self.fixed - roof) * self.w
        best = (float(b @ b), np.zeros(self.a.shape[1]))  # no overheads at all
        for cols, pinv in self.solvers:
            coef = np.zeros(self.a.shape[1])
            coef[cols] = pinv @ b
            if (coef >= 0).all():
                r = self.a @ coef - b
                if (err := float(r @ r)) < best[0]:
                    best = (err, coef)
        return best


def _grid_fit(flops: np.ndarray, nbytes: np.ndarray, overheads: _Overheads, overlap: float,
              rounds: int, points: int = 21) -> tuple[float, float, float, np.ndarray]:
    """(error, FLOP/s, bandwidth, overheads) with the least error, for one ``overlap``."""
    f_mid, b_mid, span = 1e11, 1e10, 100.0  # FLOP/s and bytes/s within a factor of 100 of these: any CPU
    best = (math.inf, f_mid, b_mid, np.zeros(overheads.a.shape[1]))  # nothing tried yet: any error beats it
    for _ in range(rounds):
        for f in np.geomspace(f_mid / span, f_mid * span, points):
            for bw in np.geomspace(b_mid / span, b_mid * span, points):
                compute, memory = flops / f, nbytes / bw
                roof = (np.maximum(compute, memory) + (1 - overlap) * np.minimum(compute, memory)).sum(axis=1)
                err, coef = overheads.solve(roof)
                if err < best[0]:
                    best = (err, f, bw, coef)
        f_mid, b_mid = best[1], best[2]
        span = span ** (2 / (points - 1))  # zoom in: the next grid spans one step of this one either side
    return best


def fit(samples: Sequence[Sample], model: ModelSpec | None = None, dtype: str = "float32",
        base: HardwareSpec = CPU_2CORE, rounds: int = 4, overlaps: Sequence[float] = (0.0, 0.5, 1.0),
        trim: float = 3.0, overheads: Sequence[str] = OVERHEADS) -> HardwareSpec:
    """The ``base`` spec with its effective ``peak_flops[dtype]``, ``memory_bandwidth``, ``overlap`` and
    overheads fitted to ``samples`` (least squared relative error).

    ``overlaps`` and ``overheads`` say which of them are free: a per-token overhead and the FLOP/s both scale
    with the tokens of a step, so on few steps they trade against each other (a fit may find 3x the real
    FLOP/s and a millisecond per token); fitting only ``overheads=("sample_overhead",)`` removes that freedom.

    Robust to a shared machine: after a first fit, steps whose error exceeds ``trim`` times the median error
    (and 5%) -- steps another program slowed down -- are dropped, and the fit is repeated on the rest."""
    model = model or MODELS["smollm2-135m"]
    samples = list(samples)
    for _ in range(2):
        flops, nbytes, counts = _features(samples, model, dtype)
        counts = counts[:, [FITTABLE_OVERHEADS.index(name) for name in overheads]]
        y = np.array([s.seconds for s in samples], dtype=float)
        solver = _Overheads(counts, y, base.step_overhead)
        fits = [(_grid_fit(flops, nbytes, solver, o, rounds), o) for o in overlaps]
        (_, f, bw, coef), overlap = min(fits, key=lambda x: x[0][0])
        spec = replace(base, peak_flops={**base.peak_flops, dtype: float(f)}, memory_bandwidth=float(bw),
                       overlap=overlap).with_shares({name: float(c) for name, c in zip(overheads, coef)})
        errors = percentage_errors(spec, samples, model, dtype)
        limit = max(trim * statistics.median(errors), 5.0)  # in percent; a step within 5% is never dropped
        samples = [s for s, e in zip(samples, errors) if e <= limit]
    return spec


def percentage_errors(spec: HardwareSpec, samples: Sequence[Sample], model: ModelSpec | None = None,
                      dtype: str = "float32") -> list[float]:
    """|predicted - measured| / measured, per step, in percent."""
    cost = RooflineCost(model or MODELS["smollm2-135m"], spec, dtype)
    return [100 * abs(cost.step_time(s.shape) - s.seconds) / s.seconds for s in samples]


def median_ape(spec: HardwareSpec, samples: Sequence[Sample], model: ModelSpec | None = None,
               dtype: str = "float32") -> float:
    """Median absolute percentage error of the spec's predictions."""
    errs = percentage_errors(spec, samples, model, dtype)
    return statistics.median(errs) if errs else math.nan


def calibrate(model=None, tokenizer=None) -> tuple[HardwareSpec, float, float]:
    """Measure, fit on the training runs, score on the held-out run: (fitted spec, train %, held-out %)."""
    train = collect(training_runs(), model, tokenizer)
    test = collect(heldout_runs(), model, tokenizer)
    spec = fit(train)
    return spec, median_ape(spec, train), median_ape(spec, test)


def describe(spec: HardwareSpec, dtype: str = "float32") -> str:
    return (f"{spec.flops(dtype) / 1e9:.0f} GFLOP/s, {spec.memory_bandwidth / 1e9:.1f} GB/s, overlap "
            f"{spec.overlap:g}, overheads {1e3 * spec.step_overhead:.2f} ms/step, "
            f"{1e6 * spec.token_overhead:.0f} us/token, {1e3 * spec.sample_overhead:.2f} ms/sampled token, "
            f"{1e3 * spec.multi_row_overhead:.2f} ms/step of several tokens")


def main() -> None:
    spec, train_err, test_err = calibrate()
    print("fitted:", describe(spec))
    print(f"median absolute error: {train_err:.1f}% on the fitted steps, {test_err:.1f}% on held-out steps")
    print("for minfer/sim/hardware.py (CPU_2CORE):")
    print(f"    peak_flops={{'float32': {spec.flops('float32'):.3g}, ...}}, "
          f"memory_bandwidth={spec.memory_bandwidth:.3g},")
    print(f"    overlap={spec.overlap:g}, step_overhead={spec.step_overhead:.3g}, "
          f"token_overhead={spec.token_overhead:.3g}, sample_overhead={spec.sample_overhead:.3g}")


if __name__ == "__main__":
    main()
