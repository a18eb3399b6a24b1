"""Chapter 04: the scheduler's loop over running requests (E4.1) and how many steps a workload takes (E4.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import greedy, sim_engine, tiny_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.workload import fixed_mix, submit


def prompt(n: int, seed: int = 0) -> list[int]:
    return [3 + (seed * 31 + 7 * i) % 300 for i in range(n)]


def check_running_loop(t: Tester) -> None:
    with t.case("every running request computes in every step: one decode token each",
                hint="loop over the running list in order; a request whose prompt is done gets exactly one token"):
        engine = tiny_engine(num_blocks=64, max_num_seqs=4)
        for rid, (p, n) in {"a": (5, 6), "b": (9, 3), "c": (7, 8)}.items():
            engine.add_request(rid, prompt(p, len(rid)), greedy(n))
        t.run(engine)
        running: set[str] = set()
        for tr in engine.trace:
            computed = tr.prefill_tokens.keys() | tr.decode_tokens.keys()
            missing = running - computed
            assert not missing, f"step {tr.step}: running {sorted(missing)} computed nothing ({tr.describe()})"
            assert all(n == 1 for n in tr.decode_tokens.values()), f"step {tr.step}: {tr.describe()}"
            running = (running | set(tr.admitted)) - set(tr.finished)

    with t.case("a prompt in chunks continues in the next steps: 30 tokens at 8 per step are 8, 8, 8, 6",
                hint="a request still in its prompt gets min(what is left, the step's prompt budget, its token "
                     "budget) -- its next chunk, not the whole rest and not one token"):
        engine = tiny_engine(num_blocks=64, chunked_prefill_size=8)
        engine.add_request("r", prompt(30), greedy(3))
        t.run(engine)
        chunks = [tr.prefill_tokens.get("r") for tr in engine.trace][:5]
        assert chunks == [8, 8, 8, 6, None], f"prompt chunks per step {chunks}, expected [8, 8, 8, 6, None]"

    with t.case("running requests first: a prompt under way is not overtaken by a waiting one",
                hint="the running pass spends the step's budgets before the waiting pass admits anyone"):
        engine = tiny_engine(num_blocks=64, chunked_prefill_size=8)
        engine.add_request("first", prompt(30, 1), greedy(2))
        engine.add_request("second", prompt(30, 2), greedy(2))
        t.run(engine)
        order = [next(iter(tr.prefill_tokens)) for tr in engine.trace if tr.prefill_tokens][:5]
        assert order == ["first"] * 4 + ["second"], f"prompt chunks went to {order}"

    with t.case("the token budget: 5 requests decoding, max_num_batched_tokens=3: 3 tokens a step, in rank order",
                hint="stop when the step's token budget is spent; the running list is in rank order"):
        engine = tiny_engine(num_blocks=64, max_num_seqs=5, max_num_batched_tokens=3, chunked_prefill_size=3)
        for i in range(5):
            engine.add_request(f"r{i}", prompt(3, i), greedy(4))
        t.run(engine)
        assert max(tr.num_tokens for tr in engine.trace) <= 3, "a step computed more than max_num_batched_tokens"


def measure_forward_passes() -> Measurement:
    work = fixed_mix(n=24, prompt_median=64, output_median=40, max_prompt=256, max_output=96, seed=2)
    engine = sim_engine(model="smollm2-135m", hardware="cpu-2core", max_num_seqs=8, num_blocks=512)
    submit(engine, work)
    engine.run()
    steps = len(engine.trace)
    outputs = sum(w.output_len for w in work)
    return Measurement(
        steps, "steps", rel_tol=0.2,
        explain=f"The engine took {steps} steps for {outputs} output tokens. A first estimate: 8 sequences decode "
                f"side by side, so about {outputs} / 8 = {outputs // 8} steps if every step were full; a prompt's step "
                "carries the running decodes too, so the 24 prefills add few steps of their own. What that estimate "
                "misses is the tail: once fewer than 8 requests are left, steps carry fewer tokens, and the longest "
                "answers (up to 96 tokens) finish alone. Static batching needed more than twice as many token "
                "computations for the same work (chapter 02).")
