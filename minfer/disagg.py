"""Disaggregated prefill and decode, simulated: N prefill instances, M decode instances, a priced KV transfer.

A colocated engine runs every request's prefill and its decodes on the same GPU, in the same steps: a long prompt's
chunk lands in a step of decodes and every running request's next token waits for it (TPOT suffers), and the decodes
take budget that a waiting prompt could use (TTFT suffers). DistServe (Zhong et al., OSDI 2024) and Splitwise
(Patel et al., ISCA 2024) split the two phases onto different GPUs: a *prefill instance* runs the prompt and samples
the first token, the request's K/V move over a link to a *decode instance*, which generates the rest. Each phase then
runs alone, at its own batch size -- at the price of the transfer, and of GPUs that one phase may leave idle.

Here every instance is a whole simulated ``LLMEngine`` (its own scheduler, its own KV pool), and one clock drives
them all, event by event: the earliest of (a request arrives, a handoff lands, an instance starts its next step)
happens first; ties go to arrivals and handoffs, so a step that starts at ``t`` sees what arrived at ``t``.

* **Prefill**: a request goes to the least loaded prefill instance (fewest unfinished requests; ties: the lowest
  index) with ``max_tokens=1``, as vLLM's disaggregated prefill runs it: the first token comes from there.
* **Transfer**: its prompt's K/V -- ``prompt tokens x layers x 2 x kv_heads x head_dim x dtype bytes`` -- cross the
  ``Link`` in ``latency + bytes / bandwidth`` seconds, starting when the prefill step ends. The first token travels
  with them: the user sees it when the decode instance has the request (vLLM's proxy streams the answer from the
  decode instance), so the transfer is part of TTFT.
* **Decode**: the request joins the least loaded decode instance holding its prompt's K/V and its first token, and
  generates the rest. The decode instance admits it as it admits a request coming back from swap preemption -- its
  K/V exist elsewhere; blocks are taken at admission, under the pool's own rules, and filled by a copy. That copy is
  the transfer already priced on the link, so the decode instance's own host link is made infinitely fast (free),
  and its own preemptions recompute (they never use that link). What is not modelled: the decode instance's memory
  is not reserved while the K/V are in flight, and transfers do not contend for the link.

The colocated baseline runs the same workload on ``N + M`` ordinary instances, each doing both phases, requests
spread to the least loaded. Both give back each request's ``Request`` with its timestamps on the shared clock --
arrival, first token, every token after -- so ``minfer.metrics.summarize`` measures TTFT, TPOT and goodput under
SLOs with the very code that measures one engine.

    python -m minfer.disagg            # goodput against rate: colocated vs split, and where splitting loses
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from minfer.config import EngineConfig
from minfer.engine import LLMEngine
from minfer.kv.host_pool import HostBlockPool
from minfer.metrics import SLO, Summary, summarize
from minfer.request import Request, SamplingParams
from minfer.sim.hardware import get_hardware
from minfer.sim.models import ModelSpec, get_model_spec
from minfer.workload import SIM_VOCAB_SIZE, WorkItem, poisson, token_prompts

GB = 1e9


@dataclass(frozen=True, slots=True)
class Link:
    """The wire between a prefill and a decode instance: one direction's bandwidth (bytes/s) and a fixed latency (s)
    per transfer. Presets carry nominal peaks; a real transfer reaches less of them."""

    name: str
    bandwidth: float  # bytes/s, one direction
    latency: float  # seconds before the first byte arrives

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds to move ``num_bytes``: the latency, then the bytes at the link's bandwidth."""
        return self.latency + num_bytes / self.bandwidth


LINKS: dict[str, Link] = {link.name: link for link in [
    Link("NVLink-4", 450 * GB, 2e-6),  # H100 NVLink 4: 900 GB/s both ways together, 450 GB/s each way
    Link("RDMA-400G", 400 / 8 * GB, 5e-6),  # a 400 Gb/s InfiniBand / RoCE NIC per GPU, GPUDirect RDMA
    Link("PCIe-5", 64 * GB, 5e-6),  # PCIe Gen5 x16: 128 GB/s both ways together, 64 GB/s each way
    Link("Ethernet-10G", 10 / 8 * GB, 50e-6),  # a slow link: 10 Gb/s through the hosts' network stacks
]}


def kv_transfer_bytes(model: str | ModelSpec, dtype: str, num_tokens: int) -> int:
    """Bytes of K/V that ``num_tokens`` prompt tokens hold: layers x 2 (K and V) x kv_heads x head_dim x dtype
    bytes, per token."""
    return num_tokens * get_model_spec(model).kv_bytes_per_token(dtype)


@dataclass(slots=True)
class ClusterRun:
    """One workload served by a set of instances: each request as it finished, in workload order."""

    layout: str
    requests: list[Request]
    transfer_times: dict[str, float]  # request id → seconds its K/V spent on the link (split layouts only)

    def summary(self, slo: SLO | None = None) -> Summary:
        return summarize(self.requests, slo)


def _when_next_step(engine: LLMEngine) -> float:
    """When ``engine`` starts its next step: now if it has work, else at its next arrival, else never (inf)."""
    sched = engine.scheduler
    if sched.running or sched.num_waiting:
        return engine.now
    t = sched.next_arrival_time()
    return math.inf if t is None else max(engine.now, t)


def _least_loaded(engines: Sequence[LLMEngine]) -> LLMEngine:
    return min(engines, key=lambda e: e.num_unfinished_requests)  # min keeps the first of equals


def _engine_config(model: str | ModelSpec, hardware: str, options: dict[str, Any]) -> EngineConfig:
    # every finished request is kept: the cluster reads them back, and the run's metrics are computed over them
    return EngineConfig(**{**options, "model": model, "executor": "sim", "hardware": hardware,
                           "finished_window": None, "record_trace": False})


def decode_instance(model: str | ModelSpec, hardware: str, options: dict[str, Any]) -> LLMEngine:
    """An engine that admits transferred requests as swapped-in ones: a host pool to hold them until admission
    (large: it stands for K/V on the way, not for host memory), a free copy into its blocks (the link priced it),
    and preemption by recompute, so that nothing else ever crosses that free copy."""
    spec = replace(get_hardware(hardware), host_link_bandwidth=math.inf)
    config = replace(_engine_config(model, hardware, options), hardware=spec, preemption_mode="recompute")
    engine = LLMEngine(config)
    landing = HostBlockPool(2**40, config.block_size)
    engine.host_pool = engine.scheduler.host_pool = landing
    return engine


def land(engine: LLMEngine, prefilled: Request, at: float, max_tokens: int) -> Request:
    """Hand ``prefilled`` (its prompt's K/V computed, its first token sampled) to decode instance ``engine``,
    arriving at ``at``, to make ``max_tokens`` tokens in all. The decode instance must not compute the prompt again:
    the request comes in as one swapped out (its K/V wait in the landing pool, ``engine.host_pool``, and are copied
    into device blocks when the scheduler admits it). It keeps its arrival and first-scheduled times -- its clock
    started at the prefill instance -- and its first token is seen at ``at``, when it lands."""
    # BEGIN EXERCISE E15.1
    rid, num_prompt = prefilled.request_id, prefilled.num_prompt_tokens
    params = replace(prefilled.params, max_tokens=max_tokens)  # the prefill instance ran it with max_tokens=1
    req = engine.add_request(rid, prefilled.prompt_token_ids, params, prefilled.priority, prefilled.tenant,
                             arrival_time=at)
    req.append_token(prefilled.output_token_ids[0])  # the first token travelled with the K/V
    engine.host_pool.allocate(rid, num_prompt)  # the prompt's K/V, waiting to be copied into device blocks...
    req.num_computed_tokens = num_prompt  # ...so the scheduler admits it as a swapped-in request, not a new prompt
    m, pm = req.metrics, prefilled.metrics  # its clock started at the prefill instance; its first token shows now
    m.arrival_time, m.first_scheduled_time, m.first_token_time = pm.arrival_time, pm.first_scheduled_time, at
    m.token_times = [at]
    m.num_preemptions, m.num_cached_tokens = pm.num_preemptions, pm.num_cached_tokens
    return req
    # END EXERCISE


class Cluster:
    """Instances on one clock: route arrivals, step the instance whose step comes first, move finished prefills."""

    def __init__(self, front: list[LLMEngine], back: list[LLMEngine], link: Link | None,
                 kv_bytes_per_token: int) -> None:
        self.front, self.back, self.link = front, back, link  # back is empty when colocated
        self.engines = front + back
        self.kv_bytes_per_token = kv_bytes_per_token
        self.handoffs: list[tuple[float, int, Request]] = []  # (lands at, order, prefilled request)
        self.done: dict[str, Request] = {}
        self.transfer_times: dict[str, float] = {}
        self.output_len: dict[str, int] = {}
        for e in self.engines:
            e.stream_outputs = False  # the cluster reads each instance's finished requests, not its step outputs

    def run(self, items: Sequence[WorkItem], prompts: Sequence[Any]) -> None:
        arrivals = deque(sorted(((w.arrival_time, i) for i, w in enumerate(items))))
        # each prompt is let go once its request is added (the instance keeps its own copy): at 100,000 requests the
        # prompts are 40 million token ids, and every copy kept alive spreads the live requests over more memory
        prompts = list(prompts)
        engines = self.engines
        # when each instance starts its next step (inf: nothing to do); only an instance that just stepped or got a
        # request can change its own, so one list, updated there, replaces asking every instance at every event
        starts = [math.inf] * len(engines)
        while True:
            t_arrival = arrivals[0][0] if arrivals else math.inf
            t_handoff = self.handoffs[0][0] if self.handoffs else math.inf
            t_step = min(starts)
            if min(t_arrival, t_handoff, t_step) == math.inf:
                return
            if t_arrival <= min(t_handoff, t_step):
                t, i = arrivals.popleft()
                prompt, prompts[i] = prompts[i], None
                engine = self._arrive(f"r{i}", prompt, items[i], t)
            elif t_handoff <= t_step:
                at, _, prefilled = heapq.heappop(self.handoffs)
                rid = prefilled.request_id
                engine = _least_loaded(self.back)
                land(engine, prefilled, at, self.output_len[rid])
            else:
                which = starts.index(t_step)  # of instances starting at once, the first (as min over (t, i) chose)
                engine = engines[which]
                engine.step()
                self._collect(engine, is_prefill=bool(self.back) and which < len(self.front))
            starts[engines.index(engine)] = _when_next_step(engine)

    def _arrive(self, rid: str, prompt: Any, item: WorkItem, t: float) -> LLMEngine:
        self.output_len[rid] = item.output_len
        max_tokens = 1 if self.back else item.output_len
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        engine = _least_loaded(self.front)
        engine.add_request(rid, prompt, params, item.priority, item.tenant, arrival_time=t)
        return engine

    def _collect(self, engine: LLMEngine, is_prefill: bool) -> None:
        new = list(engine.finished)  # read once, then let go: a prefilled request lives on where it lands
        engine.finished.clear()
        for req in new:
            rid = req.request_id
            if not is_prefill or req.finish_reason != "length" or self.output_len[rid] == 1:
                self.done[rid] = req  # finished for good (or failed) where it is
                continue
            assert self.link is not None and req.metrics.first_token_time is not None
            seconds = self.link.transfer_time(req.num_prompt_tokens * self.kv_bytes_per_token)
            self.transfer_times[rid] = seconds
            heapq.heappush(self.handoffs, (req.metrics.first_token_time + seconds, len(self.transfer_times), req))


def _serve(items: Sequence[WorkItem], front: list[LLMEngine], back: list[LLMEngine], link: Link | None,
           layout: str, model: str | ModelSpec, seed: int) -> ClusterRun:
    dtype = front[0].executor.cost.dtype  # type: ignore[attr-defined]  # every instance is a SimExecutor
    cluster = Cluster(front, back, link, kv_transfer_bytes(model, dtype, 1))
    cluster.run(items, token_prompts(items, SIM_VOCAB_SIZE, seed))
    requests = [cluster.done[f"r{i}"] for i in range(len(items))]
    return ClusterRun(layout, requests, cluster.transfer_times)


def run_colocated(items: Sequence[WorkItem], num_instances: int, model: str | ModelSpec = "llama-3-8b",
                  hardware: str = "H100-SXM", seed: int = 0, **engine_options: Any) -> ClusterRun:
    """``items`` on ``num_instances`` instances that each run prefill and decode, requests to the least loaded."""
    engines = [LLMEngine(_engine_config(model, hardware, engine_options)) for _ in range(num_instances)]
    return _serve(items, engines, [], None, f"{num_instances} colocated", model, seed)


def run_disaggregated(items: Sequence[WorkItem], num_prefill: int, num_decode: int, link: Link | str = "RDMA-400G",
                      model: str | ModelSpec = "llama-3-8b", hardware: str = "H100-SXM", seed: int = 0,
                      **engine_options: Any) -> ClusterRun:
    """``items`` on ``num_prefill`` prefill instances and ``num_decode`` decode instances joined by ``link``."""
    link = LINKS[link] if isinstance(link, str) else link
    front = [LLMEngine(_engine_config(model, hardware, engine_options)) for _ in range(num_prefill)]
    back = [decode_instance(model, hardware, engine_options) for _ in range(num_decode)]
    return _serve(items, front, back, link, f"{num_prefill}P+{num_decode}D over {link.name}", model, seed)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One layout at one request rate."""

    rate: float  # requests/s offered
    layout: str
    goodput: float  # requests/s that met every SLO
    attainment: float  # share of requests that met every SLO
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float


def _point(rate: float, run: ClusterRun, slo: SLO) -> SweepPoint:
    s = run.summary(slo)
    assert s.goodput is not None and s.slo_attainment is not None
    return SweepPoint(rate, run.layout, s.goodput, s.slo_attainment, s.ttft.p50, s.ttft.p99, s.tpot.p50, s.tpot.p99)


def sweep(rates: Sequence[float], num_prefill: int = 1, num_decode: int = 1, link: Link | str = "RDMA-400G",
          slo: SLO | None = None, num_requests: int = 200, prompt_median: float = 1024, output_median: float = 128,
          model: str | ModelSpec = "llama-3-8b", hardware: str = "H100-SXM", seed: int = 0,
          **engine_options: Any) -> list[SweepPoint]:
    """Goodput against rate, colocated (``num_prefill + num_decode`` instances) vs split, on the same seeded
    Poisson workload at each rate: two points per rate, colocated first."""
    slo = slo or SLO(ttft=0.5, tpot=0.010)
    points = []
    for rate in rates:
        items = poisson(num_requests, rate, prompt_median, output_median, max_prompt=4 * round(prompt_median),
                        max_output=4 * round(output_median), seed=seed)
        both = (run_colocated(items, num_prefill + num_decode, model, hardware, seed, **engine_options),
                run_disaggregated(items, num_prefill, num_decode, link, model, hardware, seed, **engine_options))
        points += [_point(rate, run, slo) for run in both]
    return points


def format_sweep(points: Sequence[SweepPoint]) -> str:
    """A plain-text table, one row per rate and layout."""
    lines = [f"{'rate':>6}  {'layout':<28} {'goodput':>8} {'met SLO':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
             f"{'TPOT p50':>9} {'TPOT p99':>9}"]
    for p in points:
        lines.append(f"{p.rate:>6.1f}  {p.layout:<28} {p.goodput:>8.2f} {p.attainment:>8.0%} "
                     f"{p.ttft_p50 * 1e3:>7.0f}ms {p.ttft_p99 * 1e3:>7.0f}ms "
                     f"{p.tpot_p50 * 1e3:>7.1f}ms {p.tpot_p99 * 1e3:>7.1f}ms")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Three sweeps of llama-3-8b on simulated H100s, 2 GPUs each: 2 colocated vs 1 prefill + 1 decode -- long
    prompts over RDMA (the split's case), the same over 10 Gb/s Ethernet, short prompts over RDMA."""
    del argv
    ttft, tpot, n = 0.5, 0.010, 400
    slo = SLO(ttft=ttft, tpot=tpot)
    print(f"llama-3-8b on H100-SXM, 2 GPUs; SLO: TTFT <= {ttft * 1e3:.0f} ms, TPOT <= {tpot * 1e3:.0f} ms; "
          f"{n} Poisson requests per rate; goodput: requests within SLO / (first arrival -> last finish)\n")
    print("long prompts (median 1024 tokens, 128 out), RDMA 400 Gb/s:")
    print(format_sweep(sweep([4, 8, 12, 16, 20], slo=slo, num_requests=n)))
    print("\nthe same workload over a slow link (10 Gb/s Ethernet):")
    print(format_sweep(sweep([4, 8, 12, 16, 20], link="Ethernet-10G", slo=slo, num_requests=n)))
    print("\nshort prompts (median 64 tokens, 256 out), RDMA 400 Gb/s:")
    print(format_sweep(sweep([10, 20, 30, 40, 50], slo=slo, num_requests=n, prompt_median=64, output_median=256)))


if __name__ == "__main__":
    main(sys.argv[1:])
