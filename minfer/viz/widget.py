"""The dashboard's browser side: plotly.js sent once per kernel, each dashboard one small widget.

Why not plotly's ``FigureWidget``? Each one carries its own copy of plotly.js (~5 MB) in its model state,
and anywidget gives a model 2 seconds to load its code. A chapter with three dashboards of five figures
asks a reloaded page for ~75 MB of JavaScript at once: some models miss the deadline ("Failed to
initialize model") and their views stay blank for good. So here:

* ``PlotlyLibrary`` -- one model per kernel, never displayed, holding plotly.js as a plain string trait.
  Its few lines of code start that string as a script and return at once: the 5 MB load is not timed.
* ``DashboardView`` -- one model per dashboard, holding one JSON ``frame``: the five figures, the status
  and narration lines and the legend of the step on screen (``minfer.viz.frame``). Its code (~10 KB) waits
  for plotly.js and draws the frame. A view that attaches later -- a second view of the output, or every
  view after a page reload -- draws the model's current frame, so all views show the same picture: there
  is no per-view state to lose.

The browser talks back: "drawn" when a frame is on screen (a paced run waits for it, so the engine is never
more than a step ahead of what the audience sees -- a slow browser slows the run instead of falling
behind it), an arrow key pressed over the dashboard, and a PNG it rendered (``request_png``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import traitlets

STATIC = Path(__file__).parent / "static"
WATCH_TIMEOUT = 3.0  # seconds without a "drawn" report after which no browser counts as watching


@cache
def static_text(name: str) -> str:
    return (STATIC / name).read_text()


@cache
def plotly_js() -> str:
    """The plotly.js bundle shipped inside the ``plotly`` Python package (no network needed)."""
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()


class PlotlyLibrary(anywidget.AnyWidget):
    """plotly.js for every dashboard on the page (see the module docstring)."""

    _esm = static_text("library.js")
    source = traitlets.Unicode("").tag(sync=True)


_library: PlotlyLibrary | None = None


def plotly_library() -> PlotlyLibrary:
    """The kernel's one ``PlotlyLibrary`` (made again if someone closed every widget)."""
    global _library
    if _library is None or _library.comm is None:
        _library = PlotlyLibrary(source=plotly_js())
    return _library


class DashboardView(anywidget.AnyWidget):
    """Draws ``frame`` (a dict from ``minfer.viz.frame.dashboard_frame``) in the browser."""

    _esm = static_text("views.js") + "\n" + static_text("widget.js")
    _css = static_text("dashboard.css")
    frame = traitlets.Dict().tag(sync=True)

    def __init__(self, on_key: Callable[[str], None] | None = None,
                 on_png: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> None:
        plotly_library()  # exists before this view, so its code reaches the browser first
        super().__init__(**kwargs)
        self._on_key, self._on_png = on_key, on_png
        self.serial = 0  # of the last frame sent
        self.drawn_serial = -1  # of the last frame a browser view reported on screen
        self.drawn_at = 0.0  # when (time.monotonic)
        self.draw_ms: list[float] = []  # how long the browser took to draw each frame (the latest 200)
        self.on_msg(self._handle)

    def show(self, frame: dict) -> int:
        """Send ``frame`` to every view; returns its serial number (views report it back once drawn)."""
        self.serial += 1
        self.frame = frame | {"serial": self.serial}
        return self.serial

    def on_screen(self, serial: int) -> bool:
        return self.drawn_serial >= serial

    @property
    def watched(self) -> bool:
        """A browser has drawn a frame in the last few seconds: someone is looking (and acknowledging)."""
        return self.drawn_serial >= 0 and time.monotonic() - self.drawn_at < WATCH_TIMEOUT

    def request_png(self, filename: str, download: bool = True) -> None:
        """Ask the browser for a PNG of the dashboard as drawn; it arrives through ``on_png`` (and, with
        ``download``, as a browser download). Needs a view on a page, and an idle kernel to receive it."""
        self.send({"command": "png", "filename": filename, "download": download})

    def _handle(self, _: Any, content: dict, buffers: list) -> None:
        event = content.get("event")
        if event == "drawn":
            self.drawn_serial = max(self.drawn_serial, int(content.get("serial") or 0))
            self.drawn_at = time.monotonic()
            self.draw_ms = [*self.draw_ms[-199:], float(content.get("ms", 0.0))]
        elif event == "key" and self._on_key:
            self._on_key(content.get("key", ""))
        elif event == "png" and self._on_png:
            self._on_png(content)
