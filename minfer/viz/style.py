"""Colours shared by every view, so one request looks the same in the batch chart and the block grid.

A request's colour is assigned the first time any view asks for it (``ColorMap``); a dashboard passes
one ``ColorMap`` to all its views. Request *states* and block *kinds* have fixed colours of their own.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative

# Enough distinct hues for a lecture's worth of requests; beyond that colours repeat (hover says who).
PALETTE: tuple[str, ...] = tuple(qualitative.Plotly + qualitative.D3 + qualitative.Dark24)

STATE_COLORS = {
    "waiting": "#cfd4da",  # arrived, queued, never ran yet
    "prefill": "#f4a261",  # computing prompt tokens (a chunk per step)
    "decode": "#2a9d8f",  # one new token per step
    "stalled": "#e9e3a6",  # holds blocks but computed nothing this step (no prefill budget left)
    "preempted": "#e63946",  # lost its blocks; queued again, will recompute
}
FINISH_COLORS = {"stop": "#264653", "length": "#264653", "abort": "#6c757d", "rejected": "#9d0208",
                 "timeout": "#9d0208"}

EMPTY_SLOT = "#e9ecef"  # a block in use, slots not yet filled (internal waste)
FREE_BLOCK = "#f8f9fa"  # a free block
CACHED_OUTLINE = "#2d6a4f"  # a block whose prefix hash is indexed: a later request can reuse it
PLAIN_OUTLINE = "#ffffff"


class ColorMap:
    """Request id → palette colour, in first-seen order (stable for the life of a dashboard)."""

    def __init__(self) -> None:
        self._colors: dict[str, str] = {}

    def __call__(self, request_id: str) -> str:
        color = self._colors.get(request_id)
        if color is None:
            color = self._colors[request_id] = PALETTE[len(self._colors) % len(PALETTE)]
        return color


def as_widget(fig: go.Figure, widget: bool) -> go.Figure:
    """A ``FigureWidget`` (live: updates reach the browser) made from a *finished* figure, or the figure.
    Built complete first, so every trace style is in the widget's initial state."""
    return go.FigureWidget(fig) if widget else fig
