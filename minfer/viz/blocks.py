"""Block occupancy: the KV pool as a grid of cups, from one ``PoolSnapshot``.

Each block is a cell. Its colour is its owner; its *fill level* is how many of its ``block_size`` slots
hold tokens (a request's last block is usually partly empty: that is the internal waste, at most one
block per request). A hatched cell is *shared* -- several block tables hold it (a prefix-cache hit).
A green outline marks a block whose prefix hash is indexed, so a later request with the same prefix can
take it back -- also after it was freed ("free but cached": an empty cell with a green outline).

``grid_data`` computes the cells (tests check them); ``block_grid`` draws them as two bar traces: the
cell outlines (one bar per block shown) and the fill levels (one bar per block in use).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from minfer.kv.block_pool import PoolSnapshot
from minfer.units import ceil_div
from minfer.viz.style import CACHED_OUTLINE, EMPTY_SLOT, FREE_BLOCK, PLAIN_OUTLINE, ColorMap, as_widget

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
    return 8 if num_blocks <= 32 else 16 if num_blocks <= 256 else 32


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


def grid_title(d: GridData) -> str:
    shown = "" if len(d.blocks) == d.num_blocks else f" (showing blocks 0–{len(d.blocks) - 1})"
    used = round(d.utilization * d.num_blocks)
    return (f"KV blocks: {used}/{d.num_blocks} in use ({d.utilization:.0%}) · internal waste "
            f"{d.internal_waste} slots<br>{d.num_shared} shared · {d.num_free_cached} free but cached{shown}")


def _hover(d: GridData, i: int) -> str:
    b, owners = d.blocks[i], d.owners[i]
    cached = " · cached (reusable prefix)" if d.cached[i] else ""
    if not owners:
        return f"block {b}: free{cached}"
    who = owners[0] if len(owners) == 1 else f"shared by {', '.join(owners)}"
    return f"block {b}: {who} · {d.filled[i]}/{d.block_size} slots · ref count {d.ref_counts[i]}{cached}"


def block_grid(snapshot: PoolSnapshot | None, colors: ColorMap | None = None, columns: int | None = None,
               max_blocks: int = 1024, widget: bool = False, width: int = 480) -> go.Figure:
    """The pool as a grid: colour = owner, fill level = filled slots, hatched = shared, green = cached."""
    fig = go.Figure()
    fig.add_bar(name="blocks", hoverinfo="text", width=CELL, marker_line_width=2, showlegend=False)
    fig.add_bar(name="tokens", hoverinfo="text", width=CELL * 0.8, marker_line_width=0, showlegend=False,
                marker_pattern=dict(fgcolor="white", fgopacity=0.7))
    fig.add_scatter(name="owners", mode="text", hoverinfo="skip", textfont=dict(size=9, color="#222"),
                    showlegend=False)
    fig.update_layout(barmode="overlay", template="plotly_white", width=width, title=dict(font_size=12),
                      margin=dict(l=10, r=10, t=50, b=10), xaxis=dict(visible=False),
                      yaxis=dict(visible=False, scaleanchor="x"))
    update_block_grid(fig, snapshot, colors, columns, max_blocks)
    return as_widget(fig, widget)


def update_block_grid(fig: go.Figure, snapshot: PoolSnapshot | None, colors: ColorMap | None = None,
                      columns: int | None = None, max_blocks: int = 1024, title: str | None = None) -> None:
    """Redraw the grid for ``snapshot`` (None: an empty grid, e.g. a replay without snapshots)."""
    colors = colors or ColorMap()
    if snapshot is None:
        with fig.batch_update():
            fig.data[0].update(x=[], y=[], base=[])
            fig.data[1].update(x=[], y=[], base=[])
            fig.data[2].update(x=[], y=[], text=[])
            fig.layout.title.text = title or "KV blocks: no pool snapshot recorded"
        return
    d = grid_data(snapshot, columns, max_blocks)
    rows = ceil_div(len(d.blocks), d.columns)
    label = len(d.blocks) <= 128  # owner names fit inside the cells
    used = d.used
    with fig.batch_update():
        fig.data[0].update(
            x=d.col, y=[CELL] * len(d.blocks), base=[-r - CELL / 2 for r in d.row],
            marker_color=[EMPTY_SLOT if o else FREE_BLOCK for o in d.owners],
            marker_line_color=[CACHED_OUTLINE if c else PLAIN_OUTLINE for c in d.cached],
            hovertext=[_hover(d, i) for i in range(len(d.blocks))])
        fig.data[1].update(
            x=[d.col[i] for i in used], y=[CELL * d.filled[i] / d.block_size for i in used],
            base=[-d.row[i] - CELL / 2 for i in used],
            marker_color=[colors(d.owners[i][0]) for i in used],
            marker_pattern_shape=["/" if d.ref_counts[i] > 1 else "" for i in used],
            hovertext=[_hover(d, i) for i in used])
        named = used if label else []  # owner names, where they fit inside the cells
        fig.data[2].update(
            x=[d.col[i] for i in named], y=[-d.row[i] for i in named],
            text=[d.owners[i][0] if d.ref_counts[i] == 1 else f"×{d.ref_counts[i]}" for i in named])
        fig.layout.title.text = title or grid_title(d)
        fig.layout.xaxis.range = [-0.5, d.columns - 0.5]
        fig.layout.yaxis.range = [-rows + 0.5, 0.5]
        fig.layout.height = max(160, (int(fig.layout.width or 480) - 20) * rows // d.columns + 60)
