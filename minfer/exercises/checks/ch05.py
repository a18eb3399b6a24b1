"""Chapter 05: the chunk budget (E5.1) and how many steps a chunked prompt takes (E5.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import cpu_sim_engine, greedy, sim_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.plan import StepBudget
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


def prefill_per_step(engine, rid: str) -> list[int]:
    return [tr.prefill_tokens[rid] for tr in engine.trace if rid in tr.prefill_tokens]


def check_chunk_budget(t: Tester) -> None:
    with t.case("StepBudget.prefill_chunk: the smallest of what is left, the prompt budget and the token budget",
                hint="min(remaining, prompt, tokens) -- and 0 once no chunk may start this step"):
        for (tokens, prompt, chunks), remaining, want in [((320, 256, 1), 1536, 256), ((100, 256, 1), 1536, 100),
                                                           ((320, 256, 1), 30, 30), ((320, 256, 0), 30, 0),
                                                           ((320, 0, 1), 30, 0), ((0, 256, 1), 30, 0)]:
            got = StepBudget(tokens, prompt, chunks).prefill_chunk(remaining)
            assert got == want, (f"StepBudget(tokens={tokens}, prompt={prompt}, chunks={chunks})"
                                 f".prefill_chunk({remaining}) is {got}, expected {want}")

    with t.case("StepBudget.spend: a decode costs one token of the step; a chunk costs tokens, prompt and a chunk",
                hint="decodes never use the prompt budget or a chunk"):
        b = StepBudget(100, 64, 2)
        b.spend(1, decode=True)
        assert (b.tokens, b.prompt, b.chunks) == (99, 64, 2), f"after a decode: {b}"
        b.spend(40, decode=False)
        assert (b.tokens, b.prompt, b.chunks) == (59, 24, 1), f"after a 40-token chunk: {b}"
        assert b.prefill_chunk(100) == 24, f"{b}: a 100-token prompt gets {b.prefill_chunk(100)}, expected 24"

    with t.case("a 1,536-token prompt beside four decodes, chunks of 256: six chunks of 256",
                hint="the four decodes take 4 of the 320-token budget; the prompt budget caps the chunk at 256"):
        engine = cpu_sim_engine(num_blocks=256, chunked_prefill_size=256)
        for i in range(4):
            engine.add_request(f"s{i}", [10 + i] * 40, greedy(40))
        t.run(engine, before_step=lambda s: s == 4 and engine.add_request("long", [7] * 1536, greedy(2)))
        assert prefill_per_step(engine, "long") == [256] * 6, f"chunks {prefill_per_step(engine, 'long')}"

    with t.case("a tight token budget caps the chunk too: max_num_batched_tokens=100 with four decodes -> 96",
                hint="a chunk gets what the decodes left of the token budget"):
        engine = cpu_sim_engine(num_blocks=256, chunked_prefill_size=256, max_num_batched_tokens=100)
        for i in range(4):
            engine.add_request(f"s{i}", [10 + i] * 40, greedy(60))
        t.run(engine, before_step=lambda s: s == 4 and engine.add_request("long", [7] * 400, greedy(2)))
        sizes = prefill_per_step(engine, "long")
        assert sizes[:4] == [96] * 4 and sum(sizes) == 400, f"chunks {sizes}"
        assert max(tr.num_tokens for tr in engine.trace) <= 100

    with t.case("two chunks per step share the prompt budget: prompts of 30 and 30 with 40 per step -> 30 + 10",
                hint="spend() lowers the prompt budget for the next request in the same step"):
        engine = cpu_sim_engine(num_blocks=64, chunked_prefill_size=40, max_prefill_chunks_per_step=2)
        engine.add_request("a", [1] * 30, greedy(2))
        engine.add_request("b", [2] * 30, greedy(2))
        t.run(engine)
        first = engine.trace[0].prefill_tokens
        assert first == {"a": 30, "b": 10}, f"the first step computed {first}"
        assert prefill_per_step(engine, "b") == [10, 20], prefill_per_step(engine, "b")

    with t.case("one chunk per step (the default): a second prompt waits even with budget left",
                hint="prefill_chunk() is 0 once the step has started max_prefill_chunks_per_step chunks"):
        engine = cpu_sim_engine(num_blocks=64, chunked_prefill_size=512)
        engine.add_request("a", [1] * 20, greedy(3))
        engine.add_request("b", [2] * 20, greedy(3))
        t.run(engine)
        assert engine.trace[0].prefill_tokens == {"a": 20} and engine.trace[1].prefill_tokens == {"b": 20}
