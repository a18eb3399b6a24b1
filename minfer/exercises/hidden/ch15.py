"""Hidden cases of E15.1 (landing a prefilled request): whole split runs -- several layouts, links, loads and small
decode pools that queue and preempt -- give every request exactly the reference's token times."""

from __future__ import annotations

from typing import Any

from minfer.disagg import ClusterRun, run_disaggregated
from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns
from minfer.workload import poisson

RUNS: list[tuple[int, int, str, float, int, dict[str, Any]]] = [  # (prefill, decode, link, rate, seed, engine options)
    (1, 1, "RDMA-400G", 12.0, 0, {}),
    (2, 1, "Ethernet-10G", 20.0, 1, {}),
    (1, 2, "PCIe-5", 16.0, 2, {"num_blocks": 110, "block_size": 16}),
    (1, 1, "NVLink-4", 24.0, 3, {"num_blocks": 110, "block_size": 16, "max_num_seqs": 8}),
]


def runs() -> list[ClusterRun]:
    out = []
    for num_prefill, num_decode, link, rate, seed, options in RUNS:
        items = poisson(40, rate, 512, 24, max_prompt=1536, max_output=96, seed=seed)
        out.append(run_disaggregated(items, num_prefill, num_decode, link, seed=seed, **options))
    return out


def times(run: ClusterRun) -> list[tuple]:
    return [(r.request_id, r.output_token_ids, r.metrics.arrival_time, r.metrics.first_scheduled_time,
             r.metrics.first_token_time, tuple(r.metrics.token_times), r.metrics.finished_time) for r in run.requests]


def check_land(t: Tester) -> None:
    with t.case("four split runs (1P+1D, 2P+1D, 1P+2D; four links; small decode pools that queue and preempt): "
                "every request's tokens and times exactly the reference's",
                hint="the landed request keeps the prefill's arrival and first-scheduled times; its first token is "
                     "seen at `at`; its prompt counts computed and waits in engine.host_pool"):
        mine = runs()
        with StandIns() as swaps:
            swaps.install(["E15.1"], always=True)
            reference = runs()
        for (num_prefill, num_decode, link, rate, _, options), a, b in zip(RUNS, mine, reference):
            what = f"{num_prefill}P+{num_decode}D over {link} at {rate:g} requests/s {options or ''}".rstrip()
            for x, y in zip(times(a), times(b)):
                assert x == y, f"{what}: request {x[0]} differs from the reference:\n  yours:     {x}\n  reference: {y}"
