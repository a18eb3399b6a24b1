"""A capacity report: the highest request rate a server takes while still meeting its latency SLOs.

An operator asks one question of a serving engine before anything else: *how much traffic can one instance take?*
Throughput at a fixed load does not answer it, because latency is the constraint: past some rate, requests queue,
TTFT climbs without bound, and the extra throughput is bought with users who gave up. The answer is a sweep: the
same requests offered at rising rates (Poisson arrivals, the arrival times of one seeded workload divided by the
rate, so that the rates differ in nothing else), and at each rate the share of requests that met the SLOs. The
capacity is the highest rate at which that share stays at the target (90%, as DistServe's SLO attainment), below
the first rate that misses it -- a noisy pass above a miss does not count.

    python -m minfer.bench --sweep                                   # this machine, the real model, in process
    python -m minfer.bench --sweep --endpoint http://127.0.0.1:8000/v1   # any OpenAI-compatible server (vLLM too)
    python -m minfer.bench --sweep --sim H100-SXM --model llama-3-8b     # a simulated GPU

Every runner ``minfer.bench`` knows (an in-process engine, the simulator, a client of an endpoint) takes a workload
and returns a ``Summary``; the sweep only changes the arrival times between calls, so the same report comes from a
laptop, a simulated H100 or a vLLM server.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from minfer.metrics import SLO, Summary
from minfer.workload import WorkItem, poisson, scale_time

SLO_TARGET = 0.9  # the share of requests that must meet the SLOs at a rate the server "takes"
# the sweep's default SLOs and workload: short chats a CPU can serve, so the default sweep of the real model on two
# cores takes a few minutes (prompts about 64 tokens, answers about 32)
DEFAULT_SLO = SLO(ttft=1.0, tpot=0.1)
DEFAULT_RATES = (1.0, 2.0, 4.0, 8.0, 16.0)


def sweep_workload(n: int = 24, prompt_median: float = 64, output_median: float = 32, seed: int = 0) -> list[WorkItem]:
    """The requests every rate of a sweep sends: Poisson arrivals at one request a second (a sweep divides the
    times by its rate), lengths drawn once from ``seed``."""
    return poisson(n, 1.0, prompt_median=prompt_median, output_median=output_median,
                   max_prompt=round(8 * prompt_median), max_output=round(8 * output_median), seed=seed)


TABLE_HEADER = (f"{'rate/s':>7}  {'served/s':>8}  {'out tok/s':>9}  {'TTFT p50':>8}  {'TTFT p99':>8}  "
                f"{'ITL p50':>7}  {'ITL p99':>7}  {'goodput/s':>9}  {'met SLO':>7}")


@dataclass(frozen=True, slots=True)
class RatePoint:
    """What one offered rate gave: the rate served, the latencies, and how many requests met the SLOs."""

    rate: float  # offered, requests per second
    request_throughput: float  # served, requests per second
    output_throughput: float  # output tokens per second
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    goodput: float  # requests per second that met the SLOs
    slo_attainment: float  # share of all requests that met the SLOs

    def row(self) -> str:
        """The point as a line of the report's table (under ``TABLE_HEADER``)."""
        return (f"{self.rate:>7.2f}  {self.request_throughput:>8.2f}  {self.output_throughput:>9.1f}  "
                f"{_ms(self.ttft_p50):>8}  {_ms(self.ttft_p99):>8}  {_ms(self.itl_p50):>7}  {_ms(self.itl_p99):>7}  "
                f"{self.goodput:>9.2f}  {self.slo_attainment:>7.0%}")

    @classmethod
    def of(cls, rate: float, s: Summary) -> RatePoint:
        if s.goodput is None or s.slo_attainment is None:
            raise ValueError("the runner's summary has no goodput: build the runner with the sweep's SLO")
        return cls(rate, s.request_throughput, s.output_throughput, s.ttft.p50, s.ttft.p99, s.itl.p50, s.itl.p99,
                   s.goodput, s.slo_attainment)


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """A sweep's points, in the order of their rates, and the capacity they show."""

    system: str
    slo: SLO
    target: float
    points: tuple[RatePoint, ...]

    @property
    def capacity(self) -> float | None:
        """The highest rate meeting the target below the first rate that misses it (None: even the lowest misses)."""
        best = None
        for p in self.points:
            if p.slo_attainment < self.target:
                break
            best = p.rate
        return best

    def table(self) -> str:
        rows = [p.row() for p in self.points]
        limits = ", ".join(f"{k} <= {v * 1e3:.0f} ms" for k, v in asdict(self.slo).items() if v is not None)
        verdict = (f"capacity: {self.capacity:g} requests/s" if self.capacity is not None
                   else f"capacity: below {self.points[0].rate:g} requests/s" if self.points else "capacity: no points")
        return "\n".join([f"{self.system}: SLOs {limits}, target {self.target:.0%} of requests", TABLE_HEADER, *rows,
                          f"{verdict} (the highest rate where {self.target:.0%} met the SLOs)"])

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "slo": asdict(self.slo), "target": self.target, "capacity": self.capacity,
                "points": [asdict(p) for p in self.points]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))


def _ms(seconds: float) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.0f} ms"


def capacity_sweep(run: Callable[[list[WorkItem]], Summary], workload: Sequence[WorkItem], slo: SLO,
                   rates: Sequence[float] = DEFAULT_RATES, target: float = SLO_TARGET, system: str = "system",
                   stop_after_misses: int = 2, echo: Callable[[str], None] | None = None) -> CapacityReport:
    """Offer ``workload`` (arrivals at one request a second) to ``run`` at each of ``rates``, rising; ``run`` must
    summarize under ``slo``. Stops after ``stop_after_misses`` rates in a row miss the target: past saturation every
    higher rate only queues more, and each costs as long as the last. ``echo`` gets each point's row as it lands."""
    if not rates or any(r <= 0 for r in rates):
        raise ValueError(f"rates must be positive requests per second, got {list(rates)}")
    if not 0 < target <= 1:
        raise ValueError(f"target is a share of requests in (0, 1], got {target}")
    points: list[RatePoint] = []
    misses = 0
    for rate in sorted(rates):
        point = RatePoint.of(rate, run(scale_time(list(workload), 1.0 / rate)))
        points.append(point)
        if echo is not None:
            echo(point.row())
        misses = misses + 1 if point.slo_attainment < target else 0
        if misses >= stop_after_misses:
            break
    return CapacityReport(system, slo, target, tuple(points))


def capacity_figure(reports: Sequence[CapacityReport]) -> Any:
    """Goodput and TTFT p99 against the offered rate, one line per system, the capacity marked: the report as a
    picture (plotly)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("goodput (requests/s meeting the SLOs)", "TTFT p99 (s)"))
    for r in reports:
        rates = [p.rate for p in r.points]
        fig.add_trace(go.Scatter(x=rates, y=[p.goodput for p in r.points], mode="lines+markers", name=r.system,
                                 legendgroup=r.system), row=1, col=1)
        fig.add_trace(go.Scatter(x=rates, y=[p.ttft_p99 for p in r.points], mode="lines+markers", name=r.system,
                                 legendgroup=r.system, showlegend=False), row=1, col=2)
        if r.capacity is not None:
            fig.add_vline(x=r.capacity, line_dash="dot", annotation_text=f"{r.system}: {r.capacity:g}/s", row=1,
                          col=1)
        if r.slo.ttft is not None:
            fig.add_hline(y=r.slo.ttft, line_dash="dash", annotation_text="TTFT SLO", row=1, col=2)
    fig.update_xaxes(title_text="offered rate (requests/s)", type="log")
    fig.update_layout(height=380, margin=dict(t=40, b=40))
    return fig
