"""Chapter 11: read a recorded trace -- find its preemptions (E11.1) and predict the next step (E11.2)."""

from __future__ import annotations

from collections.abc import Sequence

from minfer.exercises.checks.common import greedy, sim_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.plan import Admitted, Decision, Preempted
from minfer.trace import StepTrace, preemptions

NEXT_STEP = 20  # E11.2: the chapter prints the run up to the step before this one


def next_step_run() -> list[StepTrace]:
    """E11.2's recorded run: four requests decoding in a pool of 15 blocks of 16 tokens (Llama-3-8B, simulated)."""
    engine = sim_engine(block_size=16, num_blocks=15, max_num_seqs=4)
    for i, prompt in enumerate((40, 30, 47, 20)):
        engine.add_request(f"r{i}", [5 + i] * prompt, greedy(40))
    engine.run()
    return engine.trace


def measure_next_tokens() -> Measurement:
    trace = next_step_run()
    step = trace[NEXT_STEP]
    before = trace[NEXT_STEP - 1]
    return Measurement(
        step.num_tokens, "tokens", abs_tol=0,
        explain=f"Step {NEXT_STEP} computes {step.num_tokens} tokens: {step.describe()}. After step {NEXT_STEP - 1} "
                f"the pool had {before.num_free_blocks} free block. r0 holds 59 tokens in 4 blocks: its next token "
                "fits. r1 holds 48 tokens, 3 full blocks: it takes the free block. r2 holds 64 tokens, 4 full blocks: "
                "it needs a block and none is left, so the scheduler preempts the lowest-ranked running request -- "
                "r3, admitted last -- and r2 takes one of its blocks. r3 computes nothing this step, and nobody is "
                "admitted (memory was short). Four requests decoding suggest 4 tokens; the block boundaries say 3.")


def step(i: int, decisions: Sequence[Decision] = (), admitted: Sequence[str] = ()) -> StepTrace:
    """A step of a hand-written trace: only what preemptions() reads is filled in."""
    return StepTrace(i, 0.01 * i, 0.01, {}, {}, {}, {}, 0, 0, 0, 0, 8, admitted=list(admitted),
                     preempted=[d.request for d in decisions if isinstance(d, Preempted)], decisions=list(decisions))


def preempted(rid: str, by: str, tokens: int, swapped_blocks: int = 0) -> Preempted:
    return Preempted(rid, "pool_full", by, "the most recently admitted", tokens, swapped_blocks)


def admitted(rid: str) -> Admitted:
    return Admitted(rid, 10, 2, 4)


def summary(found: list) -> list[tuple]:
    return [(p.request, p.step, p.by, p.tokens, p.swapped, p.resumed) for p in found]


def check_preemptions(t: Tester) -> None:
    with t.case("one preemption and the step that admits its victim again",
                hint="one Preemption per Preempted decision; resumed: the next step whose admitted lists the victim"):
        trace = [step(0, [admitted("a"), admitted("b")], ["a", "b"]), step(1),
                 step(2, [preempted("b", "a", 33)]), step(3), step(4, [admitted("b")], ["b"])]
        got = summary(preemptions(trace))
        assert got == [("b", 2, "a", 33, False, 4)], f"got {got}, expected [('b', 2, 'a', 33, False, 4)]"
        assert preemptions(trace)[0].recomputed == 33
        assert preemptions(trace[:2]) == [], "a trace without preemptions has none"

    with t.case("admissions before the preemption do not resume it",
                hint="pair a preemption only with admissions after it (in the same step too: see the next case)"):
        trace = [step(0, [admitted("a")], ["a"]), step(1, [preempted("a", "a", 12)]), step(2)]
        got = summary(preemptions(trace))
        assert got == [("a", 1, "a", 12, False, None)], f"got {got}: a was not admitted again, resumed must be None"

    with t.case("a victim re-admitted in the very step that preempted it resumed there",
                hint="a step preempts before it admits: look at the step's admissions after its preemptions"):
        trace = [step(5, [preempted("low", "urgent", 20), admitted("urgent"), admitted("low")], ["urgent", "low"])]
        got = summary(preemptions(trace))
        assert got == [("low", 5, "urgent", 20, False, 5)], f"got {got}"

    with t.case("a request preempted twice makes two entries, each resumed by the admission after it",
                hint="keep the open preemption per victim and close it at its next admission only"):
        trace = [step(0, [admitted("x")], ["x"]), step(3, [preempted("x", "y", 9)]), step(4, [admitted("x")], ["x"]),
                 step(7, [preempted("x", "x", 14, swapped_blocks=2)]), step(8), step(9, [admitted("x")], ["x"])]
        got = summary(preemptions(trace))
        assert got == [("x", 3, "y", 9, False, 4), ("x", 7, "x", 14, True, 9)], f"got {got}"
        assert [p.recomputed for p in preemptions(trace)] == [9, 0], "a swapped victim recomputes nothing"

    with t.case("two victims in one step, in the order the scheduler preempted them",
                hint="walk the step's decisions in order"):
        trace = [step(2, [preempted("c", "a", 5), preempted("b", "a", 7)]), step(3, [admitted("b")], ["b"]),
                 step(4, [admitted("c")], ["c"])]
        got = summary(preemptions(trace))
        assert got == [("c", 2, "a", 5, False, 4), ("b", 2, "a", 7, False, 3)], f"got {got}"

    with t.case("a simulated burst into a small pool: one entry per preemption the requests counted, each resumed "
                "by its victim's admission, and the recomputed tokens are the work the small pool added",
                hint="compare your list with engine.trace: the steps named by step and resumed"):
        runs = {}
        for blocks in (40, 400):
            engine = sim_engine(block_size=16, num_blocks=blocks, max_num_seqs=8)
            for i in range(10):
                engine.add_request(f"r{i}", [3 + i] * (60 + 23 * i), greedy(50 + 7 * i))
            t.run(engine, max_steps=5000)
            runs[blocks] = engine
        tight = runs[40]
        found = preemptions(tight.trace)
        counted = {r.request_id: r.metrics.num_preemptions for r in tight.finished}
        mine = {rid: sum(p.request == rid for p in found) for rid in counted}
        assert mine == counted, f"preemptions per request {mine}; the requests counted {counted}"
        for p in found:
            assert p.request in tight.trace[p.step].preempted, f"step {p.step} did not preempt {p.request}"
            assert p.resumed is not None and p.request in tight.trace[p.resumed].admitted, (
                f"{p.request} preempted in step {p.step}: resumed {p.resumed}, but that step did not admit it")
        extra = sum(tr.num_tokens for tr in tight.trace) - sum(tr.num_tokens for tr in runs[400].trace)
        assert sum(p.recomputed for p in found) == extra, (
            f"recomputed tokens {sum(p.recomputed for p in found)}; the small pool computed {extra} tokens more")
