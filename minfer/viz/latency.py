"""Latency distributions: time to first token and inter-token latency, against their SLOs.

Reads only ``RequestMetrics`` (engine-clock timestamps), through the same properties ``minfer.metrics``
summarises -- so the histogram and the benchmark table cannot disagree. A dashed line marks each SLO;
the title says the p50/p99 and the share of requests (TTFT) or token gaps (ITL) within it. The x axes
start at zero and the bins are chosen here (about 30 over the axis), so a run whose gaps are all 5.5 ms
draws one bar at 5.5 ms -- not a histogram zoomed onto 5.485..5.505 ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import plotly.graph_objects as go

from minfer.metrics import Latency
from minfer.request import RequestMetrics
from minfer.viz.style import NEUTRAL, REFERENCE_LINE, as_figure, figure, nice_step, scaled_height


@dataclass(slots=True)
class LatencyData:
    ttft: list[float]  # seconds, one per request that got a first token
    itl: list[float]  # seconds, every gap between consecutive tokens of every request
    ttft_slo: float | None
    itl_slo: float | None

    @property
    def ttft_within_slo(self) -> float | None:
        return _share_within(self.ttft, self.ttft_slo)

    @property
    def itl_within_slo(self) -> float | None:
        return _share_within(self.itl, self.itl_slo)


def _share_within(values: list[float], slo: float | None) -> float | None:
    if slo is None or not values:
        return None
    return sum(v <= slo for v in values) / len(values)


Metrics = Iterable[RequestMetrics] | Mapping[str, RequestMetrics]


def latency_data(metrics: Metrics, ttft_slo: float | None = None, itl_slo: float | None = None,
                 until: float | None = None) -> LatencyData:
    """TTFTs and ITLs in seconds; ``until`` (engine clock) keeps only tokens that existed by then -- a
    replay scrubbed back to step ``s`` shows the latencies known at the end of step ``s``."""
    ms = list(metrics.values() if isinstance(metrics, Mapping) else metrics)
    if until is None:
        ttft, itl = [m.ttft for m in ms if m.ttft is not None], [x for m in ms for x in m.itl]
    else:
        ttft = [m.ttft for m in ms if m.first_token_time is not None and m.first_token_time <= until]
        itl = [b - a for m in ms for a, b in zip(m.token_times, m.token_times[1:]) if b <= until]
    return LatencyData(ttft=ttft, itl=itl, ttft_slo=ttft_slo, itl_slo=itl_slo)


def short_duration(seconds: float) -> str:
    """A latency in at most three digits and a unit: ``"228 ms"``, ``"2.28 s"``. A title keeps its width however
    slow the machine: on a busy CPU the dashboard's ITLs reach seconds, and four-digit milliseconds pushed the
    title past the chart's edge at the lecture layout's doubled font."""
    return f"{seconds * 1e3:.0f} ms" if round(seconds * 1e3) < 1000 else f"{seconds:.3g} s"


def _subtitle(name: str, values: list[float], share: float | None) -> str:
    if not values:
        return f"{name}: no data yet"
    lat = Latency.of(values)
    within = f"<br>{share:.0%} within SLO" if share is not None else ""
    return f"{name}: p50 {short_duration(lat.p50)} · p99 {short_duration(lat.p99)}{within}"


@dataclass(slots=True)
class Histogram:
    """Counts of ``values`` in bins of ``size`` from 0: bin ``i`` holds ``[i * size, (i + 1) * size)``."""

    size: float
    counts: list[int]

    @classmethod
    def of(cls, values: list[float], top: float, bins: int = 30) -> Histogram:
        size = nice_step(top, bins)
        counts = [0] * (int(top // size) + 1)
        for v in values:
            i = min(int(v // size), len(counts) - 1)
            counts[i] += 1
        return cls(size, counts)


def _histogram(values_ms: list[float], slo_ms: float | None, axis: str) -> tuple[dict, list[float]]:
    """Bars of a histogram binned here from 0, and its axis range (covering the SLO line too). Binned in
    Python, not by plotly: a long run has tens of thousands of token gaps, and 30 counts travel (and draw)
    faster than every value."""
    top = max([*values_ms, slo_ms or 0.0], default=0.0) * 1.08 or 1.0
    h = Histogram.of(values_ms, top)
    edges = [i * h.size for i in range(len(h.counts))]
    trace = dict(type="bar", x=[e + h.size / 2 for e in edges], y=h.counts, width=h.size * 0.95,
                 xaxis=f"x{axis}", yaxis=f"y{axis}", marker=dict(color=NEUTRAL), hoverinfo="text",
                 hovertext=[f"{e:.4g}–{e + h.size:.4g} ms: {n}" for e, n in zip(edges, h.counts)])
    return trace, [0, top]


def latency_figure(metrics: Metrics, ttft_slo: float | None = None, itl_slo: float | None = None,
                   until: float | None = None, scale: float = 1.0, height: int = 300) -> dict:
    """Histograms of TTFT and ITL in milliseconds (bars of counts), with dashed SLO lines, as plotly JSON."""
    d = latency_data(metrics, ttft_slo, itl_slo, until)
    ttft, itl = [v * 1e3 for v in d.ttft], [v * 1e3 for v in d.itl]
    slos = [None if s is None else s * 1e3 for s in (ttft_slo, itl_slo)]
    h1, r1 = _histogram(ttft, slos[0], "")
    h2, r2 = _histogram(itl, slos[1], "2")
    h1["name"], h2["name"] = "TTFT", "ITL"
    shapes = [dict(type="line", xref=xref, yref=f"{yref} domain", x0=slo, x1=slo, y0=0, y1=1,
                   line=dict(color=REFERENCE_LINE, dash="dash", width=2))
              for slo, xref, yref in ((slos[0], "x", "y"), (slos[1], "x2", "y2")) if slo is not None]
    subtitle = dict(showarrow=False, xref="paper", yref="paper", y=1.0, yanchor="bottom", xanchor="left",
                    align="left")
    layout = dict(
        title=dict(text="Latency"), showlegend=False, bargap=0.05, height=scaled_height(height, scale),
        margin=dict(l=60, r=20, t=round(95 * scale), b=55), shapes=shapes,
        annotations=[dict(subtitle, text=_subtitle("TTFT", d.ttft, d.ttft_within_slo), x=0),
                     dict(subtitle, text=_subtitle("ITL", d.itl, d.itl_within_slo), x=0.55)],
        xaxis=dict(domain=[0, 0.45], range=r1, title=dict(text="time to first token (ms)")),
        yaxis=dict(title=dict(text="requests"), rangemode="tozero"),
        xaxis2=dict(domain=[0.55, 1], range=r2, anchor="y2", title=dict(text="inter-token latency (ms)")),
        yaxis2=dict(anchor="x2", title=dict(text="token gaps"), rangemode="tozero"))
    return figure([h1, h2], layout, scale)


def latency_chart(metrics: Metrics, ttft_slo: float | None = None, itl_slo: float | None = None,
                  height: int = 300, width: int | None = None, scale: float = 1.0) -> go.Figure:
    """Histograms of TTFT and ITL in milliseconds, with dashed SLO lines (seconds in, like ``SLO``)."""
    return as_figure(latency_figure(metrics, ttft_slo, itl_slo, scale=scale, height=height), width)
