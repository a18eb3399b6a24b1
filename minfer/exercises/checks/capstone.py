"""The capstone (E9.4): a policy of the student's design, graded by goodput in the simulated arena.

The public cases run the sample workload; the hidden ones (``hidden/capstone.py``) run other members of the same
family. Every score is noted in the report -- passed or not -- beside first come, first served's on the same
workload: the pass mark is ``PASS_GAIN`` times that baseline, and the instructor ranks the rest by the score.
"""

from __future__ import annotations

from minfer.capstone import PASS_GAIN, SAMPLE_SEED, SLO_TPOT, SLO_TTFT, arena, score, scored
from minfer.exercises.harness import Tester
from minfer.request import Request, SamplingParams
from minfer.scheduler.policies import CapstonePolicy


def keys_are_static(t: Tester) -> None:
    with t.case("order and rank give comparable keys, and a rank does not change while its request runs",
                hint="compute the keys from what is known at arrival (prompt, max_tokens, arrival, priority): "
                     "never from tokens generated so far, or a request's place in the running list moves under it"):
        pol = CapstonePolicy()
        a = Request("a", list(range(3, 40)), SamplingParams(max_tokens=50), arrival_time=0.0)
        b = Request("b", list(range(3, 900)), SamplingParams(max_tokens=10), arrival_time=1.0)
        a.admitted_seq, b.admitted_seq = 1, 2
        for front in (False, True):
            assert isinstance(pol.order(a, front), tuple), "order() returns a tuple: the heap's sort key"
            sorted([pol.order(a, front), pol.order(b, front)])  # comparable with each other
        before = pol.rank(a)
        a.append_token(7)
        a.num_computed_tokens = len(a.prompt_token_ids) + 1
        assert pol.rank(a) == before, f"rank changed from {before} to {pol.rank(a)} after one token"
        sorted([pol.rank(a), pol.rank(b)])


def goodput_on(t: Tester, seed: int, what: str, check_every_step: bool) -> None:
    """Score the policy on workload ``seed`` beside first come, first served; note both; require the gain."""
    with t.case(f"goodput on {what}: at least {PASS_GAIN:g}x first come, first served's, within TTFT "
                f"{SLO_TTFT * 1000:.0f} ms and TPOT {SLO_TPOT * 1000:.0f} ms",
                hint="time to first token waits on prefills ahead in the queue; time per output token on "
                     "preemptions (a victim's next token waits for its recompute)"):
        engine = arena("capstone", seed)
        if check_every_step:
            t.run(engine, max_steps=200_000)
        else:
            engine.run()
        mine, base = scored(engine, seed), score("fcfs", seed)
        t.note(f"{what}: {mine.goodput:.2f} requests/s, {mine.goodput / max(base.goodput, 1e-9):.2f}x "
               f"first come, first served ({base.goodput:.2f}); {mine.attainment:.0%} within both targets, "
               f"{mine.preemptions} preemptions")
        assert mine.goodput >= PASS_GAIN * base.goodput, (
            f"goodput {mine.goodput:.2f} requests/s against {base.goodput:.2f} for first come, first served: "
            f"{mine.goodput / max(base.goodput, 1e-9):.2f}x, the pass mark is {PASS_GAIN:g}x")


def check_capstone(t: Tester) -> None:
    keys_are_static(t)
    goodput_on(t, SAMPLE_SEED, f"the sample workload (seed {SAMPLE_SEED})", check_every_step=True)
