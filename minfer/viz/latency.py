"""Latency distributions: time to first token and inter-token latency, against their SLOs.

Reads only ``RequestMetrics`` (engine-clock timestamps), through the same properties ``minfer.metrics``
summarises -- so the histogram and the benchmark table cannot disagree. A dashed line marks each SLO;
the title says the p50/p99 and the share of requests (TTFT) or token gaps (ITL) within it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minfer.metrics import Latency
from minfer.request import RequestMetrics
from minfer.viz.style import as_widget


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


def _subtitle(name: str, values: list[float], share: float | None) -> str:
    if not values:
        return f"{name}: no data yet"
    lat = Latency.of(values)
    within = f" · {share:.0%} within SLO" if share is not None else ""
    return f"{name}: p50 {lat.p50 * 1e3:.0f} ms · p99 {lat.p99 * 1e3:.0f} ms{within}"


def latency_chart(metrics: Metrics, ttft_slo: float | None = None,
                  itl_slo: float | None = None, widget: bool = False, height: int = 260,
                  width: int | None = None) -> go.Figure:
    """Histograms of TTFT and ITL in milliseconds, with dashed SLO lines (seconds in, like ``SLO``)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "ITL"), horizontal_spacing=0.1)
    fig.add_histogram(name="TTFT", marker_color="#f4a261", row=1, col=1)
    fig.add_histogram(name="ITL", marker_color="#2a9d8f", row=1, col=2)
    fig.update_layout(height=height, width=width, template="plotly_white", showlegend=False, bargap=0.05,
                      margin=dict(l=45, r=10, t=40, b=40))
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="count", col=1)
    update_latency_chart(fig, metrics, ttft_slo, itl_slo)
    return as_widget(fig, widget)


def update_latency_chart(fig: go.Figure, metrics: Metrics, ttft_slo: float | None = None,
                         itl_slo: float | None = None, until: float | None = None) -> None:
    d = latency_data(metrics, ttft_slo, itl_slo, until)
    shapes = [dict(type="line", xref=xref, yref=f"{yref} domain", x0=slo * 1e3, x1=slo * 1e3, y0=0, y1=1,
                   line=dict(color="#e63946", dash="dash", width=2))
              for slo, xref, yref in ((ttft_slo, "x", "y"), (itl_slo, "x2", "y2")) if slo is not None]
    with fig.batch_update():
        fig.data[0].x = [v * 1e3 for v in d.ttft]
        fig.data[1].x = [v * 1e3 for v in d.itl]
        fig.layout.shapes = shapes
        fig.layout.annotations[0].text = _subtitle("TTFT", d.ttft, d.ttft_within_slo)
        fig.layout.annotations[1].text = _subtitle("ITL", d.itl, d.itl_within_slo)
