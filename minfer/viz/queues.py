"""Queues and memory over time, from a trace: how long the lines are, and how full the pool is.

Top panel: requests waiting (queued, incl. preempted ones), running, and not yet arrived, per step, with
a mark at every step that preempted. Bottom panel: KV blocks in use and blocks in the prefix-hash index,
against the pool size. When the waiting line grows while the pool is full, the server is memory-bound;
when it grows with blocks to spare, the per-step budgets (``max_num_seqs``, the token budget) bind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minfer.trace import StepTrace
from minfer.viz.style import as_widget


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


def queue_chart(trace: Sequence[StepTrace], widget: bool = False, height: int = 330,
                width: int | None = None) -> go.Figure:
    """Queue lengths (top) and KV blocks in use (bottom) per step; ✕ marks steps that preempted."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("Requests", "KV blocks"))
    line = dict(mode="lines", line_shape="hv")
    fig.add_scatter(name="waiting", line_color="#adb5bd", **line, row=1, col=1)
    fig.add_scatter(name="running", line_color="#2a9d8f", **line, row=1, col=1)
    fig.add_scatter(name="not arrived", line=dict(color="#ced4da", dash="dot"), mode="lines", line_shape="hv",
                    row=1, col=1)
    fig.add_scatter(name="preempted", mode="markers", marker=dict(symbol="x", color="#e63946", size=9),
                    row=1, col=1)
    fig.add_scatter(name="blocks in use", line_color="#264653", fill="tozeroy", **line, row=2, col=1)
    fig.add_scatter(name="blocks cached", line_color="#2d6a4f", **line, row=2, col=1)
    fig.add_scatter(name="pool size", line=dict(color="black", dash="dash", width=1), mode="lines",
                    row=2, col=1)
    fig.update_layout(height=height, width=width, template="plotly_white", legend=dict(font_size=10),
                      margin=dict(l=50, r=10, t=30, b=35))
    fig.update_xaxes(title_text="step", row=2, col=1)
    update_queue_chart(fig, trace)
    return as_widget(fig, widget)


def update_queue_chart(fig: go.Figure, trace: Sequence[StepTrace]) -> None:
    d = queue_data(trace)
    hit = [i for i, n in enumerate(d.preempted) if n]
    with fig.batch_update():
        fig.data[0].update(x=d.steps, y=d.waiting)
        fig.data[1].update(x=d.steps, y=d.running)
        fig.data[2].update(x=d.steps, y=d.pending)
        fig.data[3].update(x=[d.steps[i] for i in hit], y=[d.running[i] for i in hit],
                           hovertext=[f"step {d.steps[i]}: {d.preempted[i]} preempted" for i in hit])
        fig.data[4].update(x=d.steps, y=d.used_blocks)
        fig.data[5].update(x=d.steps, y=d.cached_blocks)
        ends = [d.steps[0], d.steps[-1]] if d.steps else []
        fig.data[6].update(x=ends, y=[d.num_blocks] * len(ends))
