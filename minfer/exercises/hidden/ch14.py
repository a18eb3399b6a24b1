"""Hidden cases of E14.1 (the int8 group quantizer): random matrices of many shapes, group sizes, magnitudes and
dtypes give exactly the reference's scales and values, and a dequantized matrix quantizes back to itself."""

from __future__ import annotations

import torch

from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_functions
from minfer.quant.formats import quantize_int8


def random_weights(seed: int) -> tuple[torch.Tensor, int]:
    """A matrix of random shape, magnitude (1e-3 .. 1e2), sign mix and dtype, and a group size for it."""
    gen = torch.Generator().manual_seed(seed)
    k, n = (int(torch.randint(1, 150, (1,), generator=gen)) for _ in range(2))
    group = [1, 3, 8, 16, 32, 64, 200][seed % 7]
    w = torch.randn(k, n, generator=gen) * 10.0 ** float(torch.empty(1).uniform_(-3, 2, generator=gen))
    if seed % 5 == 1:
        w = w.abs()  # positive only
    if seed % 5 == 2:
        w = -w.abs()  # negative only
    if seed % 5 == 3:
        w[: min(k, group)] = 0  # a zero group in every column
    dtype = (torch.float32, torch.float16, torch.bfloat16)[seed % 3]
    return w.to(dtype), group


def check_int8_quantizer(t: Tester) -> None:
    with t.case("80 random matrices (shapes, groups, magnitudes, signs, float16 and bfloat16 inputs): exactly the "
                "reference's scales and values",
                hint="scale: the group's largest |w| / 127, in float16; q: w / that float16 scale, rounded to the "
                     "nearest, 0 where the scale is 0; w may come in any float dtype (work in float32)"):
        reference = reference_functions("E14.1")["quantize_int8"]
        for seed in range(80):
            w, group = random_weights(seed)
            mine, ref = quantize_int8(w, group), reference(w, group)
            what = f"seed {seed}: w {tuple(w.shape)} {str(w.dtype).removeprefix('torch.')}, groups of {group}"
            assert torch.equal(mine.scales, ref.scales), f"{what}: the scales differ from the reference's"
            assert torch.equal(mine.q, ref.q), f"{what}: q differs from the reference's"

    with t.case("a dequantized int8 matrix quantizes back to itself (each group's largest value lands on +-127)",
                hint="the scale comes from the largest |w| of the group, and q from that float16 scale"):
        first = quantize_int8(torch.randn(96, 40) * 0.1)
        again = quantize_int8(first.dequantize())
        assert torch.equal(again.q, first.q) and torch.equal(again.scales, first.scales), (
            "quantizing the dequantized matrix changed its values or scales")
