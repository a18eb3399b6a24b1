"""Chapter 11, hidden: preemptions() (E11.1) reads swap and priority runs exactly as the reference does."""

from __future__ import annotations

from minfer.exercises.checks.ch06 import swap_storm
from minfer.exercises.checks.common import greedy, sim_engine
from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns
from minfer.trace import preemptions


def priority_run():
    engine = sim_engine(block_size=4, num_blocks=14, max_num_seqs=5, policy="priority", priority_preemption=True,
                        chunked_prefill_size=8)
    for i, (p, n, prio) in enumerate([(10, 16, 2), (7, 12, 1), (12, 10, 0), (5, 18, 2), (8, 9, 1), (9, 14, 0)]):
        engine.add_request(f"r{i}", [i + 1] * p, greedy(n), priority=prio)
    engine.run()
    return engine.trace


def check_preemptions(t: Tester) -> None:
    with t.case("swap and priority runs, and every prefix of them: the same preemptions as the reference",
                hint="a trace cut short leaves the last victims with resumed None"):
        storm = swap_storm(10, 4)
        storm.run()
        for trace in (storm.trace, priority_run()):
            assert any(tr.preempted for tr in trace), "this case is meant to preempt"
            cuts = range(1, len(trace) + 1)
            mine = [preemptions(trace[:n]) for n in cuts]
            with StandIns() as swaps:
                swaps.install(["E11.1"], always=True)
                ref = [preemptions(trace[:n]) for n in cuts]
            for n, (a, b) in zip(cuts, zip(mine, ref)):
                assert a == b, f"the first {n} steps: {a}; the reference finds {b}"
