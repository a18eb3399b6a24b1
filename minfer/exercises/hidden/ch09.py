"""Chapter 09, hidden: fair queuing (E9.3) admits exactly as the reference on random multi-tenant traffic."""

from __future__ import annotations

import random

from minfer.exercises.checks.common import same_schedule_as_reference, sim_engine
from minfer.exercises.harness import Tester
from minfer.workload import WorkItem, submit


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
