"""Batch composition: what each step computed, and the life of each request, from a trace alone.

Two views over ``list[StepTrace]``:

* **tokens per step** -- one bar per (step, request) in the request's hue, stacked: decode tokens (one
  per running request, solid) at the bottom, prompt chunks on top, hatched. Continuous batching shows as a
  step mixing hues; chunked prefill as a prompt spread over several steps, each under the token budget.
  With speculative decoding a decode that verified guesses grows: its verified token (solid), then the
  guesses it kept (striped), then those it threw away (hollow) -- ``StepTrace.draft_tokens`` and
  ``accepted_tokens``, per request. The pass computed every one of them; only the kept ones became output.
* **timeline** -- a Gantt chart, one row per request in its hue, its phase as a pattern: waiting (hollow),
  stalled (holds blocks but got no budget this step; dotted), prefill (hatched), decode (solid), preempted
  (lost its blocks, queued to recompute; crossed red), and a mark where it finished.

``batch_data`` and ``timeline_data`` compute the numbers (tests check them); ``*_figure`` turns them into
plain plotly JSON in the course style (what the dashboard sends to the browser), ``*_chart`` into a
``go.Figure`` for a chapter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go

from minfer.request import RequestMetrics
from minfer.trace import StepTrace
from minfer.viz.narration import QUEUE_ENDINGS, ending, request_info, row_label
from minfer.viz.style import (
    PHASES,
    ColorMap,
    as_figure,
    figure,
    guess_legend,
    guess_marker,
    phase_legend,
    phase_marker,
    request_legend,
    scaled_height,
    step_axis,
)

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
    totals: list[int]  # tokens computed per step (the bar heights), guesses included
    accepted: Bars = field(default_factory=Bars)  # guesses kept, on their decode's token (position: the first)
    rejected: Bars = field(default_factory=Bars)  # guesses thrown away, on the kept ones
    guesses: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)  # (step, request) → (guessed,
    # accepted): every decode that verified guesses, even if it kept none or all of them

    @property
    def speculative(self) -> bool:
        """Some decode drawn verified guesses: the chart needs the guesses' legend (and only then)."""
        return bool(self.guesses)


def batch_data(trace: Sequence[StepTrace]) -> BatchData:
    """One bar per (step, request) that computed tokens, decodes stacked under prefill chunks; a decode's
    guesses, if it had any, stacked on its token: the accepted ones, then the rejected ones."""
    prefill, decode, accepted, rejected = Bars(), Bars(), Bars(), Bars()
    guesses: dict[tuple[int, str], tuple[int, int]] = {}
    for t in trace:
        base = 0
        for rid, n in t.decode_tokens.items():
            at = t.positions.get(rid, 0)
            decode.add(t.step, rid, base, n, at)
            base += n
            k = t.draft_tokens.get(rid, 0)
            if not k:
                continue
            a = t.accepted_tokens.get(rid, 0)
            guesses[t.step, rid] = (k, a)
            for bars, count, first in ((accepted, a, at + n), (rejected, k - a, at + n + a)):
                if count:
                    bars.add(t.step, rid, base, count, first)
                    base += count
        for rid, n in t.prefill_tokens.items():
            prefill.add(t.step, rid, base, n, t.positions.get(rid, 0))
            base += n
    totals = [t.num_tokens + sum(t.draft_tokens.values()) for t in trace]
    return BatchData(prefill, decode, [t.step for t in trace], totals, accepted, rejected, guesses)


def _guessed(d: BatchData, step: int, request: str) -> str:
    """' · 5 guessed, 3 accepted' for a decode that verified guesses (empty for one that did not)."""
    g = d.guesses.get((step, request))
    return f" · {g[0]} guessed, {g[1]} accepted" if g else ""


def _bars(d: BatchData, colors: ColorMap, part: str) -> dict:
    """One bar trace: ``part`` is a phase (decode, prefill) or a kind of guess (accepted, rejected)."""
    bars: Bars = getattr(d, part)
    rows = list(zip(bars.step, bars.request, bars.position, bars.tokens))
    hues = [colors(r) for r in bars.request]
    if part == "prefill":
        hover = [f"step {s} · {r}: prompt tokens {p}–{p + n - 1} ({n})" for s, r, p, n in rows]
    elif part == "decode":
        hover = [f"step {s} · {r}: decode, token {p}" + (" (verified)" + _guessed(d, s, r) if (s, r) in d.guesses
                                                          else "") for s, r, p, _ in rows]
    else:  # a decode's guesses, at positions p .. p + n - 1
        what = "kept" if part == "accepted" else "rolled back"
        hover = [f"step {s} · {r}: {part} guesses, position{f's {p}–{p + n - 1}' if n > 1 else f' {p}'} ({what})"
                 f"{_guessed(d, s, r)}" for s, r, p, n in rows]
    marker = phase_marker(part, hues) if part in PHASES else guess_marker(part, hues)
    return dict(type="bar", name=part, x=bars.step, y=bars.tokens, base=bars.base, hovertext=hover,
                hoverinfo="text", showlegend=False, marker=marker)


def batch_figure(trace: Sequence[StepTrace], colors: ColorMap | None = None, scale: float = 1.0,
                 legend: bool = True, height: int = 300) -> dict:
    """Tokens per step as plotly JSON: one bar per (step, request) in the request's hue, decode solid at
    the bottom, prompt chunks hatched on top; with speculative decoding a decode's accepted guesses (striped)
    and rejected ones (hollow) on its token, as two more traces -- which a run without guesses does not have.
    ``legend``: the phase (and guess) and request swatches (the dashboard draws its own legend once, above all
    views)."""
    colors = colors or ColorMap()
    d = batch_data(trace)
    data = [_bars(d, colors, "decode"), _bars(d, colors, "prefill")]
    if d.speculative:
        data += [_bars(d, colors, "accepted"), _bars(d, colors, "rejected")]
    if legend:
        seen = list(dict.fromkeys(d.decode.request + d.prefill.request))
        data += guess_legend() + phase_legend(["prefill"]) if d.speculative else phase_legend(["decode", "prefill"])
        data += request_legend(colors, sorted(seen, key=seen.index))
    first, last = (d.steps[0], d.steps[-1]) if d.steps else (0, 9)
    layout = dict(barmode="overlay", height=scaled_height(height, scale), showlegend=legend,
                  title=dict(text="Tokens per step"), margin=dict(l=60, r=20, t=round((45 + 30 * legend) * scale),
                                                                  b=50),
                  xaxis=step_axis(first, last), yaxis=dict(title=dict(text="tokens computed"),
                                                           range=[0, max(d.totals, default=0) * 1.08 or 1]))
    if not d.steps:
        layout["annotations"] = [_no_steps()]
    return figure(data, layout, scale)


def batch_chart(trace: Sequence[StepTrace], colors: ColorMap | None = None, height: int = 300,
                width: int | None = None, scale: float = 1.0, legend: bool = True) -> go.Figure:
    """Tokens per step, one coloured bar per request; prefill hatched, decode solid."""
    return as_figure(batch_figure(trace, colors, scale, legend, height), width)


def _no_steps() -> dict:
    return dict(text="no steps yet", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                font=dict(color="#8a9099"))


# ---- timeline (Gantt) ---------------------------------------------------------------------------

STATES = PHASES  # waiting, stalled, prefill, decode, preempted


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
    reason: str  # its finish reason
    why: str  # ... in words (viz.narration)


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
    finishes = [Finish(rid, t.step, t.finish_reasons.get(rid, ""), ending(t, rid)) for t in trace if t.step >= since
                for rid in t.finished]
    return TimelineData(sorted(first_seen, key=first_seen.__getitem__), segments, finishes)


def timeline_figure(trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics] | None = None,
                    colors: ColorMap | None = None, since: int | None = None, scale: float = 1.0,
                    legend: bool = True, height: int | None = None, data: TimelineData | None = None) -> dict:
    """The Gantt chart as plotly JSON: one row per request in its hue, the phase as a pattern (waiting
    hollow, prefill hatched, decode solid, preempted crossed red), a tick where it finished (an ✕ where it
    was refused). Rows name the tenant and priority when the request had them. ``data``: the
    ``timeline_data(trace, metrics, since)`` already computed, if the caller has it."""
    colors = colors or ColorMap()
    d = data or timeline_data(trace, metrics, since)
    info = request_info(trace)
    label = {r: row_label(r, info) for r in d.requests}
    bars = []
    for phase in STATES:
        segs = [s for s in d.segments if s.state == phase]
        bars.append(dict(
            type="bar", orientation="h", name=phase, showlegend=False, hoverinfo="text", width=0.72,
            y=[label[s.request] for s in segs], base=[s.start - 0.5 for s in segs], x=[s.end - s.start for s in segs],
            hovertext=[f"{s.request}: {phase}, steps {s.start}–{s.end - 1}" for s in segs],
            marker=phase_marker(phase, [colors(s.request) for s in segs])))
    refused = [f.reason in QUEUE_ENDINGS for f in d.finishes]
    bars.append(dict(
        type="scatter", mode="markers", name="finished", showlegend=False, hoverinfo="text",
        x=[f.step + 0.5 for f in d.finishes], y=[label[f.request] for f in d.finishes],
        hovertext=[f"{f.request} {'refused' if r else 'finished'} at step {f.step}: {f.why}"
                   for f, r in zip(d.finishes, refused)],
        marker=dict(symbol=["x-thin-open" if r else "line-ns-open" for r in refused], color="#111111",
                    size=round(14 * scale), line=dict(width=3, color="#111111"))))
    if legend:
        shown = [p for p in STATES if any(s.state == p for s in d.segments)]
        bars += phase_legend(shown) + request_legend(colors, d.requests, label)
    first = since if since is not None else trace[0].step if trace else 0
    last = trace[-1].step if trace else 9
    rows = max(len(d.requests), 3)
    layout = dict(
        barmode="overlay", showlegend=legend, title=dict(text="Requests over steps"),
        height=height or min(1100, round(scale * (26 * rows + 40)) + 110),
        margin=dict(l=60, r=20, t=round((45 + 30 * legend) * scale), b=50),
        xaxis=step_axis(first, last), yaxis=dict(title=dict(text="request"), type="category", autorange="reversed",
                                                 categoryorder="array", categoryarray=[label[r] for r in d.requests]))
    if not trace:
        layout["annotations"] = [_no_steps()]
    return figure(bars, layout, scale)


def request_order(trace: Sequence[StepTrace]) -> list[str]:
    """Request ids in the order they first did anything (admitted, computed, ended): a cheap, stable order
    to hand out colours in, whichever step of a recording is drawn first."""
    seen: dict[str, None] = {}
    for t in trace:
        for rid in (*t.admitted, *t.prefill_tokens, *t.decode_tokens, *t.finished):
            seen.setdefault(rid)
    return list(seen)


def timeline_chart(trace: Sequence[StepTrace], metrics: Mapping[str, RequestMetrics] | None = None,
                   colors: ColorMap | None = None, height: int | None = None, width: int | None = None,
                   scale: float = 1.0, legend: bool = True, since: int | None = None) -> go.Figure:
    """A Gantt chart: one row per request, its phases step by step, and where it finished."""
    return as_figure(timeline_figure(trace, metrics, colors, since, scale, legend, height), width)
