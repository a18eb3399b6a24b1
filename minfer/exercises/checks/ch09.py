"""Chapter 09: a new policy, shortest job first (E9.1), graded by goodput on a fixed simulated workload."""

from __future__ import annotations

import random

from minfer.exercises.checks.common import sim_engine, tiny_engine
from minfer.exercises.harness import Tester
from minfer.metrics import SLO, summarize
from minfer.request import Request, SamplingParams
from minfer.scheduler.policies import FairPolicy, ShortestJobFirstPolicy
from minfer.workload import WorkItem, submit

GOODPUT_GAIN = 2.0  # SJF must finish at least twice as many requests per second within E2E_SLO as FCFS does
E2E_SLO = 10.0  # (on the same workload and simulated GPU; the reference reaches about 3x, sizing by prompt 1.3x)


def request(rid: str, prompt: int, max_tokens: int, arrival: float = 0.0) -> Request:
    return Request(rid, list(range(3, 3 + prompt)), SamplingParams(max_tokens=max_tokens), arrival_time=arrival)


def chat_workload(n: int = 300, rate: float = 30.0, seed: int = 0) -> list[WorkItem]:
    """Poisson arrivals; three answers in four are short (16-64 tokens), one in four long (512-1,024)."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out = rng.choice([16, 32, 64]) if rng.random() < 0.75 else rng.choice([512, 768, 1024])
        items.append(WorkItem(t, rng.randint(64, 512), out))
    return items


def with_sjf(engine):
    engine.scheduler.policy = ShortestJobFirstPolicy()  # before any request arrives
    return engine


def check_sjf(t: Tester) -> None:
    with t.case("the queue: least work first (prompt + max_tokens), ties by arrival",
                hint="order() returns the heap key: the job's total work first, then what breaks ties"):
        pol = ShortestJobFirstPolicy()
        reqs = [request("long", 10, 500, 0.0), request("short", 40, 10, 1.0), request("mid", 100, 100, 2.0),
                request("short2", 30, 20, 3.0)]
        for r in reqs:
            pol.push(r)
        assert len(pol) == 4
        order = [r.request_id for r in pol]
        assert order == ["short", "short2", "mid", "long"], f"admission order {order}"
        head = pol.peek()
        assert head is not None and head.request_id == "short" and pol.pop().request_id == "short"
        assert [r.request_id for r in pol] == ["short2", "mid", "long"]

    with t.case("a preempted request goes back ahead of waiting requests of the same size",
                hint="push_front(req) calls order(req, front=True): make `front` break ties before arrival"):
        pol = ShortestJobFirstPolicy()
        pol.push(request("a", 50, 50, 0.0))
        pol.push(request("b", 60, 40, 1.0))
        pol.push_front(request("c", 90, 10, 2.0))
        assert pol.pop().request_id == "c", "the preempted request c (same work as a and b) comes first"

    with t.case("the running rank never changes while a request runs (its tokens grow)",
                hint="rank from what is fixed at admission -- not from num_tokens or output so far"):
        pol = ShortestJobFirstPolicy()
        r = request("r", 20, 30)
        r.admitted_seq = 7
        before = pol.rank(r)
        r.append_token(5)
        r.num_computed_tokens = 21
        assert pol.rank(r) == before, f"rank changed from {before} to {pol.rank(r)} after one token"
        small, big = request("s", 5, 5), request("b", 5, 500)
        small.admitted_seq, big.admitted_seq = 9, 1
        assert pol.rank(small) < pol.rank(big), "the longest job is the last in rank: preempted first"

    with t.case("the engine on SJF, a small pool: preemption takes the longest job; invariants every step",
                hint="rank orders the running list; the scheduler preempts its last request"):
        engine = with_sjf(tiny_engine(block_size=4, num_blocks=10, max_num_seqs=3))
        for i, n in enumerate((34, 12, 20)):
            engine.add_request(f"r{n}", [9 + i] * 6, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        t.run(engine)
        victims = [v for tr in engine.trace for v in tr.preempted]
        assert victims and set(victims) == {"r34"}, f"victims {victims}: only the longest job (r34) should be"

    with t.case(f"goodput on a fixed workload (300 requests, Llama-3-8B on a simulated H100, 8 running): at least "
                f"{GOODPUT_GAIN:g}x the requests per second that first come, first served finishes within "
                f"{E2E_SLO:.0f} s",
                hint="the work of a request is its prompt *and* its answer; in this workload the answers decide"):
        fcfs = sim_engine(max_num_seqs=8, num_blocks=1024, record_trace=False)  # room for 8 running: no preemption
        submit(fcfs, chat_workload())
        fcfs.run()
        baseline = summarize(fcfs.finished, slo=SLO(e2e=E2E_SLO))
        engine = with_sjf(sim_engine(max_num_seqs=8, num_blocks=1024))
        submit(engine, chat_workload())
        t.run(engine, max_steps=100_000)
        s = summarize(engine.finished, slo=SLO(e2e=E2E_SLO))
        good, fcfs_good, share = s.goodput or 0.0, baseline.goodput or 0.0, s.slo_attainment or 0.0
        assert good >= GOODPUT_GAIN * fcfs_good, (
            f"goodput {good:.2f} requests/s ({share:.0%} of requests within {E2E_SLO:.0f} s) against "
            f"{fcfs_good:.2f} for first come, first served: {good / max(fcfs_good, 1e-9):.2f}x, the target "
            f"is {GOODPUT_GAIN:g}x")


# ---- E9.3: fair queuing's virtual time ------------------------------------------------------------------------
def tenant_request(rid: str, tenant: str, arrival: float, prompt: int = 10) -> Request:
    return Request(rid, [3] * prompt, SamplingParams(max_tokens=8), arrival_time=arrival, tenant=tenant)


def serve(pol: FairPolicy, n: int) -> list[str]:
    """Pop ``n`` requests, each charged its own tokens as if scheduled at once: the admission order."""
    order = []
    for _ in range(n):
        req = pol.pop()
        pol.on_scheduled(req, req.num_tokens)
        order.append(req.request_id)
    return order


def check_fair(t: Tester) -> None:
    with t.case("level: the tokens served to a tenant divided by its weight",
                hint="served[tenant] / weight(tenant); a tenant without a weight has weight 1"):
        pol = FairPolicy({"gold": 4.0})
        pol.served["gold"], pol.served["free"] = 100.0, 30.0
        assert pol.level("gold") == 25.0, f"gold (weight 4) served 100 tokens: level {pol.level('gold')}, expected 25"
        assert pol.level("free") == 30.0, f"free (weight 1) served 30 tokens: level {pol.level('free')}, expected 30"

    with t.case("the tenant with the lowest level goes next; of equals, the one whose first request arrived first",
                hint="min over the tenants with a queue of (level, arrival time of the queue's head)"):
        pol = FairPolicy({})
        for rid, tenant, arrival in (("a1", "a", 0.0), ("a2", "a", 0.1), ("b1", "b", 0.2), ("c1", "c", 0.05)):
            pol.push(tenant_request(rid, tenant, arrival))
        head = pol.peek()
        assert head is not None and head.request_id == "a1", "all at level 0: the earliest arrival, a1, first"
        assert serve(pol, 4) == ["a1", "c1", "b1", "a2"], "after a1, tenant a is above the others: c1, b1, then a2"

    with t.case("weights: while both wait, a tenant of weight 2 gets twice the tokens of a tenant of weight 1",
                hint="the level divides by the weight: a heavier tenant's level rises more slowly"):
        pol = FairPolicy({"x": 2.0})
        for i in range(12):
            pol.push(tenant_request(f"x{i}", "x", 0.01 * i))
            pol.push(tenant_request(f"y{i}", "y", 0.01 * i + 0.005))
        order = serve(pol, 9)
        assert sum(r.startswith("x") for r in order) == 6, f"admission order {order}: x should get 6 of the first 9"

    with t.case("pop moves the virtual time up to the level of the tenant it picked, and never down",
                hint="vtime = max(vtime, level(tenant)) for the tenant whose request pop takes"):
        pol = FairPolicy({})
        pol.push(tenant_request("a1", "a", 0.0))
        pol.push(tenant_request("b1", "b", 0.1))
        pol.served["a"], pol.served["b"] = 50.0, 20.0
        assert pol.pop().request_id == "b1" and pol.vtime == 20.0, f"vtime {pol.vtime} after serving b at level 20"
        assert pol.pop().request_id == "a1" and pol.vtime == 50.0, f"vtime {pol.vtime} after serving a at level 50"
        pol.push(tenant_request("c1", "c", 0.2))
        pol.served["c"] = 10.0  # below the virtual time, as a tenant that never left may be
        assert pol.pop().request_id == "c1" and pol.vtime == 50.0, (
            f"vtime fell to {pol.vtime}: the virtual time never decreases")

    with t.case("a tenant back from idle re-enters at the virtual time: no banked credit",
                hint="when a tenant gets a new queue, raise served[tenant] to at least vtime * weight"):
        pol = FairPolicy({"w": 2.0})
        pol.vtime = 40.0
        pol.push(tenant_request("w1", "w", 0.0))
        assert pol.served["w"] == 80.0, f"w (weight 2) re-entered with {pol.served['w']} served, expected 40 * 2 = 80"
        pol.served["v"] = 100.0
        pol.push(tenant_request("v1", "v", 0.0))
        assert pol.served["v"] == 100.0, "a tenant above the virtual time keeps what it was served: never lowered"
        pol.push(tenant_request("w2", "w", 0.1))
        pol.served["w"] = 10.0  # while its queue is not empty, pushing more changes nothing
        pol.push(tenant_request("w3", "w", 0.2))
        assert pol.served["w"] == 10.0, "a tenant that still has a queue is not re-activated"

    with t.case("the engine, fair policy: a flood from one tenant does not starve another, and a tenant that arrives "
                "late shares from then on instead of taking every admission",
                hint="an idle tenant must come back at the virtual time, not at the level it left with"):
        engine = sim_engine(policy="fair", max_num_seqs=8, num_blocks=2048, record_trace=True)
        submit(engine, [WorkItem(0.0, 256, 64, tenant="a")] * 60 + [WorkItem(1.0, 256, 64, tenant="b")] * 30)
        t.run(engine, max_steps=100_000)
        tenant_of = {r.request_id: r.tenant or "" for r in engine.finished}
        later = [tenant_of[rid] for tr in engine.trace if tr.start_time >= 1.0 for rid in tr.admitted][:16]
        assert 6 <= later.count("a") <= 10, (f"of the first 16 admissions after b arrives, {later.count('a')} are "
                                             f"a's: {''.join(later)}; fair sharing gives each about 8")
