"""Chapter 10: goodput's test of one request (E10.1) and a decode step on a simulated H100 (E10.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import sim_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.metrics import SLO, summarize
from minfer.request import Request, SamplingParams
from minfer.sim import get_hardware
from minfer.types import FinishReason


def finished(reason: FinishReason | None, ttft: float | None = 0.5, gaps: tuple[float, ...] = (0.05, 0.05),
             e2e: float | None = 1.0) -> Request:
    """A request that arrived at t=10, got its first token ``ttft`` later, then one token per gap."""
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=8), arrival_time=10.0)
    m = req.metrics
    if ttft is not None:
        m.first_token_time = 10.0 + ttft
        m.token_times = [m.first_token_time]
        for g in gaps:
            m.token_times.append(m.token_times[-1] + g)
    m.finished_time = None if e2e is None else 10.0 + e2e
    req.finish_reason = reason
    return req


def verdict(slo: SLO, req: Request, want: bool, what: str) -> None:
    got = slo.met_by(req)
    assert got is want, f"{what}: met_by returned {got!r}, expected {want}"


def check_slo(t: Tester) -> None:
    with t.case("served requests that meet every target count; each target missed alone does not",
                hint="compare ttft, tpot and e2e with their targets; a target of None means no target"):
        slo = SLO(ttft=1.0, tpot=0.1, e2e=2.0)
        verdict(slo, finished("length"), True, "ttft 0.5 <= 1, tpot 0.05 <= 0.1, e2e 1 <= 2")
        verdict(slo, finished("stop", ttft=1.5, e2e=1.6), False, "ttft 1.5 > 1")
        verdict(slo, finished("stop", gaps=(0.3, 0.1)), False, "tpot 0.2 > 0.1")
        verdict(slo, finished("stop", e2e=2.5), False, "e2e 2.5 > 2")
        verdict(SLO(), finished("stop", ttft=50, e2e=60), True, "no targets at all")

    with t.case("a target met exactly counts (<=, not <)", hint="an SLO is a bound the request may touch"):
        verdict(SLO(ttft=0.5, e2e=1.0), finished("length", ttft=0.5, e2e=1.0), True, "ttft and e2e exactly at target")
        verdict(SLO(tpot=0.25), finished("length", gaps=(0.25, 0.25)), True, "tpot exactly at target")

    with t.case("requests that were not served never count: rejected, timeout, abort, error, unfinished",
                hint="only finish reasons 'stop' and 'length' are served requests; a refused request has no TTFT "
                     "but is certainly not a success"):
        for reason in ("rejected", "timeout", "abort", "error", None):
            verdict(SLO(), finished(reason), False, f"finish reason {reason!r} with no targets")
        verdict(SLO(ttft=1.0), finished("rejected", ttft=None, gaps=(), e2e=0.0), False, "a rejected request")

    with t.case("a one-token answer has no TPOT: it cannot miss a TPOT target",
                hint="metrics.tpot is None with fewer than two tokens"):
        verdict(SLO(tpot=0.01), finished("length", gaps=()), True, "one token, tpot target 0.01")
        verdict(SLO(ttft=1.0), finished("stop", ttft=None, gaps=()), False, "served but no first token recorded")

    with t.case("goodput over a mixed set: summarize() counts exactly the requests that met the SLO",
                hint="summarize calls met_by for each served request"):
        reqs = [finished("length"), finished("stop", ttft=3.0, e2e=3.5), finished("rejected", ttft=None, gaps=()),
                finished("length", gaps=()), finished("stop", gaps=(0.5,))]
        for i, r in enumerate(reqs):
            r.request_id = f"r{i}"
        s = summarize(reqs, slo=SLO(ttft=1.0, tpot=0.1), duration=10.0)
        assert abs((s.goodput or 0) - 0.2) < 1e-9 and abs((s.slo_attainment or 0) - 0.4) < 1e-9, (
            f"goodput {s.goodput} req/s and attainment {s.slo_attainment}: expected 0.2 (2 good in 10 s) and 0.4")


def measure_h100_decode() -> Measurement:
    engine = sim_engine(model="llama-3-8b", hardware="H100-SXM")
    engine.add_request("r", list(range(1, 1024)), SamplingParams(max_tokens=3, ignore_eos=True))
    engine.run()
    decode = next(t for t in engine.trace if t.num_decode_tokens)  # 1,023 prompt tokens + the first answer token
    assert decode.num_decode_tokens == 1 and decode.num_prefill_tokens == 0
    ms = decode.duration * 1e3
    hw = get_hardware("H100-SXM")  # the spec the simulator priced the step with
    peak = 16.06e9 / hw.memory_bandwidth * 1e3  # 8.03 billion parameters x 2 bytes, at the datasheet bandwidth
    share = getattr(hw, "bandwidth_efficiency", 1.0)  # the share of it the spec says is reached in practice
    return Measurement(
        ms, "ms", rel_tol=0.3,
        explain=f"The simulated step took {ms:.2f} ms. At batch 1 a decode step is memory-bound: it reads every "
                f"weight once -- 8 billion parameters x 2 bytes = 16 GB -- which at the H100's datasheet "
                f"{hw.memory_bandwidth / 1e12:.2f} TB/s takes {peak:.1f} ms"
                + (f", {peak / share:.1f} ms at the {share:.0%} of it a real kernel reaches" if share < 1 else "")
                + "; then the K/V of 1,024 tokens (128 MB) and a fixed per-step overhead for launches and "
                "sampling. The 2 x 8 GFLOPs of arithmetic take 0.02 ms at 989 TFLOP/s: a guess from FLOPs is 200x "
                "too low.")
