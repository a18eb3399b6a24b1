"""One picture of a run at one step: everything the dashboard shows, as plain JSON.

``dashboard_frame(recording, index, ...)`` returns the five figures (plotly JSON from the view modules),
the status line, the narration line ("what the scheduler decided") and the legend, for the state after
step ``index`` of a recording. The notebook widget sends one frame to the browser per redraw; the HTML
export writes one frame per step into a file. Both draw frames with the same JavaScript
(``static/views.js``), so the export looks exactly like the dashboard.

``index = -1`` is the moment before the first step: no steps yet, and the pool as the engine has it
(``snapshot``, all blocks free).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass

from minfer.kv.block_pool import PoolSnapshot
from minfer.trace import StepTrace
from minfer.viz.batch import batch_figure, timeline_data, timeline_figure
from minfer.viz.blocks import grid_figure
from minfer.viz.latency import latency_figure
from minfer.viz.narration import quiet, request_info, sentences
from minfer.viz.queues import queue_figure
from minfer.viz.recorder import Recording
from minfer.viz.style import (
    ALARM,
    GUESS_LABELS,
    PHASE_COLORS,
    PHASE_LABELS,
    REJECTED_FILL,
    STALLED_FILL,
    WAITING_FILL,
    ColorMap,
    rgba,
    scaled_height,
    text_color,
)


@dataclass(slots=True, frozen=True)
class ViewHeights:
    """Each view's height in CSS pixels at font scale 1; bigger fonts grow them by ``growth`` times as much
    as the font (a tall view has room to spare; a short one needs all of it: its axis titles grow too).
    ``None`` for the timeline: as tall as its rows need; for the grid: as tall as square cells need."""

    batch: int
    timeline: int | None
    grid: int | None  # the most the block grid may take (its cells stay square: it gets narrower)
    queues: int
    latency: int
    growth: float = 0.5  # style.scaled_height's rule

    def at(self, height: int, scale: float) -> int:
        """``height`` at font ``scale``."""
        return round(height * (1 + self.growth * (scale - 1)))

    def base(self, height: int, scale: float) -> int:
        """What to pass a view that grows ``height`` by ``style.scaled_height`` itself, to get ``at``."""
        return round(self.at(height, scale) / (scaled_height(1000, scale) / 1000))


# "notebook": each view as tall as it reads best, one under another (the pair queues/latency side by side
# when there is room) -- scroll to see them all. "lecture": the five views in two rows (the two step charts
# and the block grid, then queues and latency; at big fonts two columns), short enough that controls,
# status, narration and every view fit a 1366x768 projector at font scale 1 (static/dashboard.css places
# them; the browser test measures the fit).
LAYOUTS: dict[str, ViewHeights] = {
    "notebook": ViewHeights(batch=300, timeline=None, grid=None, queues=380, latency=300),
    "lecture": ViewHeights(batch=190, timeline=190, grid=190, queues=220, latency=220, growth=1.0),
}


@dataclass(slots=True)
class FrameOptions:
    """How a dashboard draws: the views' window, the SLO lines, the presentation font scale and layout."""

    window: int | None = 200  # steps shown in the step charts (None: all)
    ttft_slo: float | None = None  # seconds
    itl_slo: float | None = None
    scale: float = 1.0  # font scale: 1 on a laptop, up to 2 for the back of a lecture hall
    layout: str = "notebook"  # a key of LAYOUTS: "notebook" (scroll through the views) or "lecture" (one screen)

    def __post_init__(self) -> None:
        check_layout(self.layout)

    @property
    def heights(self) -> ViewHeights:
        return LAYOUTS[self.layout]


def check_layout(layout: str) -> str:
    """``layout`` if it is one of ``LAYOUTS``; a ValueError naming the choices otherwise."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def dashboard_frame(rec: Recording, index: int, colors: ColorMap, options: FrameOptions,
                    snapshot: PoolSnapshot | None = None, state: str = "", extra: str = "") -> dict:
    """The dashboard after step ``index`` of ``rec`` (-1: before the first step; ``snapshot`` is then the
    pool to show). ``state`` (e.g. "running at 2 steps/s") and ``extra`` (GPU memory) join the status."""
    trace = rec.trace[: index + 1]
    shown = trace[-options.window:] if options.window else trace
    since = shown[0].step if shown else None
    timeline = timeline_data(trace, rec.metrics, since)
    seen = timeline.requests  # the rows on screen, in order of first appearance
    for rid in seen:  # a request's hue is fixed the first time it is drawn, the same in every view
        colors(rid)
    kept = rec.snapshot_at(index) if index >= 0 else None
    grid_title = None
    if index >= 0 and kept is not None and kept[0] != index:
        grid_title = f"KV blocks after step {rec.trace[kept[0]].step} (no snapshot kept for this step)"
    pool = kept[1] if kept else snapshot if index < 0 else None
    s, h = options.scale, options.heights
    narrow = options.layout == "lecture"  # the grid gets a third of the width
    views = {
        "batch": batch_figure(shown, colors, s, legend=False, height=h.base(h.batch, s)),
        "timeline": timeline_figure(trace, rec.metrics, colors, since, s, legend=False, data=timeline,
                                    height=h.at(h.timeline, s) if h.timeline else None),
        "grid": grid_figure(pool, colors, scale=s, title=grid_title,
                            max_height=h.at(h.grid, s) if h.grid else None, narrow=narrow),
        "queues": queue_figure(shown, s, height=h.base(h.queues, s)),
        "latency": latency_figure(rec.metrics, options.ttft_slo, options.itl_slo,
                                  until=trace[-1].end_time if trace else 0.0, scale=s,
                                  height=h.base(h.latency, s)),
    }
    return {"step": index, "step_number": trace[-1].step if trace else None, "scale": s,
            "layout": options.layout, "views": views,
            "status": status_html(rec, index, state, extra),
            "narration": narration_html(trace[-1] if trace else None, colors),
            "legend": legend_html(colors, seen, request_info(trace),
                                  speculative=any(t.draft_tokens for t in shown))}


def status_html(rec: Recording, index: int, state: str = "", extra: str = "") -> str:
    tail = f" · {html.escape(state)}" if state else ""
    more = f"<br>{extra}" if extra else ""
    if index < 0 or not rec.trace:
        return f"<b>no steps yet</b>: press <b>Step</b> or <b>Run</b>{tail}{more}"
    t = rec.trace[index]
    preempted = sum(len(s.preempted) for s in rec.trace[: index + 1])
    finished = sum(len(s.finished) for s in rec.trace[: index + 1])
    used = t.num_blocks - t.num_free_blocks
    guessed = (f", {sum(t.draft_tokens.values())} guessed, {sum(t.accepted_tokens.values())} accepted"
               if t.draft_tokens else "")
    return (f"<b>step {t.step}</b> (steps {rec.trace[0].step}–{rec.trace[-1].step}) · engine clock "
            f"{t.end_time:.3f} s · batch {t.batch_size} ({t.num_prefill_tokens} prefill + {t.num_decode_tokens} "
            f"decode tokens{guessed}) · running {t.num_running} · waiting {t.num_waiting} · finished {finished} · "
            f"preemptions {preempted} · blocks {used}/{t.num_blocks}{tail}{more}")


def chip(text: str, background: str) -> str:
    """``text`` on a ``background`` chip, in black or white by contrast (``style.text_color``): a name in its
    request's hue that reads at 4.5:1 from the back of a hall, where text written *in* the hue does not."""
    return (f"<span class='minfer-name' style='background:{background};color:{text_color(background)}'>"
            f"{html.escape(text)}</span>")


def _name(request: str, colors: ColorMap) -> str:
    return chip(request, colors(request))


def named_requests(t: StepTrace) -> set[str]:
    """Every request step ``t`` can mention: its decisions' requests (and who caused a preemption), and who
    was admitted, computed, preempted or finished."""
    out = {*t.admitted, *t.preempted, *t.finished, *t.prefill_tokens, *t.decode_tokens}
    for d in t.decisions:
        out.add(d.request)
        by = getattr(d, "by", None)
        if isinstance(by, str) and by:
            out.add(by)
    return out


def mark_names(text: str, requests: Iterable[str], colors: ColorMap) -> str:
    """``text`` (plain words) as HTML with every whole-word mention of one of ``requests`` made a chip: the
    narration's phrases name other requests too ("r7 needed a block")."""
    ids = sorted((r for r in requests if r), key=len, reverse=True)  # "r10" before "r1"
    if not ids:
        return html.escape(text)
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, ids)) + r")(?![\w-])")
    out, last = [], 0
    for m in pattern.finditer(text):
        out += [html.escape(text[last:m.start()]), _name(m.group(1), colors)]
        last = m.end()
    return "".join(out) + html.escape(text[last:])


def narration_html(t: StepTrace | None, colors: ColorMap) -> str:
    """The narration line with each request named on a chip of its hue (the words: ``narration``)."""
    if t is None:
        return "the scheduler has not decided anything yet"
    named = named_requests(t)
    parts = []
    for s in sentences(t):
        verb = chip("preempted", ALARM) if s.kind == "preempted" else html.escape(s.kind)
        parts.append(f"{verb} {_name(s.request, colors)} ({mark_names(s.why, named, colors)})")
    return f"<b>step {t.step}</b> · " + " · ".join(parts or [mark_names(quiet(t), named, colors)])


def _swatch(style: str) -> str:
    return f"<span class='minfer-swatch' style='{style}'></span>"


def _hatch(color: str, stripe: str = "rgba(255,255,255,0.75)") -> str:
    return f"background:{color} repeating-linear-gradient(135deg,{stripe} 0 2px,transparent 2px 6px)"


_GREY = PHASE_COLORS["prefill"]  # the phase legend's swatches are one grey, told apart by fill and pattern
PHASE_SWATCHES = {
    "waiting": f"background:{rgba(_GREY, WAITING_FILL)};border:1.5px solid {_GREY}",
    "stalled": f"background:{rgba(_GREY, STALLED_FILL)};border:1px dotted {_GREY}",
    "prefill": _hatch(_GREY),
    "decode": f"background:{PHASE_COLORS['decode']}",
    "preempted": f"background:{rgba(ALARM, 0.18)} repeating-linear-gradient(45deg,{ALARM} 0 1.5px,transparent "
                 f"1.5px 5px);border:1.5px solid {ALARM}",
}
_DARK = PHASE_COLORS["decode"]
GUESS_SWATCHES = {  # style.guess_marker's patterns in the decode's grey: shown only when a guess is on screen
    "accepted": f"background:{_DARK} repeating-linear-gradient(0deg,rgba(255,255,255,0.8) 0 1.5px,transparent "
                "1.5px 5px)",
    "rejected": f"background:{rgba(_DARK, REJECTED_FILL)} repeating-linear-gradient(45deg,{rgba(_DARK, 0.6)} 0 1px,"
                f"transparent 1px 5px);border:1.5px solid {_DARK}",
}


def _entry(style: str, label: str) -> str:
    return f"<span class='minfer-chip'>{_swatch(style)}<span>{html.escape(label)}</span></span>"


def legend_html(colors: ColorMap, requests: list[str], info: dict[str, str] | None = None,
                limit: int = 32, speculative: bool = False) -> str:
    """One legend for every view: phases by pattern, requests as chips of their hue (with tenant and priority
    if set); past ``limit`` requests (as many as there are distinct hues), a count (hover and labels still
    name every request). ``speculative``: guesses are on screen -- the decode swatch is then the verified
    token, followed by the accepted and rejected guesses' swatches (without guesses, the legend has none)."""
    chips = ["<span class='minfer-legend-title'>phase</span>"]
    for p, style in PHASE_SWATCHES.items():
        if p == "decode" and speculative:
            chips.append(_entry(style, GUESS_LABELS["verified"]))
            chips += [_entry(guess, GUESS_LABELS[g]) for g, guess in GUESS_SWATCHES.items()]
        else:
            chips.append(_entry(style, PHASE_LABELS[p]))
    if requests:
        chips.append("<span class='minfer-legend-title'>requests</span>")
    for rid in requests[:limit]:
        label = f"{rid} · {info[rid]}" if info and info.get(rid) else rid
        chips.append(f"<span class='minfer-chip' data-request='{html.escape(rid)}'>{chip(label, colors(rid))}</span>")
    if len(requests) > limit:
        chips.append(f"<span class='minfer-chip'>… and {len(requests) - limit} more</span>")
    return "".join(chips)
