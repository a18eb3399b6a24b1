"""Chapter 10: goodput's test of one request (E10.1), a decode step on a simulated H100 (E10.2) and the attention
terms of the cost model (E10.4)."""

from __future__ import annotations

import numpy as np

from minfer.exercises.checks.common import sim_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.metrics import SLO, summarize
from minfer.request import Request, SamplingParams
from minfer.sim import get_hardware
from minfer.sim.cost import RooflineCost, StepShape, roofline_terms
from minfer.sim.models import get_model_spec
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


# ---- E10.4: the attention terms of the cost model ------------------------------------------------------------
LLAMA_PAIR_FLOPS = 4 * 32 * 32 * 128  # Llama-3-8B: 4 FLOPs x 32 layers x 32 query heads x head_dim 128
LLAMA_KV_BYTES = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x head_dim 128 x 2 bytes (bfloat16)


def terms(shape: StepShape, model: str = "llama-3-8b", dtype: str = "bfloat16") -> list[tuple[float, float]]:
    return roofline_terms(get_model_spec(model), dtype, shape)


def check_attention_terms(t: Tester) -> None:
    with t.case("one decode token at context 1,024 (Llama-3-8B, bfloat16): 4 x layers x query heads x head_dim "
                "FLOPs per key; it reads 1,024 tokens' K/V and writes its own",
                hint="FLOPs count every query head (num_heads), bytes every KV head (kv is per token already); "
                     "the new token's K/V is written: + num_decode_tokens"):
        shape = StepShape()
        shape.add(1023, 1, is_decode=True, samples=True)  # token 1,023 (the 1,024th) against keys 0..1,023
        _, prefill, decode = terms(shape)
        assert prefill == (0, 0), f"no prefill tokens, but the prefill term is {prefill}"
        assert decode[0] == LLAMA_PAIR_FLOPS * 1024, f"decode FLOPs {decode[0]:,}, expected {LLAMA_PAIR_FLOPS * 1024:,}"
        assert decode[1] == LLAMA_KV_BYTES * 1025, f"decode bytes {decode[1]:,}, expected {LLAMA_KV_BYTES * 1025:,} " \
                                                   "(1,024 keys read, 1 token's K/V written)"

    with t.case("a prefill chunk: FLOPs per (query, key) pair, bytes for the context read once and the chunk written",
                hint="prefill FLOPs use prefill_pairs (quadratic), bytes use prefill_context + num_prefill_tokens"):
        shape = StepShape()
        shape.add(256, 128, is_decode=False, samples=False)  # tokens 256..383 of a request, after 256 computed
        pairs = 128 * 256 + 128 * 129 // 2
        _, prefill, decode = terms(shape)
        assert decode == (0, 0), f"no decode tokens, but the decode term is {decode}"
        want = LLAMA_PAIR_FLOPS * pairs
        assert prefill[0] == want, f"prefill FLOPs {prefill[0]:,}, expected {want:,}"
        assert prefill[1] == LLAMA_KV_BYTES * (384 + 128), (
            f"prefill bytes {prefill[1]:,}, expected {LLAMA_KV_BYTES * 512:,}: the chunk reads its context of 384 "
            "tokens once and writes its 128 new tokens' K/V")

    with t.case("another model (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64), a mixed step",
                hint="take the shapes from model.config (num_layers, num_heads, head_dim), not Llama's numbers"):
        shape = StepShape()
        for start in (40, 90, 7):
            shape.add(start, 1, is_decode=True, samples=True)
        shape.add(0, 32, is_decode=False, samples=True)
        _, prefill, decode = terms(shape, "smollm2-135m")
        per_pair, kv = 4 * 30 * 9 * 64, 2 * 30 * 3 * 64 * 2
        assert decode == (per_pair * (41 + 91 + 8), kv * (41 + 91 + 8 + 3)), f"decode term {decode}"
        assert prefill == (per_pair * 32 * 33 // 2, kv * (32 + 32)), f"prefill term {prefill}"

    with t.case("vectorized: step_times of 50 stacked steps equal each step priced alone",
                hint="use only arithmetic on the shape's fields (no int(), no Python max/if): they may be arrays"):
        cost = RooflineCost(get_model_spec("llama-3-8b"), get_hardware("H100-SXM"), "bfloat16")
        shapes = []
        for i in range(50):
            s = StepShape()
            for r in range(i % 7 + 1):
                s.add(100 * r + i, 1, is_decode=True, samples=True)
            if i % 3 == 0:
                s.add(i, 64 + i, is_decode=False, samples=True)
            shapes.append(s)
        together = cost.step_times(shapes)
        alone = np.array([cost.step_time(s) for s in shapes])
        assert np.allclose(together, alone, rtol=1e-9), "stacked and single steps are priced differently"
        assert (alone > 0).all()

    with t.case("the simulator: a decode step's time grows with its batch's total context, a prefill's faster than "
                "linearly with its length",
                hint="decode attention reads every context token's K/V; prefill computes every (query, key) pair"):
        cost = RooflineCost(get_model_spec("llama-3-8b"), get_hardware("H100-SXM"), "bfloat16")

        def decode_batch(context: int) -> float:
            s = StepShape()
            for _ in range(32):
                s.add(context - 1, 1, is_decode=True, samples=True)
            return cost.parts(s)["decode_attention"]

        def prefill_chunk(n: int) -> float:
            s = StepShape()
            s.add(0, n, is_decode=False, samples=True)
            return cost.parts(s)["prefill_attention"]

        assert 3.5 < decode_batch(8192) / decode_batch(2048) < 4.5, "decode attention at 4x the context: ~4x the time"
        assert prefill_chunk(8192) / prefill_chunk(2048) > 8, "prefill attention at 4x the length: over 8x the time"
