"""Hidden cases of E4.1 (the running loop): the very decisions of the reference, step by step, on workloads that
reach every path of it -- prompts in chunks, a token budget that binds in the running pass itself, preemption in a
small pool, a step that admits nobody after a preemption, priority preemption before the running pass, and fair
queuing, whose service accounting only the loop can feed."""

from __future__ import annotations

from minfer import LLMEngine
from minfer.exercises.checks.ch04 import prompt
from minfer.exercises.checks.common import cpu_sim_engine, greedy
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import same_schedule_as_reference


def chunked() -> LLMEngine:
    """Prompts longer than a chunk, two chunks a step: running prompts continue beside decodes."""
    e = cpu_sim_engine(num_blocks=64, max_num_seqs=3, chunked_prefill_size=12, max_prefill_chunks_per_step=2)
    for i, (p, n) in enumerate([(20, 9), (5, 14), (33, 4), (12, 7), (2, 11)]):
        e.add_request(f"r{i}", prompt(p, i), greedy(n))
    return e


def urgent_among_decodes() -> LLMEngine:
    """Urgent requests arrive among three long decodes, in a small pool under a token budget of 6: an urgent
    prompt ranks first and its chunk takes the whole budget, starving the decodes behind it in the running pass;
    later a decode preempts another, and no waiting request may start in that step."""
    e = cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=3, policy="priority", chunked_prefill_size=8,
                       max_num_batched_tokens=6)
    for i, (p, n, prio, at) in enumerate([(6, 20, 1, 0.0), (5, 18, 1, 0.0), (7, 16, 1, 0.0), (30, 4, 0, 0.3),
                                          (3, 3, 0, 0.5)]):
        e.add_request(f"r{i}", prompt(p, i), greedy(n), priority=prio, arrival_time=at)
    return e


def small_pool() -> LLMEngine:
    """A pool of 12 blocks of 4: running requests preempt each other, some in the middle of a prompt."""
    e = cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=4, chunked_prefill_size=8)
    for i, (p, n) in enumerate([(9, 12), (14, 9), (6, 16), (11, 10), (3, 12)]):
        e.add_request(f"r{i}", prompt(p, i), greedy(n))
    return e


def priorities() -> LLMEngine:
    """Priority preemption: urgent requests arrive later, and a step starts with the preemptions that make room
    for them -- made before the running pass, which must not take them for its own."""
    e = cpu_sim_engine(block_size=4, num_blocks=16, max_num_seqs=3, policy="priority", priority_preemption=True,
                       chunked_prefill_size=6)
    for i, (p, n, prio, at) in enumerate([(10, 12, 2, 0.0), (7, 9, 1, 0.0), (12, 6, 2, 0.0), (5, 14, 0, 0.2),
                                          (8, 5, 0, 0.4), (6, 8, 1, 0.6)]):
        e.add_request(f"r{i}", prompt(p, i), greedy(n), priority=prio, arrival_time=at)
    return e


def fair() -> LLMEngine:
    """Weighted fair queuing: which tenant is admitted next depends on the service the running loop reports."""
    e = cpu_sim_engine(num_blocks=128, max_num_seqs=2, chunked_prefill_size=16, policy="fair",
                       tenant_weights={"gold": 3.0})
    for i in range(10):
        tenant, (p, n) = ("gold", (24, 6)) if i % 3 == 0 else ("free", (6, 10 + i))
        e.add_request(f"{tenant}{i}", prompt(p, i), greedy(n), tenant=tenant)
    return e


WORKLOADS = {"prompts in chunks": chunked,
             "urgent requests among decodes: a token budget that binds, memory that runs short": urgent_among_decodes,
             "a small pool with preemptions": small_pool, "priorities with priority preemption": priorities,
             "fair queuing between two tenants": fair}


def check_running_loop(t: Tester) -> None:
    for what, build in WORKLOADS.items():
        with t.case(f"the same decisions as the reference, step by step: {what}",
                    hint="the message puts your step beside the reference's; run the workload on your code and "
                         "print engine.trace[i].describe() for the steps before it, to see how yours got there"):
            same_schedule_as_reference(t, "E4.1", build)
