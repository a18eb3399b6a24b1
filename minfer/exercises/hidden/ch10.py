"""Chapter 10, hidden: the attention terms (E10.4) equal the reference's on random steps of every model."""

from __future__ import annotations

import random

from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns
from minfer.sim.cost import StepShape, roofline_terms
from minfer.sim.models import MODELS


def random_terms(seed: int) -> list[list[tuple[float, float]]]:
    rng = random.Random(seed)
    out = []
    for name in sorted(MODELS):
        for dtype in ("bfloat16", "float32"):
            shape = StepShape()
            for _ in range(rng.randrange(0, 6)):
                shape.add(rng.randrange(0, 4000), 1, is_decode=True, samples=True)
            for _ in range(rng.randrange(0, 3)):
                shape.add(rng.randrange(0, 2000), rng.randrange(1, 600), is_decode=False, samples=rng.random() < 0.5)
            out.append(roofline_terms(MODELS[name], dtype, shape))
    return out


def check_attention_terms(t: Tester) -> None:
    with t.case("random steps of every model and dtype: the same terms as the reference",
                hint="compare your prefill and decode (FLOPs, bytes) with the formulas in the task, term by term"):
        for seed in range(3):
            mine = random_terms(seed)
            with StandIns() as swaps:
                swaps.install(["E10.4"], always=True)
                ref = random_terms(seed)
            assert mine == ref, f"seed {seed}: the terms differ from the reference"
