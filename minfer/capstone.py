"""The capstone's arena: a workload family, the latency targets, and the score of a policy on it.

The capstone (chapter 09) asks for a scheduling policy of your own design (``policies.CapstonePolicy``). It is
scored on the simulator -- Llama-3-8B on a simulated H100, so a run of 500 requests takes seconds and every run
of the same policy gives the same number -- by **goodput**: the requests per second that were served within
both targets, time to first token at most ``SLO_TTFT`` and time per output token at most ``SLO_TPOT``.

The workload is a family, drawn from a seed: Poisson arrivals at more than the GPU can serve at once, seven
requests in ten short chats, two in ten long documents (a prompt of thousands of tokens, a short answer), one in
ten long generations (a short prompt, an answer of a thousand tokens or more), in a pool that cannot hold them
all, so preemption happens. You get the sample (``SAMPLE_SEED``) to develop on; the grade draws other members of
the same family, which you do not see -- a policy tuned to the sample's accidents gains nothing there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minfer.config import EngineConfig
from minfer.engine import LLMEngine
from minfer.metrics import SLO, Summary, summarize
from minfer.workload import WorkItem, submit

SLO_TTFT = 0.5  # seconds to the first token
SLO_TPOT = 0.025  # seconds per output token after the first
TARGETS = SLO(ttft=SLO_TTFT, tpot=SLO_TPOT)
SAMPLE_SEED = 0
PASS_GAIN = 3.0  # a pass: at least three times the goodput of first come, first served, on the graded workloads
ARENA = dict(executor="sim", model="llama-3-8b", hardware="H100-SXM", max_num_seqs=64, num_blocks=2500)


def capstone_workload(seed: int, n: int = 500, rate: float = 14.0) -> list[WorkItem]:
    """A member of the family: ``n`` requests arriving at ``rate`` per second on average."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        kind = rng.random()
        if kind < 0.7:  # a chat turn
            items.append(WorkItem(t, rng.randint(64, 512), rng.randint(16, 256)))
        elif kind < 0.9:  # a long document, a short answer
            items.append(WorkItem(t, rng.randint(2000, 6000), rng.randint(32, 256)))
        else:  # a short prompt, a long generation
            items.append(WorkItem(t, rng.randint(64, 256), rng.randint(800, 1600)))
    return items


@dataclass(slots=True, frozen=True)
class Score:
    policy: str
    seed: int
    goodput: float  # requests per second within both targets
    attainment: float  # the share of requests within both targets
    preemptions: int

    def __str__(self) -> str:
        return (f"{self.policy:>9}: goodput {self.goodput:5.2f} requests/s ({self.attainment:4.0%} within both "
                f"targets), {self.preemptions} preemptions")


def arena(policy: str, seed: int = SAMPLE_SEED, record_trace: bool = False) -> LLMEngine:
    """The simulated engine every policy is scored on, holding workload ``seed``, not run yet."""
    engine = LLMEngine(EngineConfig(policy=policy, record_trace=record_trace, **ARENA))  # type: ignore[arg-type]
    submit(engine, capstone_workload(seed))
    return engine


def scored(engine: LLMEngine, seed: int) -> Score:
    """The score of an arena engine that has run to the end."""
    s: Summary = summarize(engine.finished, slo=TARGETS)
    return Score(engine.config.policy, seed, s.goodput or 0.0, s.slo_attainment or 0.0, s.num_preemptions)


def score(policy: str, seed: int = SAMPLE_SEED) -> Score:
    """Run workload ``seed`` to the end under ``policy`` (a name of ``POLICIES``) and score it."""
    engine = arena(policy, seed)
    engine.run()
    return scored(engine, seed)
