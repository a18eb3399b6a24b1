"""Queues and memory over time, from a trace: how long the lines are, and how full the pool is.

Top panel: requests waiting (queued, incl. preempted ones), running, and not yet arrived, per step, with
an ✕ naming the requests preempted in that step. Bottom panel: KV blocks in use and blocks in the
prefix-hash index, against the pool size. Each step's value is drawn across that step's whole width
(``step - 0.5 .. step + 0.5``, under its bar in the tokens-per-step chart), so the latest step is as
visible as the others. When the waiting line grows while the pool is full, the server is memory-bound;
when it grows with blocks to spare, the per-step budgets (``max_num_seqs``, the token budget) bind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from minfer.trace import StepTrace
from minfer.viz.narration import sentences
from minfer.viz.style import (
    ALARM,
    CACHED_RIM,
    PHASE_COLORS,
    REFERENCE_LINE,
    as_figure,
    figure,
    rgba,
    scaled_height,
    step_axis,
)


@dataclass(slots=True)
class QueueData:
    steps: list[int]
    waiting: list[int]
    running: list[int]
    pending: list[int]  # not arrived yet
    used_blocks: list[int]
    cached_blocks: list[int]  # in the prefix-hash index (in use or free)
    num_blocks: int
    preempted: list[int]  # preemptions per step


def queue_data(trace: Sequence[StepTrace]) -> QueueData:
    return QueueData(
        steps=[t.step for t in trace], waiting=[t.num_waiting for t in trace],
        running=[t.num_running for t in trace], pending=[t.num_pending for t in trace],
        used_blocks=[t.num_blocks - t.num_free_blocks for t in trace],
        cached_blocks=[t.num_cached_blocks for t in trace],
        num_blocks=trace[-1].num_blocks if trace else 0, preempted=[len(t.preempted) for t in trace],
    )


def _steps_line(name: str, steps: list[int], values: list[int], unit: str, optional: bool = False,
                **style) -> dict:
    """A line holding each step's value across the step's width. An ``optional`` series that stays zero
    (nothing cached, nobody still to arrive) is drawn empty and left out of the legend."""
    if optional and not any(values):
        steps, values = [], []
    x = [s - 0.5 for s in steps] + [steps[-1] + 0.5] if steps else []
    y = values + values[-1:]
    hover = [f"step {s}: {v} {unit}" for s, v in zip(steps, values)] + [f"step {steps[-1]}: {values[-1]} {unit}"
                                                                      ] if steps else []
    style["line"] = {**style.get("line", {}), "shape": "hv"}
    return dict(type="scatter", mode="lines", name=name, x=x, y=y, hovertext=hover, hoverinfo="text",
                showlegend=bool(steps), **style)


def queue_figure(trace: Sequence[StepTrace], scale: float = 1.0, height: int = 380) -> dict:
    """Queue lengths (top) and KV blocks in use (bottom) per step, as plotly JSON; ✕ marks (with the
    requests' names) the steps that preempted."""
    d = queue_data(trace)
    hit = [i for i, n in enumerate(d.preempted) if n]
    why = {t.step: [x for x in sentences(t) if x.kind == "preempted"] for t in trace if t.preempted}
    dark = PHASE_COLORS["decode"]
    data = [
        _steps_line("waiting", d.steps, d.waiting, "waiting", line=dict(color=dark, width=2, dash="dash")),
        _steps_line("running", d.steps, d.running, "running", line=dict(color=dark, width=2.5)),
        _steps_line("not arrived", d.steps, d.pending, "not arrived yet", optional=True,
                    line=dict(color="#9aa3ad", width=1.5, dash="dot")),
        dict(type="scatter", mode="markers+text", name="preempted", showlegend=bool(hit), hoverinfo="text",
             x=[d.steps[i] for i in hit], y=[d.running[i] for i in hit],
             text=[", ".join(t.preempted) for t in trace if t.preempted], textposition="top center",
             textfont=dict(color=ALARM), marker=dict(symbol="x", color=ALARM, size=round(11 * scale)),
             hovertext=[f"step {s}: " + "; ".join(f"preempted {x.request} ({x.why})" for x in why[s])
                        for s in (d.steps[i] for i in hit)]),
        _steps_line("blocks in use", d.steps, d.used_blocks, "blocks in use", line=dict(color=dark, width=2),
                    fill="tozeroy", fillcolor=rgba(dark, 0.15), xaxis="x2", yaxis="y2"),
        _steps_line("blocks cached", d.steps, d.cached_blocks, "blocks in the prefix index", optional=True,
                    line=dict(color=CACHED_RIM, width=1.5, dash="dashdot"), xaxis="x2", yaxis="y2"),
        dict(type="scatter", mode="lines", name="pool size", xaxis="x2", yaxis="y2", hoverinfo="skip",
             x=[d.steps[0] - 0.5, d.steps[-1] + 0.5] if d.steps else [], y=[d.num_blocks] * (2 if d.steps else 0),
             line=dict(color=REFERENCE_LINE, dash="dash", width=1), showlegend=bool(d.steps)),
    ]
    first, last = (d.steps[0], d.steps[-1]) if d.steps else (0, 9)
    top = max(d.waiting + d.running + d.pending, default=0)
    layout = dict(
        title=dict(text="Queues and KV blocks"), height=scaled_height(height, scale),
        margin=dict(l=60, r=20, t=round(80 * scale), b=50),
        xaxis=step_axis(first, last, anchor="y", matches="x2", showticklabels=False, title=dict(text="")),
        yaxis=dict(domain=[0.55, 1], title=dict(text="requests"), range=[0, max(top * 1.25, 1)], rangemode="tozero"),
        xaxis2=step_axis(first, last, anchor="y2"),
        yaxis2=dict(domain=[0, 0.45], title=dict(text="KV blocks"), range=[0, max(d.num_blocks * 1.08, 1)]))
    if not d.steps:
        layout["annotations"] = [dict(text="no steps yet", showarrow=False, xref="paper", yref="paper", x=0.5,
                                      y=0.5, font=dict(color="#8a9099"))]
    return figure(data, layout, scale)


def queue_chart(trace: Sequence[StepTrace], height: int = 380, width: int | None = None,
                scale: float = 1.0) -> go.Figure:
    """Queue lengths (top) and KV blocks in use (bottom) per step; ✕ marks (and names) preemptions."""
    return as_figure(queue_figure(trace, scale, height), width)
