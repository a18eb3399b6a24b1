"""Chapter 06: how many preemptions a burst into a small pool causes (E6.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import sim_engine
from minfer.exercises.harness import Measurement
from minfer.request import SamplingParams


def measure_preemptions() -> Measurement:
    engine = sim_engine(model="smollm2-135m", hardware="cpu-2core", num_blocks=16, block_size=8)
    for i in range(8):
        engine.add_request(f"q{i}", [20 + 8 * i + j for j in range(30)], SamplingParams(max_tokens=48, ignore_eos=True))
    engine.run()
    n = sum(len(t.preempted) for t in engine.trace)
    first = next(t for t in engine.trace if t.preempted)
    return Measurement(
        n, "preemptions", rel_tol=0.5,
        explain=f"{n} preemptions, the first in step {first.step}. Admission is optimistic: a 30-token prompt needs "
                "only 4 blocks of 8, so requests are admitted while their prompts fit. But every answer grows: at "
                "the end a request holds 30 + 47 = 77 tokens, 10 blocks, and the 16-block pool carries at most one "
                "such request and part of another. So requests take turns: whenever a running request needs a block "
                "and none is free, the most recently admitted one is preempted, and later recomputes its prompt and "
                "its answer so far. A guess of one or two preemptions forgets that every admitted answer keeps "
                "growing until it finishes.")
