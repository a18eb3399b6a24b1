"""Hidden cases of E9.1 (shortest job first): the queue's order and the running rank compared with the reference's
on random requests with many ties (hypothesis), and whole schedules with ties under memory pressure.

Chapter 09, hidden: fair queuing (E9.3) admits exactly as the reference on random multi-tenant traffic.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minfer import LLMEngine
from minfer.exercises.checks.ch09 import request, with_sjf
from minfer.exercises.checks.common import cpu_sim_engine, greedy, sim_engine
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_class, same_schedule_as_reference
from minfer.scheduler.policies import ShortestJobFirstPolicy
from minfer.workload import WorkItem, submit

JOBS = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.booleans(), st.integers(0, 3)),
                min_size=1, max_size=8)  # (prompt, max_tokens, preempted?, arrival): small numbers, so ties


def equal_jobs() -> LLMEngine:
    """Jobs of equal work (prompt + max_tokens = 24) in a small pool: the most recently admitted goes first."""
    e = with_sjf(cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=4, chunked_prefill_size=8))
    for i, (p, n) in enumerate([(8, 16), (4, 20), (12, 12), (6, 18), (10, 14)]):
        e.add_request(f"r{i}", [i + 1] * p, greedy(n))
    return e


def check_sjf(t: Tester) -> None:
    Reference = reference_class(ShortestJobFirstPolicy, "E9.1")

    with t.case("random requests, many of equal work: the reference's admission order and running ranks",
                hint="order: (work, 0 for a preempted request else 1, arrival); rank: (work, admitted_seq) -- "
                     "of equal work, the most recently admitted ranks last and is preempted first"):
        @settings(max_examples=200, deadline=None, derandomize=True, database=None)
        @given(JOBS)
        def same_order(jobs: list[tuple[int, int, bool, int]]) -> None:
            reqs = [request(f"q{i}", p, n, float(at)) for i, (p, n, _, at) in enumerate(jobs)]
            mine, ref = ShortestJobFirstPolicy(), Reference()
            for r, (_, _, front, _) in zip(reqs, jobs):
                for pol in (mine, ref):
                    (pol.push_front if front else pol.push)(r)
            got, want = [mine.pop().request_id for _ in reqs], [ref.pop().request_id for _ in reqs]
            assert got == want, f"jobs (prompt, max_tokens, preempted, arrival) {jobs}: popped {got}, expected {want}"
            for seq, r in enumerate(reqs):
                r.admitted_seq = seq
            ranked = [r.request_id for r in sorted(reqs, key=mine.rank)]
            expected = [r.request_id for r in sorted(reqs, key=ref.rank)]
            assert ranked == expected, f"jobs {jobs} admitted in this order: ranked {ranked}, expected {expected}"

        same_order()

    with t.case("the same decisions as the reference, step by step: jobs of equal work in a small pool",
                hint="of equal work, the most recently admitted ranks last (admitted_seq breaks the tie)"):
        same_schedule_as_reference(t, "E9.1", equal_jobs)


def tenants_workload(seed: int) -> list[WorkItem]:
    """Three tenants in bursts and pauses, so that tenants go idle and come back."""
    rng = random.Random(seed)
    items = []
    for tenant, start in (("a", 0.0), ("b", 0.3), ("c", 1.2)):
        t = start
        for _ in range(rng.randrange(10, 25)):
            t += rng.expovariate(20.0) + (0.8 if rng.random() < 0.1 else 0.0)
            items.append(WorkItem(t, rng.randrange(32, 400), rng.randrange(8, 96), tenant=tenant))
    return sorted(items, key=lambda w: w.arrival_time)


def check_fair(t: Tester) -> None:
    with t.case("the same admissions as the reference, step by step, on three tenants that pause and return",
                hint="print engine.trace[i].describe() around the step named above, with each tenant's level"):
        for seed in (0, 1):
            def build(seed=seed):
                e = sim_engine(policy="fair", tenant_weights={"a": 2.0}, max_num_seqs=4, num_blocks=512)
                submit(e, tenants_workload(seed))
                return e

            same_schedule_as_reference(t, "E9.3", build, max_steps=20_000)
