"""Chapter 15: landing a prefilled request on a decode instance (E15.1) and a long prompt's handoff time (E15.2)."""

from __future__ import annotations

import math

from minfer.disagg import LINKS, Link, decode_instance, kv_transfer_bytes, land, run_disaggregated
from minfer.exercises.checks.common import greedy, sim_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.request import Request
from minfer.workload import poisson

MODEL, GPU = "llama-3-8b", "H100-SXM"
INSTANT = Link("instant", math.inf, 0.0)


def prompt(n: int, seed: int = 0) -> list[int]:
    return [1 + (7 * i + 13 * seed) % 5000 for i in range(n)]


def known(t: float | None) -> float:
    """A timestamp the case has made sure of (a finished request's times are all set)."""
    assert t is not None, "a finished request is missing a timestamp"
    return t


def prefilled(rid: str, num_prompt: int, arrival: float, priority: int = 0, tenant: str | None = None) -> Request:
    """What a prefill instance hands over: ``rid`` run alone on a simulated H100 with ``max_tokens=1`` (its prompt's
    K/V computed, its first token sampled), as ``run_disaggregated`` runs it."""
    engine = sim_engine(finished_window=None)
    engine.add_request(rid, prompt(num_prompt, seed=len(rid)), greedy(1), priority, tenant, arrival_time=arrival)
    engine.run()
    (req,) = engine.finished
    assert req.num_output_tokens == 1 and req.metrics.first_token_time is not None
    return req


def check_land(t: Tester) -> None:
    with t.case("one prefilled request lands: the same prompt, priority and tenant, its first token, its prompt's "
                "K/V counted computed and waiting in the landing pool, its clock kept from the prefill instance",
                hint="add_request(rid, prompt, params with max_tokens, priority, tenant, arrival_time=at); "
                     "append_token(the prefill's first token); engine.host_pool.allocate(rid, prompt tokens) and "
                     "num_computed_tokens = prompt tokens; then the metrics: arrival and first-scheduled times from "
                     "the prefill, first_token_time = at, token_times = [at]"):
        before = prefilled("a", 1000, arrival=0.25, priority=2, tenant="bob")
        engine = decode_instance(MODEL, GPU, {"finished_window": None})
        at = known(before.metrics.first_token_time) + 0.003
        req = land(engine, before, at, 16)
        assert isinstance(req, Request), f"land returned {type(req).__name__}, not the Request it added"
        assert engine.num_unfinished_requests == 1, (
            f"the decode instance holds {engine.num_unfinished_requests} unfinished requests after one landed")
        assert req.request_id == "a" and req.prompt_token_ids == before.prompt_token_ids, (
            "the landed request must keep its id and its prompt")
        assert (req.priority, req.tenant) == (2, "bob"), (
            f"priority and tenant {(req.priority, req.tenant)}, the request came with (2, 'bob')")
        assert req.params.max_tokens == 16, (
            f"max_tokens is {req.params.max_tokens}: the prefill ran it with 1; the decode instance makes 16 in all")
        assert req.output_token_ids == before.output_token_ids, (
            f"output {req.output_token_ids}: it must start with the first token the prefill instance sampled, "
            f"{before.output_token_ids}")
        assert req.num_computed_tokens == 1000, (
            f"num_computed_tokens is {req.num_computed_tokens}: the prompt's 1000 tokens of K/V came over the link, "
            "so they count as computed (or the decode instance prefills them again)")
        assert "a" in engine.host_pool and engine.host_pool.num_tokens["a"] == 1000, (
            "the prompt's K/V must wait in the landing pool, engine.host_pool, for all 1000 tokens: that is what the "
            "scheduler copies into device blocks when it admits the request")
        m, pm = req.metrics, before.metrics
        assert m.arrival_time == pm.arrival_time == 0.25, (
            f"arrival_time {m.arrival_time}: the request arrived at the prefill instance at 0.25 (TTFT counts from "
            "there)")
        assert m.first_scheduled_time == pm.first_scheduled_time, (
            f"first_scheduled_time {m.first_scheduled_time}: it was first scheduled at the prefill instance, at "
            f"{pm.first_scheduled_time}")
        assert m.first_token_time == at, (
            f"first_token_time {m.first_token_time}: the user sees the first token when it lands, at {at} (it "
            f"was sampled at {pm.first_token_time}; the transfer is part of TTFT)")
        assert m.token_times == [at], f"token_times {m.token_times}: one token so far, seen at {at}"

    with t.case("the decode instance runs it to the end without computing the prompt again",
                hint="a request whose K/V are in engine.host_pool and counted in num_computed_tokens is admitted as "
                     "swapped in (E6.4): only its last token is computed. Count the prompt computed AND put it in "
                     "the landing pool"):
        t.run(engine)
        (done,) = engine.finished
        assert done.output_token_ids[0] == before.output_token_ids[0] and done.num_output_tokens == 16, (
            f"{done.num_output_tokens} tokens, the first {done.output_token_ids[0]}: expected 16, the first "
            f"{before.output_token_ids[0]}")
        assert len(done.metrics.token_times) == 16 and done.metrics.token_times[0] == at, (
            f"{len(done.metrics.token_times)} token times starting at {done.metrics.token_times[:1]}: expected 16, "
            f"the first at {at}")
        assert not engine.host_pool.tables, "the landing pool still holds K/V after the request finished"
        alone = sim_engine()  # the same request decoding on a colocated engine: its decode phase, from first token on
        alone.add_request("a", list(before.prompt_token_ids), greedy(16))
        (whole,) = alone.run()
        colocated = known(whole.metrics.finished_time) - known(whole.metrics.first_token_time)
        decode = known(done.metrics.finished_time) - at
        assert math.isclose(decode, colocated, rel_tol=0.03), (
            f"15 tokens after the first took {decode * 1e3:.1f} ms on the decode instance, {colocated * 1e3:.1f} ms "
            "on an engine that had just prefilled it: the decode instance computed the prompt again")

    with t.case("six requests land on a small decode pool (room for two at a time): they queue, are admitted as "
                "swapped in, some are preempted and recomputed, and every one finishes with its tokens and times",
                hint="land only adds the request and fills its landing state: the scheduler does the rest under the "
                     "pool's own rules (check_invariants runs after every step)"):
        engine = decode_instance(MODEL, GPU, {"finished_window": None, "num_blocks": 48, "block_size": 16})
        handed = [prefilled(f"r{i}", 370 + 10 * i, arrival=0.01 * i) for i in range(6)]
        at = max(known(r.metrics.first_token_time) for r in handed) + 0.002  # all six land at once
        lands = {r.request_id: (r, at) for r in handed}
        for r in handed:
            land(engine, r, at, 24)
        t.run(engine)
        assert sorted(r.request_id for r in engine.finished) == sorted(lands), "not every landed request finished"
        for req in engine.finished:
            before, at = lands[req.request_id]
            assert req.num_output_tokens == 24 and req.output_token_ids[0] == before.output_token_ids[0], (
                f"{req.request_id}: {req.num_output_tokens} tokens, the first {req.output_token_ids[0]}; expected 24, "
                f"the first {before.output_token_ids[0]}")
            assert math.isclose(known(req.metrics.ttft), at - before.metrics.arrival_time, abs_tol=1e-12), (
                f"{req.request_id}: TTFT {req.metrics.ttft}, expected from its arrival at the prefill instance to its "
                f"landing: {at - before.metrics.arrival_time}")
            assert len(req.metrics.token_times) == 24, f"{req.request_id}: {len(req.metrics.token_times)} token times"
        assert not engine.host_pool.tables, "the landing pool still holds K/V after every request finished"
        assert any(r.metrics.num_preemptions for r in engine.finished), (
            "no request was preempted: the case meant to exercise preemption on the decode instance did not")

    with t.case("a whole split run: every token is made (one at prefill, the rest at decode) and a slow link raises "
                "each TTFT by exactly its priced transfer",
                hint="first_token_time is the landing time `at`, arrival_time the prefill's"):
        items = poisson(30, 12.0, 512, 16, max_prompt=2048, max_output=64, seed=5)
        fast = run_disaggregated(items, 1, 2, INSTANT)
        slow = run_disaggregated(items, 1, 2, "Ethernet-10G")
        for f, s, w in zip(fast.requests, slow.requests, items):
            assert s.num_output_tokens == w.output_len == len(s.metrics.token_times), (
                f"{s.request_id}: {s.num_output_tokens} tokens and {len(s.metrics.token_times)} token times, asked "
                f"for {w.output_len}")
            priced = LINKS["Ethernet-10G"].transfer_time(kv_transfer_bytes(MODEL, "bfloat16", w.prompt_len))
            raised = known(s.metrics.ttft) - known(f.metrics.ttft)
            assert math.isclose(raised, priced, rel_tol=1e-9), (
                f"{s.request_id}: the slow link raised TTFT by {raised * 1e3:.2f} ms, "
                f"its transfer costs {priced * 1e3:.2f} ms")


def measure_handoff_ms() -> Measurement:
    link = LINKS["RDMA-400G"]
    num_bytes = kv_transfer_bytes("llama-3-70b", "bfloat16", 4096)
    ms = link.transfer_time(num_bytes) * 1e3
    per_token = num_bytes // 4096
    nvlink, ethernet = (LINKS[name].transfer_time(num_bytes) for name in ("NVLink-4", "Ethernet-10G"))
    return Measurement(
        ms, "ms", rel_tol=0.1,
        explain=f"Each token's K/V is layers x 2 (K and V) x KV heads x head dim x 2 bytes = 80 x 2 x 8 x 128 x 2 = "
                f"{per_token:,} bytes (320 KiB), so 4,096 tokens are {num_bytes / 1e9:.2f} GB. At 50 GB/s (400 Gb/s "
                f"over 8 bits a byte) that is {num_bytes / link.bandwidth * 1e3:.2f} ms, plus the link's 5 us of "
                f"latency: {ms:.2f} ms. Llama-3-70B has 8 KV heads (grouped-query attention) for its 64 query heads: "
                f"with one KV head per query head the K/V would be 8 times larger ({8 * ms:.0f} ms). {ms / 2:.1f} ms "
                f"forgets that K and V are two tensors; {ms / 8:.1f} ms reads 400 Gb/s as 400 GB/s (a link's speed is "
                f"in bits). Over NVLink (450 GB/s) the same K/V take {nvlink * 1e3:.1f} ms, over 10 Gb/s Ethernet "
                f"{ethernet:.2f} s.")
