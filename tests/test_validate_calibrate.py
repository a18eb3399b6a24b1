"""Calibration: the fit of the CPU spec to measured steps recovers known parameters, through noise and disturbed
steps, and with fewer free parameters (synthetic steps timed by a known spec: no engine run, seconds)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from minfer.sim import HARDWARE, MODELS, HardwareSpec, RooflineCost, StepShape
from minfer.validate.calibrate import Sample, fit, median_ape


def synthetic_samples(spec: HardwareSpec, n: int, seed: int) -> list[Sample]:
    """Step shapes like the engine makes (decode batches, prefill chunks, mixtures), timed by ``spec``."""
    rng = random.Random(seed)
    cost = RooflineCost(MODELS["smollm2-135m"], spec, "float32")
    out = []
    for _ in range(n):
        shape = StepShape()
        for _ in range(rng.choice([0, 1, 1, 4, 16, 48])):
            shape.add(rng.randrange(10, 900), 1, True, True)
        if (rng.random() < 0.5 and shape.num_tokens != 1) or not shape.num_tokens:
            shape.add(rng.randrange(0, 300), rng.choice([16, 64, 256, 512]), False, rng.random() < 0.5)
        out.append(Sample(shape, cost.step_time(shape)))
    return out


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_fit_recovers_known_parameters(overlap):
    # A fixed per-step overhead is not fitted (it looks just like the weight read): it comes from the base.
    # A per-token overhead is fitted, but it trades against FLOP/s (both scale with tokens): it is 0 here.
    truth = replace(HARDWARE["cpu-2core"], peak_flops={"float32": 150e9}, memory_bandwidth=12e9,
                    step_overhead=4e-3, token_overhead=0.0, sample_overhead=1e-3, overlap=overlap)
    base = replace(HARDWARE["cpu-2core"], step_overhead=4e-3)
    fitted = fit(synthetic_samples(truth, 120, seed=0), base=base)
    assert fitted.overlap == overlap and fitted.step_overhead == 4e-3
    assert fitted.flops("float32") == pytest.approx(150e9, rel=0.05)
    assert fitted.memory_bandwidth == pytest.approx(12e9, rel=0.05)
    assert fitted.token_overhead < 1e-5  # < 10 us, against ms-scale steps
    assert fitted.sample_overhead == pytest.approx(1e-3, rel=0.1)
    assert median_ape(fitted, synthetic_samples(truth, 60, seed=1)) < 1.0  # held-out steps, in percent


def test_fit_tolerates_noise_and_disturbed_steps():
    """+-10% jitter on every step, and one step in six slowed 3-10x (another program took the CPU)."""
    truth = replace(HARDWARE["cpu-2core"], peak_flops={"float32": 200e9}, memory_bandwidth=9e9,
                    step_overhead=0.0, token_overhead=10e-6, sample_overhead=2e-3, overlap=0.0)
    rng = random.Random(7)
    clean = synthetic_samples(truth, 150, seed=2)
    noisy = [Sample(s.shape, s.seconds * rng.uniform(0.9, 1.1) * (rng.uniform(3, 10) if i % 6 == 0 else 1))
             for i, s in enumerate(clean)]
    assert median_ape(fit(noisy), synthetic_samples(truth, 60, seed=3)) < 5.0


def test_fit_with_fewer_free_overheads():
    """The per-token overhead and the FLOP/s trade against each other; with it held at the base's value (0) and
    the overlap known, the fit finds the FLOP/s that made the steps."""
    truth = replace(HARDWARE["cpu-2core"], peak_flops={"float32": 180e9}, memory_bandwidth=15e9, step_overhead=0.0,
                    token_overhead=0.0, sample_overhead=2e-3, overlap=0.0)
    rng = random.Random(4)
    noisy = [Sample(s.shape, s.seconds * rng.uniform(0.95, 1.05)) for s in synthetic_samples(truth, 80, seed=5)]
    fitted = fit(noisy, overlaps=(0.0,), overheads=("sample_overhead",))
    assert fitted.token_overhead == 0.0 and fitted.overlap == 0.0
    assert fitted.flops("float32") == pytest.approx(180e9, rel=0.15)
    assert fitted.sample_overhead == pytest.approx(2e-3, rel=0.15)


def test_fit_finds_what_a_step_of_several_rows_pays_more():
    """A CPU whose products of two or more rows pay a fixed extra (BLAS packs the weight; one row is a matrix-vector
    product): freed, ``multi_row_overhead`` comes back from single decodes beside larger steps, and the spec fitted
    without it misprices the steps it cannot draw."""
    truth = replace(HARDWARE["cpu-2core"], peak_flops={"float32": 120e9}, memory_bandwidth=12e9, step_overhead=0.0,
                    token_overhead=0.0, sample_overhead=2e-3, multi_row_overhead=8e-3, overlap=0.0)
    steps = synthetic_samples(truth, 120, seed=6)
    assert {s.shape.num_tokens == 1 for s in steps} == {True, False}  # both kinds of step, or nothing tells them apart
    fitted = fit(steps, overlaps=(0.0,), overheads=("sample_overhead", "multi_row_overhead"))
    assert fitted.multi_row_overhead == pytest.approx(8e-3, rel=0.1)
    assert fitted.memory_bandwidth == pytest.approx(12e9, rel=0.1)
    held_out = synthetic_samples(truth, 60, seed=7)
    without = fit(steps, overlaps=(0.0,), overheads=("sample_overhead",))
    assert without.multi_row_overhead == 0.0
    assert median_ape(fitted, held_out) < 1.0 < median_ape(without, held_out)
