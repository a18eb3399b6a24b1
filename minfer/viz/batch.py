"""Batch composition: what each step computed, and the life of each request, from a trace alone.

Two views over ``list[StepTrace]``:

* **tokens per step** -- one bar per (step, request), stacked: decode tokens (one per running request)
  at the bottom, prompt chunks on top, hatched. Continuous batching shows as a step mixing colours;
  chunked prefill as a prompt spread over several steps, each under the token budget.
* **timeline** -- a Gantt chart, one row per request: waiting, prefill, decode, stalled (holds blocks
  but got no budget this step), preempted (lost its blocks, queued to recompute), and a mark where it
  finished.

``batch_data`` and ``timeline_data`` compute the numbers (tests check them); the chart functions only
draw them. Every chart function returns a ``go.Figure``, or a live ``go.FigureWidget`` with ``widget=True``;
the ``update_*`` functions redraw an existing figure in one batched message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go

from minfer.request import RequestMetrics
from minfer.trace import StepTrace
from minfer.viz.style import FINISH_COLORS, STATE_COLORS, ColorMap, as_widget

# ---- tokens per step ----------------------------------------------------------------------------


@dataclass(slots=True)
class Bars:
    """Stacked bars drawn with explicit bases: bar ``i`` spans ``base[i] .. base[i] + tokens[i]``."""

    step: list[int] = field(default_factory=list)
    request: list[str] = field(default_factory=list)
    base: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)  # the request's first token computed in that step

    def add(self, step: int, request: str, base: int, tokens: int, position: int) -> None:
        self.step.append(step)
        self.request.append(request)
        self.base.append(base)
        self.tokens.append(tokens)
        self.position.append(position)


@dataclass(slots=True)
class BatchData:
    prefill: Bars
    decode: Bars
    steps: list[int]  # step numbers drawn
    totals: list[int]  # tokens computed per step (the bar heights)


def batch_data(trace: Sequence[StepTrace]) -> BatchData:
    """One bar per (step, request) that computed tokens, decodes stacked under prefill chunks."""
    prefill, decode = Bars(), Bars()
    for t in trace:
        base = 0
        for rid, n in t.decode_tokens.items():
            decode.add(t.step, rid, base, n, t.positions.get(rid, 0))
            base += n
        for rid, n in t.prefill_tokens.items():
            prefill.add(t.step, rid, base, n, t.positions.get(rid, 0))
            base += n
    return BatchData(prefill, decode, [t.step for t in trace], [t.num_tokens for t in trace])


def _bar_style(bars: Bars, colors: ColorMap, kind: str) -> dict:
    if kind == "prefill":
        hover = [f"step {s} · {r}: prompt tokens {p}–{p + n - 1} ({n})"
                 for s, r, p, n in zip(bars.step, bars.request, bars.position, bars.tokens)]
    else:
        hover = [f"step {s} · {r}: decode, token {p}"
                 for s, r, p in zip(bars.step, bars.request, bars.position)]
    return dict(x=bars.step, y=bars.tokens, base=bars.base, hovertext=hover,
                marker=dict(color=[colors(r) for r in bars.request]))


def batch_chart(trace: Sequence[StepTrace], colors: ColorMap | None = None, widget: bool = False,
                height: int = 280, width: int | None = None) -> go.Figure:
    """Tokens per step, one coloured bar per request; prefill hatched, decode solid."""
    fig = go.Figure()
    fig.add_bar(name="decode (1 token each)", hoverinfo="text", marker_line_width=0.5)
    fig.add_bar(name="prefill chunk (hatched)", hoverinfo="text", marker_line_width=0.5,
                marker_pattern=dict(shape="/", fgcolor="white", fgopacity=0.6))
    fig.update_layout(barmode="overlay", height=height, width=width, margin=dict(l=50, r=10, t=40, b=35),
                      bargap=0.15,
                      title=dict(text="Tokens per step", font_size=14),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      xaxis_title="step",
                      yaxis_title="tokens", template="plotly_white")
    update_batch_chart(fig, trace, colors)
    return as_widget(fig, widget)


def update_batch_chart(fig: go.Figure, trace: Sequence[StepTrace], colors: ColorMap | None = None) -> None:
    colors = colors or ColorMap()
    d = batch_data(trace)
    with fig.batch_update():
        fig.data[0].update(_bar_style(d.decode, colors, "decode"))
        fig.data[1].update(_bar_style(d.prefill, colors, "prefill"))
        steps = d.steps or [0]
        fig.layout.xaxis.range = [steps[0] - 0.5, steps[-1] + 0.5]
        fig.layout.yaxis.range = [0, max(d.totals, default=1) * 1.05 or 1]


# ---- timeline (Gantt) ---------------------------------------------------------------------------

STATES = tuple(STATE_COLORS)


@dataclass(slots=True)
class Segment:
    """``request`` was in ``state`` for steps ``start .. end - 1`` (trace step numbers)."""

    request: str
    state: str
    start: int
    end: int


@dataclass(slots=True)
class Finish:
    request: str
    step: int
    reason: str


@dataclass(slots=True)
class TimelineData:
    requests: list[str]  # rows, in order of first appearance
    segments: list[Segment]
    finishes: list[Finish]


def step_states(trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics] | None = None
                ) -> list[dict[str, str]]:
    """Per step, the state of every request alive in it.

    The trace gives admissions, preemptions, finishes and who computed what; ``metrics`` (optional) add
    arrival times, so a request also shows as *waiting* from the step it arrived. (The engine releases
    an arrival into the queue when a step starts at or after its arrival time.)
    """
    arrivals = sorted((m.arrival_time, rid) for rid, m in (metrics or {}).items())
    next_arrival = 0
    running: set[str] = set()  # holds blocks
    queued: dict[str, str] = {}  # request id → "waiting" or "preempted"
    out: list[dict[str, str]] = []
    for t in trace:
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= t.start_time:
            rid = arrivals[next_arrival][1]
            if rid not in running:
                queued.setdefault(rid, "waiting")
            next_arrival += 1
        for rid in t.admitted:
            queued.pop(rid, None)
            running.add(rid)
        for rid in t.preempted:
            running.discard(rid)
            queued[rid] = "preempted"
        states = dict(queued)
        for rid in running:
            states[rid] = "stalled"
        for rid in t.prefill_tokens:
            states[rid] = "prefill"
        for rid in t.decode_tokens:
            states[rid] = "decode"
        for rid in t.finished:  # rejected or timed out requests end straight from the queue
            states.setdefault(rid, queued.get(rid, "waiting"))
            running.discard(rid)
            queued.pop(rid, None)
        out.append(states)
    return out


def timeline_data(trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics] | None = None,
                  since: int | None = None) -> TimelineData:
    """Run-length encode ``step_states`` into one segment per (request, unbroken stretch of a state).
    Rows are ordered by the step a request first shows up in, then by arrival, then by admission.

    ``since``: keep only steps from that step number on (a window over a long run). The states are still
    worked out from the first step, so a request admitted earlier shows as running, not unknown."""
    since = trace[0].step if since is None and trace else since or 0
    admitted: dict[str, int] = {}
    for t in trace:
        for rid in t.admitted:
            admitted.setdefault(rid, t.step)
    first_seen: dict[str, tuple[int, float, float]] = {}
    segments: list[Segment] = []
    open_: dict[str, Segment] = {}
    for t, states in zip(trace, step_states(trace, metrics)):
        if t.step < since:
            continue
        for rid, state in states.items():
            m = metrics.get(rid) if metrics else None
            arrival = m.arrival_time if m else 0.0
            first_seen.setdefault(rid, (t.step, arrival, admitted.get(rid, float("inf"))))
            seg = open_.get(rid)
            if seg is not None and seg.state == state and seg.end == t.step:
                seg.end = t.step + 1
            else:
                seg = open_[rid] = Segment(rid, state, t.step, t.step + 1)
                segments.append(seg)
    finishes = [Finish(rid, t.step, t.finish_reasons.get(rid, "")) for t in trace if t.step >= since
                for rid in t.finished]
    return TimelineData(sorted(first_seen, key=first_seen.__getitem__), segments, finishes)


def timeline_chart(trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics] | None = None,
                   widget: bool = False, height: int | None = None, width: int | None = None) -> go.Figure:
    """A Gantt chart: one row per request, coloured by state, with a mark where each request finished."""
    fig = go.Figure()
    for state in STATES:
        fig.add_bar(name=state, orientation="h", marker_color=STATE_COLORS[state], hoverinfo="text",
                    marker_line_width=0, width=0.8)
    fig.add_scatter(name="finished", mode="markers", hoverinfo="text",
                    marker=dict(symbol="line-ns-open", size=12, line_width=3))
    fig.update_layout(barmode="overlay", width=width, margin=dict(l=60, r=10, t=50, b=35),
                      template="plotly_white",
                      title=dict(text="Requests over steps", font_size=14),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      xaxis_title="step",
                      yaxis=dict(autorange="reversed", type="category"))
    update_timeline_chart(fig, trace, metrics, height)
    return as_widget(fig, widget)


def update_timeline_chart(fig: go.Figure, trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics]
                          | None = None, height: int | None = None, since: int | None = None) -> None:
    d = timeline_data(trace, metrics, since)
    with fig.batch_update():
        for i, state in enumerate(STATES):
            segs = [s for s in d.segments if s.state == state]
            fig.data[i].update(
                y=[s.request for s in segs], base=[s.start - 0.5 for s in segs],
                x=[s.end - s.start for s in segs],
                hovertext=[f"{s.request}: {state}, steps {s.start}–{s.end - 1}" for s in segs])
        fig.data[len(STATES)].update(
            x=[f.step + 0.5 for f in d.finishes], y=[f.request for f in d.finishes],
            hovertext=[f"{f.request} finished at step {f.step}: {f.reason}" for f in d.finishes],
            marker_color=[FINISH_COLORS.get(f.reason, "black") for f in d.finishes])
        first = since if since is not None else trace[0].step if trace else 0
        fig.layout.xaxis.range = [first - 0.5, (trace[-1].step if trace else 0) + 1]
        fig.layout.yaxis.categoryarray = d.requests
        fig.layout.yaxis.categoryorder = "array"
        fig.layout.height = height or min(900, 110 + 18 * max(len(d.requests), 4))
