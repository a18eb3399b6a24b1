"""Disaggregated prefill and decode in the simulator (``minfer.disagg``): the link's price, the handoff, the clock.

Each test runs a few simulated H100s on a small workload: seconds. The sweep in docs/simulator.md is
``python -m minfer.disagg``.
"""

from __future__ import annotations

import math

import pytest

from minfer import EngineConfig, LLMEngine
from minfer.disagg import (
    LINKS,
    Cluster,
    Link,
    decode_instance,
    kv_transfer_bytes,
    run_colocated,
    run_disaggregated,
    sweep,
)
from minfer.metrics import SLO
from minfer.request import Request, SamplingParams
from minfer.sim import get_model_spec
from minfer.workload import SIM_VOCAB_SIZE, WorkItem, poisson, token_prompts

INSTANT = Link("instant", math.inf, 0.0)
SMALL = dict(prompt_median=512, output_median=16, max_prompt=2048, max_output=64)


def times(requests: list[Request]) -> list[tuple]:
    return [(r.request_id, r.metrics.arrival_time, r.metrics.first_token_time, tuple(r.metrics.token_times),
             r.metrics.finished_time) for r in requests]


def test_kv_bytes_are_layers_x_2_x_kv_heads_x_head_dim_x_dtype_bytes():
    c = get_model_spec("llama-3-8b").config
    per_token = c.num_layers * 2 * c.num_kv_heads * c.head_dim * 2
    assert kv_transfer_bytes("llama-3-8b", "bfloat16", 1000) == 1000 * per_token
    assert kv_transfer_bytes("llama-3-8b", "bfloat16", 1000) == 1000 * 32 * 2 * 8 * 128 * 2  # 128 KiB a token


def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    link = Link("test", bandwidth=2e9, latency=0.003)
    run = run_disaggregated([WorkItem(0.0, 1000, 4)], 1, 1, link)
    expected = 0.003 + 1000 * 32 * 2 * 8 * 128 * 2 / 2e9  # 65.5 ms for 1,000 tokens of llama-3-8b at 2 GB/s
    assert run.transfer_times["r0"] == pytest.approx(expected, rel=1e-12)
    assert LINKS["RDMA-400G"].transfer_time(50e9) == pytest.approx(1 + 5e-6)  # 400 Gb/s = 50 GB/s


def test_every_token_is_produced_one_at_prefill_the_rest_at_decode():
    items = poisson(30, 8.0, seed=1, **SMALL)
    for run in (run_disaggregated(items, 1, 2, "RDMA-400G"), run_colocated(items, 3)):
        assert [r.num_output_tokens for r in run.requests] == [w.output_len for w in items]
        assert [len(r.metrics.token_times) for r in run.requests] == [w.output_len for w in items]
        assert all(r.finish_reason == "length" for r in run.requests)
        assert all(r.metrics.arrival_time == pytest.approx(w.arrival_time) for r, w in zip(run.requests, items))
    split = run_disaggregated(items, 1, 2, "RDMA-400G")
    assert set(split.transfer_times) == {r.request_id for r in split.requests}  # every one crossed the link once


def test_the_decode_instance_does_not_prefill_again():
    """Alone on its instances, a request's decode phase takes what a colocated engine's does: its first decode step
    prices one token, not the prompt again (a re-prefill of 2,000 tokens would add ~50 ms to 15 steps of ~7 ms)."""
    items = [WorkItem(0.0, 2000, 16)]
    split, colocated = run_disaggregated(items, 1, 1, INSTANT).requests[0], run_colocated(items, 2).requests[0]
    decode_split = split.metrics.finished_time - split.metrics.first_token_time
    decode_colocated = colocated.metrics.finished_time - colocated.metrics.first_token_time
    assert decode_split == pytest.approx(decode_colocated, rel=0.03)


def test_an_instant_link_gives_a_prefill_only_engines_ttft():
    """1 prefill + 1 decode over an instant link: each request's TTFT is what an engine that only prefills gives."""
    items = poisson(40, 12.0, seed=2, **SMALL)
    split = run_disaggregated(items, 1, 1, INSTANT)
    alone = LLMEngine(EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM"))
    for i, (w, prompt) in enumerate(zip(items, token_prompts(items, SIM_VOCAB_SIZE, 0))):
        alone.add_request(f"r{i}", prompt, SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0),
                          arrival_time=w.arrival_time)
    alone.run()
    ttft = {r.request_id: r.metrics.ttft for r in alone.finished}
    assert [r.metrics.ttft for r in split.requests] == [ttft[r.request_id] for r in split.requests]


def test_a_slow_link_raises_ttft_by_the_priced_transfer():
    items = poisson(40, 12.0, seed=3, **SMALL)
    fast = run_disaggregated(items, 1, 1, INSTANT)
    slow = run_disaggregated(items, 1, 1, "Ethernet-10G")
    link = LINKS["Ethernet-10G"]
    for f, s, w in zip(fast.requests, slow.requests, items):
        priced = link.transfer_time(kv_transfer_bytes("llama-3-8b", "bfloat16", w.prompt_len))
        assert slow.transfer_times[s.request_id] == pytest.approx(priced, rel=1e-12)
        assert s.metrics.ttft - f.metrics.ttft == pytest.approx(priced, rel=1e-9)
    assert max(slow.transfer_times.values()) > 0.1  # long prompts over 10 Gb/s: a tenth of a second and more


def test_runs_are_deterministic():
    items = poisson(30, 10.0, seed=4, **SMALL)
    assert times(run_disaggregated(items, 2, 1).requests) == times(run_disaggregated(items, 2, 1).requests)
    assert times(run_colocated(items, 3).requests) == times(run_colocated(items, 3).requests)


def test_the_cluster_lets_go_of_what_it_handed_on():
    """Every copy kept alive costs at scale (the live requests spread over more memory; 100,000 requests on 4 + 4
    instances ran a fifth slower with them): once a request has landed, its prefill instance holds nothing of it, and
    no instance keeps a finished request the cluster has read -- while the caller's prompts stay as they were."""
    items = poisson(20, 8.0, seed=5, **SMALL)
    prompts = token_prompts(items, SIM_VOCAB_SIZE, 0)
    given = [list(p) for p in prompts]
    config = EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM", finished_window=None,
                          record_trace=False)
    front = [LLMEngine(config)]
    back = [decode_instance("llama-3-8b", "H100-SXM", {})]
    cluster = Cluster(front, back, INSTANT, kv_transfer_bytes("llama-3-8b", "bfloat16", 1))
    cluster.run(items, prompts)
    assert len(cluster.done) == len(items)
    assert [cluster.done[f"r{i}"].num_output_tokens for i in range(len(items))] == [w.output_len for w in items]
    assert [e.finished for e in cluster.engines] == [[], []]
    assert prompts == given


def test_requests_go_to_the_least_loaded_instance():
    """Two colocated instances, two requests at once: one each, so the second does not queue behind the first."""
    items = [WorkItem(0.0, 1500, 8), WorkItem(0.0, 1500, 8)]
    a, b = run_colocated(items, 2).requests
    assert a.metrics.ttft == b.metrics.ttft


def test_a_request_arriving_as_a_step_starts_joins_that_step():
    """Ties on the clock go to arrivals: a request that arrives at the very time an instance starts a step is in it."""
    first = run_colocated([WorkItem(0.0, 1000, 3)], 1).requests[0]
    step_start = first.metrics.first_token_time  # the first request's second step starts as its first ends
    second = run_colocated([WorkItem(0.0, 1000, 3), WorkItem(step_start, 100, 3)], 1).requests[1]
    assert second.metrics.first_scheduled_time == step_start


def test_sweep_split_keeps_tpot_tight_and_loses_on_a_slow_link():
    """The sweep is deterministic; split, no prompt chunk ever lands in a decode step (a tighter TPOT tail), and over
    10 Gb/s Ethernet the transfers eat the TTFT budget: it serves fewer requests within SLO than colocated."""
    slo = SLO(ttft=0.25, tpot=0.011)
    kw = dict(num_requests=80, slo=slo, seed=0)
    fast = sweep([16.0], link="RDMA-400G", **kw)
    assert fast == sweep([16.0], link="RDMA-400G", **kw)
    colocated, split = fast
    assert colocated.layout == "2 colocated" and split.layout.startswith("1P+1D")
    assert split.tpot_p99 < colocated.tpot_p99  # no prefill chunk ever shares a decode step
    slow_colocated, slow_split = sweep([16.0], link="Ethernet-10G", **kw)
    assert slow_colocated == colocated
    assert slow_split.ttft_p50 > split.ttft_p50 + 0.1
    assert slow_split.goodput < slow_colocated.goodput


def test_a_request_landed_ahead_of_the_decode_clock_keeps_the_invariants():
    """A decode instance whose clock is behind the landing time holds the request as pending, with its K/V in the
    landing pool: the scheduler's invariants count it as swapped out, not as lost host blocks."""
    from minfer.disagg import decode_instance, land

    prefill = LLMEngine(EngineConfig(executor="sim", model="llama-3-8b", hardware="H100-SXM"))
    prefill.add_request("p", list(range(1, 300)), SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0))
    (done,) = [o for o in prefill.run()]
    prefilled = prefill.finished[0]
    assert done.request_id == "p"
    decode = decode_instance("llama-3-8b", "H100-SXM", {})
    land(decode, prefilled, at=5.0, max_tokens=4)  # the decode instance's clock is still at 0
    assert decode.scheduler.num_pending == 1 and "p" in decode.host_pool
    decode.scheduler.check_invariants()
    while decode.has_unfinished_requests():
        decode.step()
        decode.scheduler.check_invariants()
    assert decode.finished[0].num_output_tokens == 4
