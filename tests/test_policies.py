"""Policies and SLAs: priority order and preemption, fair sharing between tenants, queue capacity, queue
timeouts, SLO shedding -- and that no request is ever lost. The simulator runs the workloads where model
output does not matter (deterministic and fast); the tiny model where it does."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import alone, run_checked, tiny_engine
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.metrics import SLO, jain_fairness, summarize
from minfer.request import FINISH_REASONS, Request
from minfer.scheduler.policies import FairPolicy, PriorityPolicy
from minfer.workload import WorkItem, poisson, submit


def sim(**kw) -> LLMEngine:
    kw.setdefault("num_blocks", 2000)  # a small pool keeps check_invariants (after every step) quick
    return LLMEngine(EngineConfig(executor="sim", model="llama-3-8b", hardware="H100-SXM", **kw))


def admission_order(engine: LLMEngine) -> list[str]:
    """Request ids in the order they were first admitted."""
    seen: dict[str, None] = {}
    for t in engine.trace:
        for rid in t.admitted:
            seen.setdefault(rid)
    return list(seen)


def tokens_per_tenant(engine: LLMEngine, until: float) -> dict[str | None, int]:
    """Tokens computed (prompt chunks and decodes) per tenant in steps that started before ``until``."""
    tenant = {r.request_id: r.tenant for r in engine.finished}
    out: dict[str | None, int] = {}
    for t in engine.trace:
        if t.start_time >= until:
            break
        for rid, n in (t.prefill_tokens | t.decode_tokens).items():
            out[tenant[rid]] = out.get(tenant[rid], 0) + n
    return out


def both_waiting_until(engine: LLMEngine) -> float:
    """The end of the window in which every tenant still had requests waiting (a tenant with none waiting
    cannot use its share, and the others rightly take it): the earliest of the tenants' last admissions."""
    last: dict[str | None, float] = {}
    for r in engine.finished:
        last[r.tenant] = max(last.get(r.tenant, 0.0), r.metrics.first_scheduled_time)
    return min(last.values())


# ---- priority ----------------------------------------------------------------------------------------
def test_priority_order_under_load():
    """Under load, requests start in (priority, arrival) order; FCFS, on the same workload, by arrival."""
    rng = random.Random(3)
    items = [WorkItem(0.001 * i, 200, 20, priority=rng.randrange(4)) for i in range(40)]
    orders = {}
    for policy in ("fcfs", "priority"):
        e = sim(policy=policy, max_num_seqs=4)
        ids = submit(e, items)
        run_checked(e)
        orders[policy] = admission_order(e)
        assert sorted(orders[policy]) == sorted(ids)
    assert orders["fcfs"] == [f"r{i}" for i in range(40)]
    # the first four arrive before anything is queued, so they start at once; from then on priority rules
    by_rank = sorted(range(4, 40), key=lambda i: (items[i].priority, i))
    started_late = [rid for rid in orders["priority"] if int(rid[1:]) >= 4]
    assert started_late == [f"r{i}" for i in by_rank]


def test_priority_preemption_takes_the_lowest_priority_most_recent_and_outputs_stay_exact(tiny):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    e = tiny_engine(tiny, policy="priority", priority_preemption=True, max_num_seqs=3, num_blocks=64,
                    block_size=4)
    prompts = {rid: [5 + i] * (7 + i) for i, rid in enumerate(["a", "b", "c", "hi", "hi2"])}
    for rid, prio in (("a", 2), ("b", 5), ("c", 5)):
        e.add_request(rid, prompts[rid], params, priority=prio)
    for _ in range(4):  # one prompt per step: a, b, c admitted in that order, then all decode
        e.step()
        e.scheduler.check_invariants()
    assert [r.request_id for r in e.scheduler.running] == ["a", "b", "c"]

    e.add_request("hi", prompts["hi"], params, priority=0)
    e.step()
    e.scheduler.check_invariants()
    # b and c share the lowest priority; c was admitted last, so it has the least work to redo
    assert e.trace[-1].preempted == ["c"] and e.trace[-1].admitted == ["hi"]

    e.add_request("hi2", prompts["hi2"], params, priority=1)
    e.step()
    assert e.trace[-1].preempted == ["b"] and e.trace[-1].admitted == ["hi2"]

    e.add_request("eq", [9] * 5, params, priority=2)  # outranks nobody who runs: it waits
    e.step()
    assert not e.trace[-1].preempted and "eq" not in e.trace[-1].admitted

    outs = run_checked(e)
    for rid, p in prompts.items():
        assert tuple(outs[rid].outputs[0].token_ids) == alone(tuple(p), 24), f"{rid}: tokens differ"
    preemptions = {rid: outs[rid].metrics.num_preemptions for rid in prompts}
    assert preemptions == {"a": 0, "b": 1, "c": 1, "hi": 0, "hi2": 0}


def test_priority_preemption_only_when_the_arrival_cannot_start_otherwise():
    e = sim(policy="priority", priority_preemption=True, max_num_seqs=4)
    p = SamplingParams(max_tokens=50, ignore_eos=True)
    for i in range(3):
        e.add_request(f"low{i}", list(range(1, 100)), p, priority=9)
    for _ in range(4):
        e.step()
    e.add_request("hi", list(range(1, 100)), p, priority=0)  # a free slot and free blocks: no victim needed
    e.step()
    assert e.trace[-1].admitted == ["hi"] and not e.trace[-1].preempted
    run_checked(e)
    assert not any(t.preempted for t in e.trace)


def test_priority_preemption_counts_only_the_first_chunk_of_a_long_prompt(tiny):
    """The urgent prompt needs more blocks than are free, but its first chunk fits: it starts, nobody is
    preempted, and its later chunks come as running requests finish."""
    model, tok = tiny
    e = LLMEngine(EngineConfig(model="tiny-random", num_blocks=24, block_size=16, chunked_prefill_size=64,
                               policy="priority", priority_preemption=True), model=model, tokenizer=tok)
    e.add_request("low", [5] * 100, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), priority=9)
    for _ in range(3):
        e.step()
    free = e.block_pool.num_free_blocks
    assert free < 300 // 16 and free >= 64 // 16  # the whole prompt does not fit, its first chunk does
    e.add_request("urgent", [7] * 300, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), priority=0)
    e.step()
    assert e.trace[-1].admitted == ["urgent"] and not e.trace[-1].preempted
    run_checked(e)


def test_knobs_that_act_on_priorities_need_the_priority_policy():
    with pytest.raises(ValueError, match="priority_preemption.*policy='priority'"):
        EngineConfig(priority_preemption=True)
    with pytest.raises(ValueError, match="promote.*policy='priority'"):
        EngineConfig(policy="fair", max_queue_time=1.0, queue_timeout_action="promote")


# ---- fair sharing ------------------------------------------------------------------------------------
def flood(heavy: int, light: int, **kw) -> LLMEngine:
    """``heavy`` requests of tenant "heavy", then ``light`` of tenant "light", all at time 0, all alike."""
    e = sim(max_num_seqs=8, **kw)
    submit(e, [WorkItem(0.0, 256, 64, tenant="heavy")] * heavy
           + [WorkItem(0.0, 256, 64, tenant="light")] * light)
    run_checked(e)
    return e


def test_a_light_tenant_gets_its_share_while_a_heavy_tenant_floods():
    """Jain's index over the tokens each tenant was served while both had work: FCFS serves the flood first
    (the light tenant gets nothing: index 1/2); fair queuing serves both alike (index ~1)."""
    jain = {}
    for policy in ("fcfs", "fair"):
        e = flood(64, 16, policy=policy)
        served = tokens_per_tenant(e, until=both_waiting_until(e))
        jain[policy] = jain_fairness([served.get("heavy", 0), served.get("light", 0)])
    assert jain["fcfs"] < 0.6, jain
    assert jain["fair"] > 0.98, jain


def test_tenant_weights_are_respected():
    e = flood(48, 48, policy="fair", tenant_weights={"heavy": 3.0})
    served = tokens_per_tenant(e, until=both_waiting_until(e))
    assert 2.6 < served["heavy"] / served["light"] < 3.4, served


def test_an_idle_tenant_does_not_bank_credit():
    """Tenant "a" has the engine to itself for a while; when "b" arrives with a flood, "b" shares the
    engine with "a" from then on -- it does not take every admission until its past idleness is repaid."""
    items = [WorkItem(0.0, 256, 64, tenant="a")] * 60 + [WorkItem(1.0, 256, 64, tenant="b")] * 30
    e = sim(policy="fair", max_num_seqs=8)
    submit(e, items)
    run_checked(e)
    tenant = {r.request_id: r.tenant for r in e.finished}
    later = [tenant[rid] for t in e.trace if t.start_time >= 1.0 for rid in t.admitted][:16]
    assert 6 <= later.count("a") <= 10, later


def test_fair_policy_iterates_in_admission_order():
    """Load shedding reads the queue in the order the policy would admit it: for fair queuing that is an
    interleaving of the tenants, which iteration must predict exactly when each admission costs its tokens."""
    pol = FairPolicy({"x": 2.0})
    rng = random.Random(0)
    for i in range(30):
        pol.push(Request(f"q{i}", [1] * rng.randrange(1, 50), SamplingParams(), arrival_time=i * 0.1,
                         tenant=rng.choice(["x", "y", None])))
    predicted = [r.request_id for r in pol]
    popped = []
    while len(pol):
        req = pol.pop()
        pol.on_scheduled(req, req.num_tokens)
        popped.append(req.request_id)
    assert predicted == popped


# ---- admission control, timeouts, shedding -----------------------------------------------------------
def test_queue_capacity_refuses_the_newest_arrivals_at_once():
    e = sim(max_waiting=3, max_num_seqs=2, max_prefill_chunks_per_step=2)
    p = SamplingParams(max_tokens=40, ignore_eos=True)
    for i in range(10):
        e.add_request(f"r{i}", list(range(1, 60)), p)
    outs = e.step()
    e.scheduler.check_invariants()
    assert e.trace[-1].admitted == ["r0", "r1"]  # the machine takes what it can first
    refused = {o.request_id: o.outputs[0] for o in outs if o.finished}
    assert sorted(refused) == [f"r{i}" for i in range(5, 10)]  # the queue keeps 3: the newest are refused
    assert all(c.finish_reason == "rejected" and c.stop_reason == "queue full (max_waiting=3)"
               and not c.token_ids for c in refused.values())
    assert e.trace[-1].finish_reasons == {rid: "rejected" for rid in refused}
    assert e.scheduler.num_waiting == 3

    e.add_request("late", list(range(1, 60)), p)  # the queue is full: the newcomer goes, not r2..r4
    e.step()
    assert e.trace[-1].finish_reasons == {"late": "rejected"}
    final = run_checked(e)
    assert all(final[f"r{i}"].outputs[0].finish_reason == "length" for i in range(5))


def test_queue_capacity_zero_refuses_only_what_cannot_start():
    e = sim(max_waiting=0, max_num_seqs=4)
    e.add_request("a", list(range(1, 30)), SamplingParams(max_tokens=5, ignore_eos=True))
    outs = run_checked(e)
    assert outs["a"].outputs[0].finish_reason == "length"  # an idle engine admits it: nobody waits


def test_queue_timeout_finishes_requests_that_never_started():
    e = sim(max_queue_time=0.2, max_num_seqs=2, num_blocks=40)  # a small pool: some requests are preempted
    submit(e, [WorkItem(0.01 * i, 300, 120) for i in range(12)])
    outs = run_checked(e)
    reqs = {r.request_id: r for r in e.finished}
    timed_out = [rid for rid, o in outs.items() if o.outputs[0].finish_reason == "timeout"]
    assert timed_out, "the queue should be long enough for some requests to time out"
    for rid in timed_out:
        m = reqs[rid].metrics
        assert m.first_scheduled_time is None and not outs[rid].outputs[0].token_ids
        assert m.finished_time - m.arrival_time > 0.2
        assert outs[rid].outputs[0].stop_reason.endswith("> max_queue_time=0.2s")
    served = [r for r in reqs.values() if r.finish_reason == "length"]
    assert all(r.metrics.queue_time <= 0.2 + 0.05 for r in served)  # started within the limit (+ one step)
    assert any(r.metrics.num_preemptions for r in served), "no preemption happened: the case is untested"


def test_queue_timeout_promote_lets_a_low_priority_request_through():
    """Under a steady overload of priority-0 work, a priority-5 request would wait until the stream ends.
    With promotion every waiting request rises one level per max_queue_time waited (aging), so the
    priority-5 request overtakes the stream requests that arrived more than 5 x 0.3 s after it."""
    items = [WorkItem(0.05, 200, 40, priority=5)]  # arrives once the stream has built a queue
    items += [WorkItem(0.1 * i, 200, 40, priority=0) for i in range(100)]  # 10/s; one slot serves ~3.5/s
    start = {}
    for action in ("finish", "promote"):
        kw = dict(max_queue_time=0.3, queue_timeout_action="promote") if action == "promote" else {}
        e = sim(policy="priority", max_num_seqs=1, num_blocks=200, **kw)
        submit(e, items)
        outs = run_checked(e)
        assert all(o.outputs[0].finish_reason == "length" for o in outs.values())
        low = next(r for r in e.finished if r.request_id == "r0")
        start[action] = low.metrics.first_scheduled_time
        if action == "finish":
            assert start[action] == max(r.metrics.first_scheduled_time for r in e.finished), "it started last"
            assert low.priority == 5
        else:
            assert low.priority < 5, "promotion raised its level"
    assert start["promote"] < start["finish"] / 3, start


def test_promoting_again_and_again_leaves_no_pile_of_stale_entries():
    """Each promotion pushes a request anew and leaves its old heap entry behind: a long overload that promotes
    every waiting request every few steps must not grow the heap with them (every step walks the queue in order).
    The queue order stays the one a fresh queue of the same requests would have."""
    pol, rng = PriorityPolicy(), random.Random(7)
    reqs = [Request(f"q{i}", [1], SamplingParams(), arrival_time=i * 0.1, priority=rng.randrange(50, 60))
            for i in range(40)]
    for r in reqs:
        pol.push(r)
    for _ in range(30):
        for r in rng.sample(reqs, 10):
            pol.promote(r)
        assert len(pol.heap) <= 2 * len(pol) + 16
    gone = reqs[::7]
    for r in gone:
        pol.remove(r)
    want = sorted((r for r in reqs if r not in gone), key=lambda r: (r.priority, r.arrival_time))
    assert list(pol) == want
    assert [pol.pop() for _ in range(len(want))] == want and pol.peek() is None


@pytest.mark.parametrize("rate, sheds", [(5.0, False), (20.0, True)])
def test_slo_shedding_improves_goodput_under_overload(rate, sheds):
    """At twice the machine's capacity, serving everyone makes nearly everyone late; shedding the requests
    that cannot make their TTFT target lets the rest make it. Under light load nothing is shed."""
    items = poisson(150, rate, prompt_median=1024, output_median=64, max_prompt=4096, max_output=256, seed=1)
    slo = SLO(ttft=0.5)
    summary = {}
    for shed in (False, True):
        e = sim(max_num_seqs=64, num_blocks=6000, ttft_slo=0.5 if shed else None)
        submit(e, items)
        outs = run_checked(e) if shed else {o.request_id: o for o in e.run()}
        summary[shed] = summarize(e.finished, slo=slo)
        rejected = [o for o in outs.values() if o.outputs[0].finish_reason == "rejected"]
        assert all(o.outputs[0].stop_reason.startswith("shed: predicted TTFT") for o in rejected)
        assert bool(rejected) == (shed and sheds)
    if sheds:
        goodput = (summary[True].goodput, summary[False].goodput)
        assert goodput[0] > 2 * goodput[1], goodput
        assert summary[True].slo_attainment > 0.8
    else:
        assert summary[True].goodput == summary[False].goodput


# ---- nothing is ever lost ----------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["fcfs", "priority", "fair"]),
       max_waiting=st.sampled_from([None, 0, 2, 8]), max_queue_time=st.sampled_from([None, 0.05, 0.5]),
       promote=st.booleans(), ttft_slo=st.sampled_from([None, 0.1, 1.0]), caching=st.booleans(),
       num_blocks=st.sampled_from([24, 60, 400]), aborts=st.integers(0, 4))
def test_every_request_ends_once_with_a_reason(seed, policy, max_waiting, max_queue_time, promote, ttft_slo,
                                               caching, num_blocks, aborts):
    rng = random.Random(seed)
    priority = policy == "priority"
    e = sim(policy=policy, priority_preemption=priority and rng.random() < 0.5,
            max_num_seqs=rng.choice([2, 4, 8]), max_waiting=max_waiting, max_queue_time=max_queue_time,
            ttft_slo=ttft_slo, enable_prefix_caching=caching, num_blocks=num_blocks, block_size=16,
            queue_timeout_action="promote" if promote and priority else "finish", tenant_weights={"t0": 2.0})
    prefix = [7] * rng.choice([0, 16, 40])
    n = rng.randrange(5, 30)
    max_tokens = {}
    for i in range(n):
        prompt = prefix + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 120))]
        rid = f"q{i}"
        max_tokens[rid] = rng.randrange(1, 80)
        e.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens[rid], ignore_eos=True),
                      priority=rng.randrange(3), tenant=rng.choice(["t0", "t1", None]),
                      arrival_time=rng.random() * 0.5)
    ids = list(max_tokens)
    victims = rng.sample(ids, aborts)

    def maybe_abort() -> None:
        if victims and rng.random() < 0.2:
            e.abort_request(victims.pop())

    final = run_checked(e, max_steps=20_000, before_step=maybe_abort)  # also: no block leaked
    assert sorted(final) == sorted(ids), "a request was lost"
    for out in final.values():
        c = out.outputs[0]
        assert c.finish_reason in FINISH_REASONS
        if c.finish_reason in ("rejected", "timeout"):
            assert isinstance(c.stop_reason, str) and c.stop_reason, f"{out.request_id}: no reason given"
            assert not c.token_ids
        if c.finish_reason == "length":
            assert len(c.token_ids) == max_tokens[out.request_id]
