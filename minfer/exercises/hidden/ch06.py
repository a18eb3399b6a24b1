"""Hidden cases of E6.1 (the preemption victim): the reference's decisions, step by step, under memory pressure --
first come first served, priorities with ties, shortest job first, and swapping to host memory.

Chapter 06, hidden: the swap path decides exactly as the reference, step by step (E6.4).
"""

from __future__ import annotations

from functools import partial

from minfer import LLMEngine
from minfer.exercises.checks.ch06 import swap_storm
from minfer.exercises.checks.common import cpu_sim_engine, greedy, sim_engine
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import same_schedule_as_reference


def burst() -> LLMEngine:
    e = cpu_sim_engine(block_size=4, num_blocks=14, max_num_seqs=6, chunked_prefill_size=10)
    for i, (p, n) in enumerate([(9, 20), (14, 9), (6, 26), (11, 14), (3, 22), (17, 6)]):
        e.add_request(f"r{i}", [i + 1] * p, greedy(n))
    return e


def priorities() -> LLMEngine:
    """Equal priorities among the running requests: the most recently admitted of the lowest goes first."""
    e = cpu_sim_engine(block_size=4, num_blocks=14, max_num_seqs=5, policy="priority", chunked_prefill_size=8)
    for i, (p, n, prio) in enumerate([(10, 16, 2), (7, 12, 1), (12, 10, 0), (5, 18, 2), (8, 9, 1), (6, 14, 2)]):
        e.add_request(f"r{i}", [i + 1] * p, greedy(n), priority=prio)
    return e


def shortest_first() -> LLMEngine:
    e = cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=4, policy="sjf", chunked_prefill_size=8)
    for i, (p, n) in enumerate([(6, 20), (9, 8), (4, 24), (7, 12), (5, 16)]):
        e.add_request(f"r{i}", [i + 1] * p, greedy(n))
    return e


def swapping() -> LLMEngine:
    """Llama-3-8B on an H100 (the CPU spec prices no host link); the host pool holds a few blocks, not all."""
    e = sim_engine(block_size=4, num_blocks=12, max_num_seqs=4, chunked_prefill_size=8, preemption_mode="swap",
                   swap_space=3_000_000)  # bytes: about 5 blocks of Llama-3-8B
    for i, (p, n) in enumerate([(9, 14), (6, 18), (11, 10), (4, 20)]):
        e.add_request(f"r{i}", [i + 1] * p, greedy(n))
    return e


WORKLOADS = {"a burst into 14 blocks": burst, "priorities, with ties": priorities,
             "shortest job first": shortest_first, "preemption by swapping to a small host pool": swapping}


def check_victim(t: Tester) -> None:
    for what, build in WORKLOADS.items():
        with t.case(f"the same decisions as the reference, step by step: {what}",
                    hint="print engine.trace[i].describe() and viz.narrate(engine.trace[i]) around the step named "
                         "above"):
            same_schedule_as_reference(t, "E6.1", build)


def check_swap(t: Tester) -> None:
    with t.case("the same decisions as the reference, step by step: swaps, and host pools that fill up",
                hint="print engine.trace[i].describe() and viz.narrate(engine.trace[i]) around the step named above"):
        for blocks, host in ((12, None), (10, 4), (14, 6)):
            same_schedule_as_reference(t, "E6.4", partial(swap_storm, blocks, host))
