"""Serving metrics from finished requests: latency percentiles, throughput, and goodput under SLOs.

Everything derives from each request's ``RequestMetrics`` timestamps (engine clock), so a real run and
a simulated one are measured by the very same code -- and the benchmark harness reuses it as is.

* TTFT: arrival → first output token (queueing + prefill).     * ITL: gap between consecutive tokens.
* TPOT: mean ITL of one request.                                 * e2e: arrival → finished.
* Goodput: requests (and their output tokens) per second that met *every* SLO given.

Speculative decoding has its own figures, from the step records (``SpecDecodeStats``): guesses verified and kept.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from minfer.request import Request
from minfer.trace import StepTrace


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(slots=True)
class Latency:
    """p50/p95/p99 (and mean, max) of one latency, in seconds."""

    p50: float
    p95: float
    p99: float
    mean: float
    max: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        values = list(values)
        mean = sum(values) / len(values) if values else math.nan
        return cls(percentile(values, 50), percentile(values, 95), percentile(values, 99), mean,
                   max(values) if values else math.nan, len(values))


@dataclass(slots=True)
class SLO:
    """Latency targets in seconds; ``None`` means no target for that metric."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met_by(self, req: Request) -> bool:
        # BEGIN EXERCISE E10.1
        m = req.metrics
        if req.finish_reason not in ("stop", "length"):
            return False
        if self.ttft is not None and (m.ttft is None or m.ttft > self.ttft):
            return False
        if self.tpot is not None and m.tpot is not None and m.tpot > self.tpot:
            return False
        return not (self.e2e is not None and (m.e2e is None or m.e2e > self.e2e))
        # END EXERCISE


@dataclass(slots=True)
class Summary:
    num_requests: int
    finish_reasons: dict[str, int]
    duration: float  # first arrival → last finish, seconds on the engine clock
    prompt_tokens: int  # prompts of served requests ("stop" or "length"): the prompts the engine finished
    output_tokens: int  # every generated token, aborted requests' included: work the engine did
    output_throughput: float  # output tokens per second
    request_throughput: float
    ttft: Latency
    itl: Latency
    tpot: Latency
    e2e: Latency
    queue_time: Latency
    num_preemptions: int
    cached_prompt_tokens: int
    prefix_hit_rate: float  # cached prompt tokens / prompt tokens of served requests
    slo: SLO | None = None
    goodput: float | None = None  # requests per second that met the SLO
    goodput_tokens: float | None = None  # their output tokens per second
    slo_attainment: float | None = None  # fraction of all requests that met the SLO
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def row(self) -> dict[str, float]:
        """The headline numbers as one flat row (for tables)."""
        r: dict[str, float] = {
             "requests": self.num_requests, "duration_s": self.duration, "output_tok_s": self.output_throughput,
             "ttft_p50": self.ttft.p50, "ttft_p99": self.ttft.p99, "itl_p50": self.itl.p50,
             "itl_p99": self.itl.p99, "tpot_p50": self.tpot.p50, "e2e_p50": self.e2e.p50,
             "e2e_p99": self.e2e.p99, "preemptions": self.num_preemptions}
        if self.goodput is not None:
            r["goodput_req_s"] = self.goodput
            r["slo_attainment"] = self.slo_attainment if self.slo_attainment is not None else math.nan
        return r


def summarize(requests: Iterable[Request], slo: SLO | None = None, duration: float | None = None) -> Summary:
    """Metrics over finished requests. ``duration`` defaults to first arrival → last finish."""
    reqs = list(requests)
    served = [r for r in reqs if r.finish_reason in ("stop", "length")]
    if duration is None:
        times = [r.metrics.finished_time for r in reqs if r.metrics.finished_time is not None]
        duration = (max(times) - min(r.metrics.arrival_time for r in reqs)) if times else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    out_tokens = sum(r.num_output_tokens for r in reqs)
    prompt_tokens = sum(r.num_prompt_tokens for r in served)
    cached = sum(r.metrics.num_cached_tokens for r in served)
    s = Summary(
        num_requests=len(reqs), duration=duration,
        finish_reasons=dict(Counter(r.finish_reason or "unfinished" for r in reqs)),
        prompt_tokens=prompt_tokens, output_tokens=out_tokens, output_throughput=per_s(out_tokens),
        request_throughput=per_s(len(served)),
        ttft=Latency.of([r.metrics.ttft for r in served if r.metrics.ttft is not None]),
        itl=Latency.of([x for r in served for x in r.metrics.itl]),
        tpot=Latency.of([r.metrics.tpot for r in served if r.metrics.tpot is not None]),
        e2e=Latency.of([r.metrics.e2e for r in served if r.metrics.e2e is not None]),
        queue_time=Latency.of([r.metrics.queue_time for r in served if r.metrics.queue_time is not None]),
        num_preemptions=sum(r.metrics.num_preemptions for r in reqs),
        cached_prompt_tokens=cached, prefix_hit_rate=cached / prompt_tokens if prompt_tokens else 0.0,
    )
    if slo is not None:
        good = [r for r in served if slo.met_by(r)]
        s.slo, s.goodput = slo, per_s(len(good))
        s.goodput_tokens = per_s(sum(r.num_output_tokens for r in good))
        s.slo_attainment = len(good) / len(reqs) if reqs else math.nan
    return s


def jain_fairness(shares: Iterable[float]) -> float:
    """Jain's index: 1 when every party got the same share, 1/n when one got everything."""
    xs = list(shares)
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else 1.0


@dataclass(slots=True, frozen=True)
class SpecDecodeStats:
    """Speculative decoding over some steps, in vLLM's terms: a *draft* is one request's guesses in one step."""

    num_drafts: int  # (request, step) pairs that verified at least one guess
    num_draft_tokens: int  # guesses verified
    num_accepted_tokens: int  # guesses kept

    @property
    def acceptance_rate(self) -> float:
        """Share of guesses kept."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a speculating request gets per step: its kept guesses plus the one token it always gets."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @classmethod
    def of(cls, trace: Iterable[StepTrace]) -> SpecDecodeStats:
        """The totals of a run's step records."""
        drafts = drafted = kept = 0
        for t in trace:
            drafts += sum(1 for n in t.draft_tokens.values() if n)
            drafted += sum(t.draft_tokens.values())
            kept += sum(t.accepted_tokens.values())
        return cls(drafts, drafted, kept)
