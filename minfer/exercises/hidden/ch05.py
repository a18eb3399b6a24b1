"""Hidden cases of E5.1 (the chunk budget): every budget compared with the reference's, on random budgets and
spending sequences (hypothesis), and whole schedules on workloads where each budget binds in turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minfer import LLMEngine
from minfer.exercises.checks.common import cpu_sim_engine, greedy
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_class, same_schedule_as_reference
from minfer.plan import StepBudget

SPENDING = st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=8)  # (tokens left, decode?)


def state(budget: StepBudget) -> tuple[int, int, int]:
    return budget.tokens, budget.prompt, budget.chunks


def mixed(**config: Any) -> Callable[[], LLMEngine]:
    def build() -> LLMEngine:
        e = cpu_sim_engine(num_blocks=96, max_num_seqs=6, **config)
        for i, (p, n) in enumerate([(300, 8), (40, 30), (5, 40), (130, 12), (70, 20), (9, 25), (260, 5)]):
            e.add_request(f"r{i}", [i + 1] * p, greedy(n))
        return e
    return build


WORKLOADS: dict[str, dict[str, Any]] = {
    "two chunks a step in a prompt budget of 64": dict(chunked_prefill_size=64, max_prefill_chunks_per_step=2),
    "a token budget of 80 below the prompt budget": dict(chunked_prefill_size=100, max_num_batched_tokens=80),
    "three chunks a step, a token budget of 50": dict(chunked_prefill_size=40, max_prefill_chunks_per_step=3,
                                                      max_num_batched_tokens=50),
    "no chunking: whole prompts": dict(enable_chunked_prefill=False)}


def check_chunk_budget(t: Tester) -> None:
    Reference = reference_class(StepBudget, "E5.1")

    with t.case("random budgets, spent as the scheduler spends them: every chunk and every budget as the reference's",
                hint="a decode spends one token of the token budget only; a chunk spends tokens, prompt tokens and "
                     "one chunk; prefill_chunk is 0 once no chunk is left, else the smallest of the three limits"):
        @settings(max_examples=300, deadline=None, derandomize=True, database=None)
        @given(st.integers(0, 120), st.integers(0, 120), st.integers(0, 3), SPENDING)
        def same_budget(tokens: int, prompt: int, chunks: int, requests: list[tuple[int, bool]]) -> None:
            mine, ref = StepBudget(tokens, prompt, chunks), Reference(tokens, prompt, chunks)
            for i, (remaining, decode) in enumerate(requests):  # decodes, and prompts with tokens remaining
                what = f"StepBudget({tokens}, {prompt}, {chunks}) after {requests[:i]}"
                if decode:
                    n = 1 if ref.tokens > 0 else 0
                else:
                    got, n = mine.prefill_chunk(remaining), ref.prefill_chunk(remaining)
                    assert got == n, f"{what}: prefill_chunk({remaining}) is {got}, expected {n}"
                if n > 0:
                    mine.spend(n, decode)
                    ref.spend(n, decode)
                assert state(mine) == state(ref), (
                    f"{what}, then {n} tokens {'decoded' if decode else 'of a prompt'}: (tokens, prompt, chunks) "
                    f"left are {state(mine)}, expected {state(ref)}")

        same_budget()

    for what, config in WORKLOADS.items():
        with t.case(f"the same decisions as the reference, step by step: {what}",
                    hint="print engine.trace[i].describe() around the step named above to see what differs"):
            same_schedule_as_reference(t, "E5.1", mixed(**config))
