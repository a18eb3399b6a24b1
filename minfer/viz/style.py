"""The course's figure style: one palette, one template, one way to tell phases from requests.

Two meanings compete for colour in this course's figures: *which request* (a batch chart, the block grid)
and *which phase* a request is in (waiting, prefill, decode, preempted). When both use hues, a reader cannot
tell "r4" from "prefill". So the course splits them:

* **Phases** are drawn in neutral greys, light to dark -- waiting, prefill, decode -- plus one alarm colour,
  red, which means *preempted* and nothing else. Each phase also has a *pattern*: prefill hatched, decode
  solid, waiting hollow, preempted crossed. A chart whose colour means the phase uses ``PHASE_COLORS``; a
  chart whose colour means the request keeps the request's hue and shows the phase by its pattern
  (``phase_marker``). Either way the legend reads the same.
* **Requests** take hues from ``REQUEST_HUES``, which holds no grey and no red, so no request can be
  mistaken for a phase (``tests/test_viz.py`` checks the colour distances). ``ColorMap`` hands them out in
  first-seen order; pass one map to every view of a run so a request keeps its hue everywhere. There are
  32 of them: 32 requests on screen get 32 colours (past that, a colour comes back and the name tells).
* **Text is a chip**: a request named in text (the narration, the legend) is written on its hue, in black
  or white, whichever contrasts more (``text_color``): WCAG's 4.5:1 for text is met on every hue, where a
  name written *in* its hue on a light page is not (gold on grey is 1.7:1).
* **For a projector**: the phases' colours stay apart in simulated colour-blind vision (``colorblind``),
  and a state's fill is strong enough to see against white (``WAITING_FILL``, ``STALLED_FILL``); a
  projector washes out the faint tints a laptop screen still shows.
* **One template**: white background, one font whose size is scaled by one factor (presentation mode: 1x on
  a laptop, 2x for the back row), no fixed width (figures fill the notebook), titled numeric axes.

``figure(data, layout)`` builds plain plotly JSON with the style applied -- the dashboard sends these dicts
to the browser (building a ``go.Figure`` validates every value and costs ~50x more); ``as_figure`` wraps
one in a ``go.Figure`` for a chapter, and ``apply(fig)`` restyles a figure built any other way.
``check_figure`` lists what breaks the style (an untitled numeric axis, a fixed width, another template):
the checklist in ``docs/architecture.md``, as code.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

# ---- colours -------------------------------------------------------------------------------------------

PHASES = ("waiting", "stalled", "prefill", "decode", "preempted")
PHASE_COLORS = {
    "waiting": "#cdd2d8",  # arrived, queued, never ran yet
    "stalled": "#a9b0b8",  # holds blocks but computed nothing this step (no budget left for it)
    "prefill": "#858d98",  # computing prompt tokens (a chunk per step)
    "decode": "#343c46",  # one new token per step
    "preempted": "#c1121f",  # lost its blocks; queued again, will recompute. The only red in the course.
}
# The greys go light to dark as a request does more (waiting, stalled, prefill, decode), each step at least
# 12 L* apart: greys look the same to every kind of colour vision, so the phases cannot merge for anyone.
# The alarm is a crimson rather than a scarlet (#d62728): in simulated deuteranopia scarlet turns into the
# olive and ochre of some request hues, crimson stays apart from them (tests/test_viz.py simulates it).
PHASE_LABELS = {"waiting": "waiting", "stalled": "holds blocks, no budget", "prefill": "prefill (hatched)",
                "decode": "decode (solid)", "preempted": "preempted (crossed)"}
ALARM = PHASE_COLORS["preempted"]

# Speculative decoding splits a decode's bar in the tokens-per-step chart: the verified token (the decode's own,
# solid), then the guesses the model kept and those it threw away. They are parts of a decode, not phases of a
# request's life (the timeline never shows them), so they have their own names -- and, like the phases, patterns
# over the request's hue: kept guesses are tokens like the decode's (full hue, striped across like a stack of
# tokens), rejected ones were computed and rolled back (hollow: a faint tint inside the outline, hatched the other
# way from prefill). Not red: a wrong guess costs a row of arithmetic, not a request's blocks.
GUESSES = ("accepted", "rejected")
GUESS_LABELS = {"verified": "decode: the verified token (solid)", "accepted": "accepted guesses (striped)",
                "rejected": "rejected guesses (hollow)"}
REJECTED_FILL = 0.2  # a rejected guess's tint of its request's hue: present, and plainly not a kept token

# Saturated hues, far from the greys and from red, and from each other (a test checks the distances). The
# first twelve are hand-picked; the other twenty were picked one at a time as the colour farthest (CIE L*a*b*)
# from every colour before it, among those of medium lightness (L* 30-76) and clear chroma (35-80) that keep
# away from the greys and the alarm. Past 32 requests colours repeat; hover text and labels name the request.
REQUEST_HUES: tuple[str, ...] = (
    "#1f77b4",  # blue
    "#ff7f0e",  # orange
    "#2ca02c",  # green
    "#9467bd",  # purple
    "#17becf",  # cyan
    "#bcbd22",  # olive
    "#e377c2",  # pink
    "#8c564b",  # brown
    "#0d47a1",  # deep blue
    "#f2b701",  # gold
    "#00897b",  # teal
    "#a6761d",  # ochre
    "#3c5a0f", "#ff2d87", "#96c387", "#ff9696", "#a50096", "#871e5a", "#00d296", "#e178ff", "#6978ff", "#a5b4ff",
    "#ffa569", "#5a2da5", "#00874b", "#78962d", "#4bc3ff", "#0f96ff", "#c3b469", "#87c32d", "#c36987", "#ff5ad2",
)
COLORWAY = REQUEST_HUES[:12]  # plotly's automatic trace colours: a chart of more unnamed traces needs names

# How strongly a request's hue fills a bar in each state, over white: a waiting request is a light tint inside
# its outline, a stalled one a stronger tint; prefill and decode are the full hue. Each level is at least 12
# delta E from white and from the next level for every request hue (a test checks it): 12% was too faint
# to see on a projector.
WAITING_FILL = 0.3
STALLED_FILL = 0.6

DARK_TEXT = "#000000"  # the two colours a chip's text can take (text_color picks one)
LIGHT_TEXT = "#ffffff"
MIN_TEXT_CONTRAST = 4.5  # WCAG 2 level AA for body text

FREE_BLOCK = "#f1f3f5"  # a free KV block: a light cell with a visible rim
BLOCK_RIM = "#9aa3ad"
EMPTY_SLOT = "#ffffff"  # the unfilled part of a block in use (internal waste)
CACHED_RIM = "#111111"  # a thick dark rim: the block's prefix hash is indexed (reusable)
REFERENCE_LINE = "#111111"  # pool size, SLO lines: black, dashed
NEUTRAL = "#5d6d7e"  # a measured quantity that is neither a phase nor a request (latency histograms)


class ColorMap:
    """Request id → hue, in first-seen order (stable for the life of a dashboard or a chapter's figures)."""

    def __init__(self) -> None:
        self._colors: dict[str, str] = {}

    def __call__(self, request_id: str) -> str:
        color = self._colors.get(request_id)
        if color is None:
            color = self._colors[request_id] = REQUEST_HUES[len(self._colors) % len(REQUEST_HUES)]
        return color

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._colors

    def text(self, request_id: str) -> str:
        """The colour a name written on this request's hue takes (black or white, by contrast)."""
        return text_color(self(request_id))

    def items(self) -> list[tuple[str, str]]:
        """(request id, hue) in the order the requests were first drawn: the request legend."""
        return list(self._colors.items())


def rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def phase_marker(phase: str, hues: Sequence[str]) -> dict:
    """Bar marker for ``phase`` over bars whose colour is their request's hue: the phase as a pattern.
    Preempted bars take the alarm red instead: a preempted request holds nothing, its hue would mislead."""
    n = len(hues)
    if phase == "preempted":
        return dict(color=[rgba(ALARM, 0.18)] * n, line=dict(color=ALARM, width=1.5),
                    pattern=dict(shape="x", fgcolor=ALARM, size=7, solidity=0.25))
    if phase == "waiting":  # hollow: a faint fill inside the request's outline
        return dict(color=[rgba(h, WAITING_FILL) for h in hues], line=dict(color=list(hues), width=1.5))
    if phase == "stalled":
        return dict(color=[rgba(h, STALLED_FILL) for h in hues], line=dict(color=list(hues), width=1),
                    pattern=dict(shape=".", fgcolor="white", fgopacity=0.9, size=6))
    if phase == "prefill":
        return dict(color=list(hues), line=dict(color=list(hues), width=0.5),
                    pattern=dict(shape="/", fgcolor="white", fgopacity=0.75, size=8, solidity=0.3))
    return dict(color=list(hues), line=dict(color=list(hues), width=0.5))  # decode: solid


def guess_marker(kind: str, hues: Sequence[str]) -> dict:
    """Bar marker for a decode's ``accepted`` or ``rejected`` guesses, over bars in their request's hue."""
    if kind == "accepted":
        # bgcolor named, not left to default to the marker's colour: a legend swatch would draw it white
        return dict(color=list(hues), line=dict(color=list(hues), width=0.5),
                    pattern=dict(shape="-", fgcolor="white", bgcolor=list(hues), fgopacity=0.9, size=5, solidity=0.7))
    if kind == "rejected":
        return dict(color=[rgba(h, REJECTED_FILL) for h in hues], line=dict(color=list(hues), width=1.5),
                    pattern=dict(shape="\\", fgcolor=list(hues), fgopacity=0.9, size=6, solidity=0.15))
    raise ValueError(f"kind must be one of {GUESSES}, got {kind!r}")


def legend_entry(name: str, marker: dict, group: str | None = None) -> dict:
    """A legend-only bar trace: the legend shows exactly this swatch, not the first bar of a data trace
    (whose colour is some request's)."""
    trace = dict(type="bar", name=name, x=[None], y=[None], marker=marker, showlegend=True, hoverinfo="skip")
    if group:
        trace["legendgroup"] = group
    return trace


def phase_legend(phases: Sequence[str]) -> list[dict]:
    """Legend swatches for phases, in neutral grey with their pattern (red for preempted)."""
    out = []
    for p in phases:
        m = phase_marker(p, [PHASE_COLORS["prefill"] if p != "decode" else PHASE_COLORS["decode"]])
        out.append(legend_entry(PHASE_LABELS[p], _scalar_marker(m), group=f"phase:{p}"))
    return out


def guess_legend() -> list[dict]:
    """Legend swatches for a decode under speculative decoding, in the decode's grey with their patterns: its
    verified token (the decode swatch, renamed), then its accepted and rejected guesses."""
    grey = [PHASE_COLORS["decode"]]
    verified = legend_entry(GUESS_LABELS["verified"], _scalar_marker(phase_marker("decode", grey)),
                            group="phase:decode")
    return [verified] + [legend_entry(GUESS_LABELS[g], _scalar_marker(guess_marker(g, grey)), group=f"guess:{g}")
                         for g in GUESSES]


def request_legend(colors: ColorMap, requests: Sequence[str], labels: Mapping[str, str] | None = None,
                   limit: int = 24) -> list[dict]:
    """Legend swatches for requests (at most ``limit``: beyond that a legend is longer than the chart)."""
    if len(requests) > limit:
        return []
    return [legend_entry((labels or {}).get(r, r), dict(color=colors(r)), group=r) for r in requests]


def _scalar_marker(marker: dict) -> dict:
    """A per-bar marker (lists) turned into one swatch's marker (the first value of each list)."""
    out: dict = {}
    for k, v in marker.items():
        out[k] = _scalar_marker(v) if isinstance(v, dict) else v[0] if isinstance(v, list) else v
    return out


# ---- the template --------------------------------------------------------------------------------------

TEMPLATE_NAME = "minfer"
FONT = "Inter, 'Helvetica Neue', Arial, sans-serif"
FONT_SIZE = 13  # at scale 1; titles are 1.3x, plotly derives ticks, legends and hover text from it
_AXIS = dict(gridcolor="#e6e8eb", linecolor="#9aa3ad", zeroline=False, ticks="outside", tickcolor="#9aa3ad",
             showline=True, automargin=True, title=dict(standoff=8))
TEMPLATE_LAYOUT: dict[str, Any] = dict(
    paper_bgcolor="white", plot_bgcolor="white", colorway=list(COLORWAY), font=dict(family=FONT, color="#1f2328"),
    xaxis=_AXIS, yaxis=_AXIS, hoverlabel=dict(font=dict(family=FONT)), bargap=0.15,
    legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", bgcolor="rgba(255,255,255,0.8)"),
    title=dict(x=0, xanchor="left", xref="paper", y=1.0, yref="container", yanchor="top", pad=dict(t=8)),
)


def template() -> go.layout.Template:
    """The course template as a plotly object (``fig.update_layout(template=style.template())``)."""
    return go.layout.Template(layout=TEMPLATE_LAYOUT)


def use_course_template() -> None:
    """Make the course template plotly's default for this session (chapters call it once at the top)."""
    import plotly.io as pio

    pio.templates[TEMPLATE_NAME] = template()
    pio.templates.default = TEMPLATE_NAME


def scaled_height(height: float, scale: float) -> int:
    """Bigger fonts need more room: a figure grows by half as much as its font."""
    return round(height * (1 + 0.5 * (scale - 1)))


def figure(data: list[dict], layout: dict, scale: float = 1.0) -> dict:
    """Plain plotly JSON in the course style: the template, one font size for everything (``scale`` times
    the base), titles 1.3x, and no width -- the figure fills its container."""
    base = dict(template=dict(layout=TEMPLATE_LAYOUT), font=dict(size=round(FONT_SIZE * scale, 1)),
                autosize=True)
    out = _merge(base, layout)
    title = out.get("title")
    if isinstance(title, dict):
        title.setdefault("font", {}).setdefault("size", round(FONT_SIZE * 1.3 * scale, 1))
    out.pop("width", None)
    return {"data": data, "layout": out}


def apply(fig: go.Figure, scale: float = 1.0) -> go.Figure:
    """Put a figure built elsewhere (plotly express, ``make_subplots``) into the course style, in place:
    the template, the scaled font, no fixed width."""
    fig.update_layout(template=template(), font_size=round(FONT_SIZE * scale, 1), autosize=True, width=None)
    fig.update_layout(title_font_size=round(FONT_SIZE * 1.3 * scale, 1))
    return fig


def as_figure(spec: dict, width: int | None = None) -> go.Figure:
    """A ``go.Figure`` from a ``figure`` dict, for a chapter (``width``: only where a page needs one)."""
    fig = go.Figure(spec)
    if width:
        fig.update_layout(width=width)
    return fig


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def nice_step(span: float, target: int = 10) -> float:
    """A round tick or bin size (1, 2 or 5 times a power of ten) giving about ``target`` intervals."""
    if span <= 0:
        return 1.0
    raw = span / target
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def step_axis(first: int, last: int, **extra: Any) -> dict:
    """An x axis over engine steps ``first..last``: integer ticks only (never 'step 2.5'), titled."""
    span = max(last - first, 1)
    axis = dict(title=dict(text="step"), range=[first - 0.5, last + 0.5], tick0=0,
                dtick=max(1, int(nice_step(span))), tickformat="d")
    return axis | extra


# ---- checks ----------------------------------------------------------------------------------------------


def check_figure(fig: go.Figure | Mapping) -> list[str]:
    """What breaks the course style in ``fig`` (a ``go.Figure`` or plotly JSON): every visible numeric
    axis titled, no fixed width, the course template. An empty list: nothing to fix."""
    spec = fig.to_plotly_json() if isinstance(fig, go.Figure) else fig
    layout = spec.get("layout", {})
    problems = []
    if layout.get("width"):
        problems.append(f"fixed width {layout['width']} px (leave it out: the figure fills the notebook)")
    tpl = layout.get("template")
    tpl_layout = tpl.get("layout", {}) if isinstance(tpl, Mapping) else getattr(tpl, "layout", None)
    if not tpl_layout or _plain(tpl_layout).get("colorway") != list(COLORWAY):
        problems.append("not the course template (minfer.viz.style.figure or use_course_template())")
    axes = {k for k in layout if k.startswith(("xaxis", "yaxis"))}
    for trace in spec.get("data", []):  # axes a trace uses, even if the layout never mentions them
        axes |= {_axis_name(trace.get("xaxis", "x")), _axis_name(trace.get("yaxis", "y"))}
    for name in sorted(axes):
        ax = layout.get(name, {})
        if ax.get("visible") is False or ax.get("type") in ("category", "multicategory"):
            continue
        if _axis_is_categorical(spec, name):  # bars named by label, boxes by name: the labels say it all
            continue
        if ax.get("matches") or ax.get("showticklabels") is False:  # shares a titled axis (stacked panels)
            continue
        if not _axis_has_data(spec, name) and name not in layout:
            continue
        title = ax.get("title")
        text = title.get("text") if isinstance(title, Mapping) else title
        if not text:
            problems.append(f"{name} has no title (say what is counted, with units)")
    return problems


def _plain(obj: Any) -> dict:
    return obj.to_plotly_json() if hasattr(obj, "to_plotly_json") else dict(obj)


def _axis_name(ref: str) -> str:
    return ("xaxis" if ref.startswith("x") else "yaxis") + ref[1:]


def _axis_is_categorical(spec: Mapping, name: str) -> bool:
    """Every trace on this axis places its points by label (strings, or a box's name where it has no values
    along this axis): plotly draws a category axis, which needs no title with units."""
    traces = _traces_on(spec, name)
    letter = name[0]

    def by_label(trace: Mapping) -> bool:
        values = trace.get(letter)
        if values is None:  # a vertical box sits at its name on x; a horizontal one at its name on y
            across = "v" if letter == "x" else "h"
            return trace.get("type") in ("box", "violin") and trace.get("orientation", "v") == across
        if isinstance(values, Mapping):  # plotly's typed-array encoding: numbers
            return False
        return len(values) > 0 and all(isinstance(v, str) for v in values)

    return bool(traces) and all(by_label(t) for t in traces)


def _traces_on(spec: Mapping, name: str) -> list[Mapping]:
    """The traces drawn against axis ``name`` ("xaxis2" -> traces whose ``xaxis`` is "x2"; unset means "x")."""
    ref = name[0] + name[5:]
    key = name[:5]
    return [t for t in spec.get("data", []) if t.get(key, ref[0]) == ref]


def _axis_has_data(spec: Mapping, name: str) -> bool:
    return bool(_traces_on(spec, name))


# ---- colour distance (for tests and for anyone adding a colour) ------------------------------------------


def lab(hex_color: str) -> tuple[float, float, float]:
    """CIE L*a*b* of an sRGB colour (D65): distances here match how different two colours look."""
    rgb = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    x = (0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    z = (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def color_distance(a: str, b: str) -> float:
    """CIE76 delta E between two hex colours: below ~10 most people see 'the same colour'."""
    return math.dist(lab(a), lab(b))


def saturation(hex_color: str) -> float:
    """HLS saturation (0 for greys): request hues must be clearly chromatic."""
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(r, g, b)[2]


def blend(hex_color: str, alpha: float, under: str = "#ffffff") -> str:
    """The opaque colour ``hex_color`` at opacity ``alpha`` makes over ``under`` (what a translucent fill
    looks like on the page): the colour to measure contrast and distance on."""
    top, bottom = _rgb255(hex_color), _rgb255(under)
    return "#" + "".join(f"{round(b + (t - b) * alpha):02x}" for t, b in zip(top, bottom))


# ---- contrast (WCAG 2) -------------------------------------------------------------------------------------


def _rgb255(hex_color: str) -> tuple[int, int, int]:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return r, g, b


def relative_luminance(hex_color: str) -> float:
    """WCAG's relative luminance: linear-light sRGB weighted by how bright each primary looks to the eye
    (green most, blue least); 0 for black, 1 for white."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (v / 255 for v in _rgb255(hex_color))]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: str, b: str) -> float:
    """WCAG's contrast ratio of two colours, 1 (the same) to 21 (black on white), in either order. Text needs
    4.5 (``MIN_TEXT_CONTRAST``); the 0.05 stands for the glare a real screen adds to both."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_color(background: str) -> str:
    """Black or white text for a name written on ``background``, whichever contrasts more. One of them always
    reaches 4.58:1 (the worst background, a luminance of about 0.18, is equally far from both), so a chip of
    any hue meets the 4.5:1 that text needs."""
    dark, light = contrast_ratio(background, DARK_TEXT), contrast_ratio(background, LIGHT_TEXT)
    return DARK_TEXT if dark >= light else LIGHT_TEXT


# ---- colour vision deficiency (for tests and for anyone adding a colour) -------------------------------------

# Machado, Oliveira and Fernandes (2009), severity 1.0: linear sRGB -> linear sRGB as a dichromat sees it.
_CVD = {
    "protan": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deutan": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritan": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}
CVD_KINDS = tuple(_CVD)


def colorblind(hex_color: str, kind: str) -> str:
    """``hex_color`` as someone with no working L (protan), M (deutan) or S (tritan) cones sees it: about one
    man in twelve has a red-green deficiency, so two colours a lecture must tell apart have to stay apart
    here too."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (v / 255 for v in _rgb255(hex_color))]
    seen = [min(max(sum(m * c for m, c in zip(row, lin)), 0.0), 1.0) for row in _CVD[kind]]
    srgb = [12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055 for c in seen]
    return "#" + "".join(f"{round(c * 255):02x}" for c in srgb)
