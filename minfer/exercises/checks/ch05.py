"""Chapter 05: how many steps a chunked prompt takes (E5.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import sim_engine
from minfer.exercises.harness import Measurement
from minfer.request import SamplingParams


def measure_chunked_steps() -> Measurement:
    engine = sim_engine(model="smollm2-135m", hardware="cpu-2core", num_blocks=256, chunked_prefill_size=256)
    for i in range(4):
        engine.add_request(f"s{i}", [10 + i + j for j in range(40)], SamplingParams(max_tokens=64, ignore_eos=True))
    for step in range(200):
        if step == 6:
            long_prompt = [7 + j % 300 for j in range(1536)]
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        if not engine.has_unfinished_requests():
            break
        engine.step()
    steps = [t.step for t in engine.trace if "long" in t.prefill_tokens]
    return Measurement(
        len(steps), "steps", abs_tol=0,
        explain=f"The long prompt was computed in steps {steps[0]}..{steps[-1]}, 256 tokens each: 1,536 / 256 = 6. "
                "The step's token budget (max_num_batched_tokens) defaults to one full chunk plus one decode per "
                "sequence, 256 + 64 = 320, so the four decodes never squeeze the chunk; and the prompt budget, "
                "chunked_prefill_size, is what caps it. A smaller token budget (say 256 in all) would leave 252 for "
                "the chunk and take 7 steps.")
