"""Chapter 14: the int8 group quantizer (E14.1) and int8's batch-1 decode speed-up (E14.2)."""

from __future__ import annotations

import torch

from minfer.exercises.checks.common import tiny_model
from minfer.exercises.harness import Measurement, Tester
from minfer.quant.formats import Int8Weight, expand_groups, max_rounding_error, quantize_int8


def weight_like(k: int, n: int, seed: int) -> torch.Tensor:
    """Small values with a few outliers, as a model's weights have (the reason for groups)."""
    gen = torch.Generator().manual_seed(seed)
    w = 0.05 * torch.randn(k, n, generator=gen)
    w[torch.rand(k, n, generator=gen) < 0.01] *= 20
    return w


def quantized(w: torch.Tensor, group: int) -> Int8Weight:
    """The student's quantize_int8, with its result's types and shapes checked."""
    got = quantize_int8(w, group)
    k, n = w.shape
    groups = -(-k // group)
    assert isinstance(got, Int8Weight), f"quantize_int8 returned a {type(got).__name__}, not an Int8Weight"
    assert got.group == group, f"the Int8Weight says group={got.group}, the call asked for {group}"
    assert got.q.dtype == torch.int8 and tuple(got.q.shape) == (k, n), (
        f"q is {got.q.dtype} {tuple(got.q.shape)}: expected torch.int8 {(k, n)}, the shape of w ([in, out])")
    assert got.scales.dtype == torch.float16 and tuple(got.scales.shape) == (groups, n), (
        f"scales are {got.scales.dtype} {tuple(got.scales.shape)}: expected torch.float16 {(groups, n)} -- one "
        f"per group of {group} inputs (rows of w) and output column")
    return got


def nearest_with_stored_scale(w: torch.Tensor, got: Int8Weight) -> None:
    """Each scale is its group's largest |w| over 127 in float16, and each q the integer nearest w / that scale."""
    k = w.shape[0]
    padded = torch.cat([w, w[-1:].expand(-k % got.group, -1)]).view(-1, got.group, w.shape[1])
    want = (padded.abs().amax(dim=1) / 127).half()
    wrong = (got.scales != want).nonzero()
    if len(wrong):
        g, n = wrong[0].tolist()
        raise AssertionError(f"group {g} of column {n} (rows {g * got.group}..{min(k, (g + 1) * got.group) - 1}): "
                             f"scale {float(got.scales[g, n])!r}, expected its largest |w| over 127 in float16, "
                             f"{float(want[g, n])!r}")
    scale = expand_groups(got.scales, got.group, k)
    off = torch.where(scale > 0, (w / scale - got.q.float()).abs(), got.q.float().abs())
    worst = int(off.argmax())
    r, c = divmod(worst, w.shape[1])
    assert float(off.max()) <= 0.5 + 1e-4, (
        f"w[{r}, {c}] = {float(w[r, c])!r} with scale {float(scale[r, c])!r} is {float(w[r, c] / scale[r, c]):.3f} "
        f"steps, but q is {int(got.q[r, c])}: q must be the nearest integer (computed with the stored float16 scale)")


def check_int8_quantizer(t: Tester) -> None:
    with t.case("known inputs, one group a column: the exact scales and values",
                hint="scale = largest ABSOLUTE value / 127 (a negative-only group too), rounded to float16; "
                     "q = round(w / scale) with that rounded scale -- to the nearest integer, not toward zero"):
        w = torch.tensor([[7.9375, -2.0], [-1.0, -0.5], [0.03, -1.0], [3.1, -0.25]])
        got = quantized(w, 4)
        assert got.scales.tolist() == [[0.0625, 0.0157470703125]], (
            f"scales {got.scales.tolist()}: expected [[0.0625, 0.0157470703125]] (7.9375 / 127 and 2 / 127, in "
            "float16)")
        assert got.q.t().tolist() == [[127, -16, 0, 50], [-127, -32, -64, -16]], (
            f"q, column by column: {got.q.t().tolist()}; expected [[127, -16, 0, 50], [-127, -32, -64, -16]]")

    with t.case("a weight-like matrix (96 x 64, groups of 32): every scale and every q",
                hint="groups run down each column of w ([in, out]): rows 0..31, 32..63, ... of one output; "
                     "grouped(w, group) gives [groups, group, out], so the group's maximum is over dim 1"):
        w = weight_like(96, 64, seed=0)
        nearest_with_stored_scale(w, quantized(w, 32))

    with t.case("an all-zero group: scale 0, q 0, and it dequantizes to zeros (no NaN)",
                hint="0 / 0 is NaN: where a scale is 0, q is 0"):
        w = weight_like(64, 3, seed=1)
        w[32:, 2] = 0
        got = quantized(w, 32)
        assert float(got.scales[1, 2]) == 0, f"the all-zero group's scale is {float(got.scales[1, 2])}, not 0"
        assert not got.q[32:, 2].any(), f"the all-zero group's q is {got.q[32:, 2].tolist()}, not all 0"
        back = got.dequantize()
        assert torch.isfinite(back).all() and not back[32:, 2].any(), "the all-zero group does not dequantize to 0"

    with t.case("one huge value: only its own group gets a large scale; every group round-trips within half a step",
                hint="each group has its own scale (one per group of inputs of each column, not one per column or "
                     "per matrix): an outlier costs precision in its 32 neighbours only"):
        w = weight_like(128, 8, seed=2)
        w[70, 5] = 40.0
        got = quantized(w, 32)
        nearest_with_stored_scale(w, got)
        error = (got.dequantize() - w).abs()
        bound = expand_groups(max_rounding_error(got), 32, 128)
        assert bool((error <= bound).all()), f"a weight is off by {float(error.max()):.4g}, more than half a step"
        quiet = float(error[:, 5][torch.arange(128) // 32 != 2].max())
        assert quiet < 0.05, (f"column 5's groups without the outlier are off by up to {quiet:.3g}: they should keep "
                              "their own small scales")

    with t.case("a last, partial group (70 inputs in groups of 32) and group sizes other than 32",
                hint="grouped() pads the last group with copies of the last row; cut q back to w's rows"):
        for k, n, group in ((70, 33, 32), (64, 5, 64), (40, 7, 8)):
            w = weight_like(k, n, seed=k)
            nearest_with_stored_scale(w, quantized(w, group))

    with t.case("the tiny model with weights='int8': the speed-up layer quantizes every product with your function, "
                "and its logits stay close to float32's",
                hint="if the cases above pass and this fails, look at the dtype of w (any float dtype comes in)"):
        from minfer.accelerate import accelerate
        from minfer.kv.contiguous import ContiguousKVCache

        model = tiny_model()
        fast = accelerate(model, "torch", "torch", "int8")
        ids = torch.arange(5, 45)
        pos = torch.arange(40)
        logits = []
        with torch.inference_mode():
            for m in (model, fast):
                cache = ContiguousKVCache(model.config, 1, 40)
                logits.append(m.compute_logits(m(ids, pos, cache.attention(torch.tensor([0]), pos[None]))))
        scale = float(logits[0].abs().max())
        worst = float((logits[1] - logits[0]).abs().max())
        assert worst < 0.05 * scale, (f"logits differ from float32's by up to {worst:.3g} (the largest logit is "
                                      f"{scale:.3g}): more than int8's rounding explains")


def measure_int8_speedup() -> Measurement:
    from minfer.bench import weights_decode

    speeds, bandwidth = weights_decode(("dtype", "int8"), tokens=16, rounds=3)
    f32, int8 = speeds
    ratio = f32.ms_per_token / int8.ms_per_token
    by_bytes = f32.weight_bytes / int8.weight_bytes
    return Measurement(
        ratio, "x", factor=2.0,
        explain=f"Measured here: one request decoding alone took {f32.ms_per_token:.1f} ms a token with float32 "
                f"weights and {int8.ms_per_token:.1f} ms with int8: {ratio:.1f}x faster. The bytes say "
                f"{by_bytes:.1f}x: a step reads every product's weights once, {f32.weight_bytes / 1e6:.0f} MB in "
                f"float32 (4 bytes a weight) against {int8.weight_bytes / 1e6:.0f} MB in int8 (1 byte, plus a "
                "float16 scale per 32 weights: 1.0625). At this machine's read bandwidth "
                f"({bandwidth / 1e9:.1f} GB/s) those bytes take {f32.bound_ms:.1f} and {int8.bound_ms:.1f} ms. The "
                "speed-up falls short of the bytes because the rest of the step does not shrink -- attention, norms, "
                "sampling and the Python around them -- and because the int8 products are no longer bound by memory "
                "alone: each weight is converted to a float and multiplied inside the kernel's loop, arithmetic that "
                "one row of activations cannot share out. 1 (no change) forgets that decode is bound by memory; "
                "4 or more forgets the scales and everything in a step that is not a weight. Timings vary between "
                "runs on a shared machine.")
