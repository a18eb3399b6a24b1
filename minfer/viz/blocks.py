"""Block occupancy: the KV pool as a grid of cups, from one ``PoolSnapshot``.

Each block is a cell. Its colour is its owner; its *fill level* is how many of its ``block_size`` slots
hold tokens (a request's last block is usually partly empty: that is the internal waste, at most one
block per request). A hatched cell is *shared* -- several block tables hold it (a prefix-cache hit).
A thick dark rim marks a block whose prefix hash is indexed, so a later request with the same prefix can
take it back -- also after it was freed ("free but cached": an empty cell with a thick rim). Free blocks are
light grey cells with a thin rim.

``grid_data`` computes the cells (tests check them); ``grid_figure`` draws them as plotly JSON with two bar
traces -- the cell outlines (one bar per block shown) and the fill levels (one bar per block in use) -- and
the owners' names inside the cells when they fit; ``block_grid`` makes that a ``go.Figure``.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from minfer.kv.block_pool import PoolSnapshot
from minfer.units import ceil_div
from minfer.viz.style import (
    BLOCK_RIM,
    CACHED_RIM,
    DARK_TEXT,
    EMPTY_SLOT,
    FREE_BLOCK,
    ColorMap,
    as_figure,
    figure,
    text_color,
)

CELL = 0.9  # a cell's side; the gap between cells is 1 - CELL


@dataclass(slots=True)
class GridData:
    """Per block shown (ids ``0 .. len(blocks) - 1``): where it sits, who holds it, how full it is."""

    block_size: int
    num_blocks: int  # in the pool (more than shown when the pool is larger than ``max_blocks``)
    columns: int
    blocks: list[int]
    row: list[int]
    col: list[int]
    owners: list[list[str]]  # [] = free; more than one = shared
    filled: list[int]  # token slots filled
    ref_counts: list[int]
    cached: list[bool]
    utilization: float  # of the whole pool
    internal_waste: int  # empty slots inside blocks in use, whole pool
    num_shared: int  # blocks held by more than one table, whole pool
    num_free_cached: int  # free blocks that still carry a prefix hash, whole pool

    @property
    def used(self) -> list[int]:
        """Positions (in the shown blocks) of the blocks in use."""
        return [i for i, r in enumerate(self.ref_counts) if r > 0]


def default_columns(num_blocks: int) -> int:
    """16 cells to a row (big enough to read from the back of a lecture hall), 32 for large pools."""
    return 16 if num_blocks <= 256 else 32


def grid_data(snapshot: PoolSnapshot, columns: int | None = None, max_blocks: int = 1024) -> GridData:
    """Lay blocks ``0 .. min(num_blocks, max_blocks) - 1`` out row by row, ``columns`` to a row."""
    s = snapshot
    n = min(s.num_blocks, max_blocks)
    columns = columns or default_columns(n)
    owners = s.owners()
    free = set(s.free)
    return GridData(
        block_size=s.block_size, num_blocks=s.num_blocks, columns=columns, blocks=list(range(n)),
        row=[b // columns for b in range(n)], col=[b % columns for b in range(n)], owners=owners[:n],
        filled=s.filled[:n], ref_counts=s.ref_counts[:n], cached=s.cached[:n], utilization=s.utilization,
        internal_waste=s.internal_waste, num_shared=sum(r > 1 for r in s.ref_counts),
        num_free_cached=sum(s.cached[b] for b in free),
    )


def grid_title(d: GridData) -> tuple[str, str]:
    """The grid's title and subtitle: how full the pool is, and what else the cells show."""
    shown = "" if len(d.blocks) == d.num_blocks else f" (showing blocks 0–{len(d.blocks) - 1})"
    used = round(d.utilization * d.num_blocks)
    return (f"KV blocks: {used}/{d.num_blocks} in use ({d.utilization:.0%}){shown}",
            f"internal waste {d.internal_waste} slots · {d.num_shared} shared (hatched) · "
            f"{d.num_free_cached} free but cached (thick rim)")


def _hover(d: GridData, i: int) -> str:
    b, owners = d.blocks[i], d.owners[i]
    cached = " · cached (reusable prefix)" if d.cached[i] else ""
    if not owners:
        return f"block {b}: free{cached}"
    who = owners[0] if len(owners) == 1 else f"shared by {', '.join(owners)}"
    return f"block {b}: {who} · {d.filled[i]}/{d.block_size} slots · ref count {d.ref_counts[i]}{cached}"


MARGIN = dict(l=10, r=10, t=75, b=10)


def grid_figure(snapshot: PoolSnapshot | None, colors: ColorMap | None = None, columns: int | None = None,
                max_blocks: int = 1024, scale: float = 1.0, title: str | None = None,
                max_height: int | None = None, narrow: bool = False) -> dict:
    """The pool as plotly JSON: colour = owner, fill level = filled slots, hatched = shared, a thick dark
    rim = cached. Square cells: ``layout.meta.aspect`` (rows / columns) lets the browser size the height to
    whatever width the figure gets; the height here is for a 900-pixel-wide figure. ``max_height`` (pixels,
    in ``layout.meta``) caps that height -- a screen that must hold every view -- and the cells stay square:
    the grid gets narrower instead. ``narrow``: laid out for a third of a screen (the lecture layout) -- a
    shorter title and the subtitle in three short lines, so that no text runs past the figure's edge."""
    colors = colors or ColorMap()
    margin = dict(MARGIN, t=round((MARGIN["t"] + 34 * narrow) * scale))
    if snapshot is None:
        return figure(_grid_traces(None, colors, scale), dict(
            title=dict(text=title or "KV blocks: no pool snapshot"), height=160, margin=margin,
            xaxis=dict(visible=False), yaxis=dict(visible=False)), scale)
    d = grid_data(snapshot, columns, max_blocks)
    heading, subtitle = grid_title(d)
    if narrow:
        heading = heading.replace(" in use", "", 1)
        subtitle = subtitle.replace("internal waste", "waste").replace(" · ", "<br>")
    rows = ceil_div(len(d.blocks), d.columns)
    aspect = rows / d.columns
    height = round((900 - 20) * aspect) + margin["t"] + margin["b"]
    layout = dict(
        barmode="overlay", showlegend=False, margin=margin,
        title=dict(text=title or heading, subtitle=dict(text=subtitle, font=dict(size=round(13 * scale)))),
        height=min(height, max_height or height),
        meta=dict(aspect=aspect) | ({"max_height": max_height} if max_height else {}),
        xaxis=dict(visible=False, range=[-0.5, d.columns - 0.5], fixedrange=True),
        yaxis=dict(visible=False, range=[-rows + 0.5, 0.5], scaleanchor="x", fixedrange=True))
    return figure(_grid_traces(d, colors, scale), layout, scale)


def _grid_traces(d: GridData | None, colors: ColorMap, scale: float) -> list[dict]:
    cells = dict(type="bar", name="blocks", hoverinfo="text", width=CELL, showlegend=False, x=[], y=[], base=[])
    tokens = dict(type="bar", name="tokens", hoverinfo="text", width=CELL * 0.8, showlegend=False,
                  x=[], y=[], base=[])
    labels = dict(type="scatter", mode="text", name="owners", hoverinfo="skip", showlegend=False, x=[], y=[],
                  text=[])
    if d is None:
        return [cells, tokens, labels]
    used = d.used
    hues = [colors(d.owners[i][0]) for i in used]
    cells.update(
        x=d.col, y=[CELL] * len(d.blocks), base=[-r - CELL / 2 for r in d.row],
        hovertext=[_hover(d, i) for i in range(len(d.blocks))],
        marker=dict(color=[EMPTY_SLOT if o else FREE_BLOCK for o in d.owners],
                    line=dict(color=[CACHED_RIM if c else BLOCK_RIM for c in d.cached],
                              width=[3 if c else 1 for c in d.cached])))
    tokens.update(
        x=[d.col[i] for i in used], y=[CELL * d.filled[i] / d.block_size for i in used],
        base=[-d.row[i] - CELL / 2 for i in used], hovertext=[_hover(d, i) for i in used],
        marker=dict(color=hues, line=dict(width=0),
                    pattern=dict(shape=["/" if d.ref_counts[i] > 1 else "" for i in used], fgcolor="white",
                                 fgopacity=0.8, solidity=0.3)))
    if d.columns <= 16:  # owner names fit inside the cells
        labels.update(
            x=[d.col[i] for i in used], y=[-d.row[i] for i in used],
            text=[d.owners[i][0] if d.ref_counts[i] == 1 else f"×{d.ref_counts[i]}" for i in used],
            textfont=dict(size=round(12 * scale), color=[_label_color(h, d.filled[i] / d.block_size)
                                                         for h, i in zip(hues, used)]))
    return [cells, tokens, labels]


def _label_color(hue: str, fill: float) -> str:
    """Where the hue reaches the label (the cell's middle), the chips' rule: black or white, whichever
    contrasts more with the hue (``style.text_color``); on the empty part of a cell, black."""
    return text_color(hue) if fill >= 0.6 else DARK_TEXT


def block_grid(snapshot: PoolSnapshot | None, colors: ColorMap | None = None, columns: int | None = None,
               max_blocks: int = 1024, width: int | None = None, scale: float = 1.0) -> go.Figure:
    """The pool as a grid: colour = owner, fill level = filled slots, hatched = shared, dark rim = cached."""
    return as_figure(grid_figure(snapshot, colors, columns, max_blocks, scale), width)
