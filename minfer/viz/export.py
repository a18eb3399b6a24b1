"""The dashboard for slides and handouts: a standalone HTML file that replays a recording, offline.

``export_html(recording, "run.html")`` writes one file holding plotly.js, the dashboard's drawing code
(``static/views.js``) and one frame per step (``minfer.viz.frame``): open it in any browser, with no
kernel and no network, and scrub it with its slider, Play/Pause, or the arrow keys; its *PNG* button saves
the step on screen as a picture (the same ``views.js`` code as the notebook's PNG button). It looks exactly like
the notebook's dashboard because the same code draws the same frames.

Each frame holds the figures of its step in full, stored gzipped (the browser unpacks them): a 120-step
run of 18 requests is ~6 MB, 4.8 of them plotly.js. ``steps`` exports a range (e.g. the preemption you
want to show).

A PNG of the step on screen comes from the browser instead (``Dashboard.export_png``, or the file's own
PNG button): plotly's own rendering of the figures on the page, and the browser's own rendering of the
status, narration and legend (name chips and hatched swatches included), so it needs nothing beyond the
page itself -- no image-export package (kaleido), no separate headless browser.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from pathlib import Path

from tqdm.auto import tqdm

from minfer.viz.frame import FrameOptions, dashboard_frame
from minfer.viz.recorder import Recording
from minfer.viz.style import ColorMap
from minfer.viz.widget import plotly_js, static_text

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ margin: 16px 24px; background: white; }}
.minfer-player {{ display: flex; flex-wrap: wrap; align-items: center; gap: 8px 12px; margin-bottom: 8px;
  font: 14px Inter, "Helvetica Neue", Arial, sans-serif; }}
.minfer-player input[type=range] {{ flex: 1 1 320px; }}
.minfer-player button, .minfer-player select {{ font: inherit; padding: 3px 10px; }}
h1 {{ font: 600 18px Inter, "Helvetica Neue", Arial, sans-serif; margin: 0 0 8px; }}
{css}
</style>
<script>{plotly}</script>
</head>
<body>
<h1>{title}</h1>
<div class="minfer-player">
  <button id="minfer-back" title="previous step (←)">◀</button>
  <button id="minfer-play" title="play / pause (space)">▶ Play</button>
  <button id="minfer-forward" title="next step (→)">▶|</button>
  <label>speed <select id="minfer-speed">
    <option value="1">1 step/s</option><option value="2" selected>2 steps/s</option>
    <option value="4">4 steps/s</option><option value="10">10 steps/s</option>
  </select></label>
  <input id="minfer-slider" type="range" min="0" value="0" step="1" aria-label="step">
  <span id="minfer-step"></span>
  <button id="minfer-png" title="save the step on screen as a PNG picture (for a slide)">PNG</button>
</div>
<div id="minfer-stage" data-start="{start}"></div>
<script type="application/octet-stream" id="minfer-frames">{frames}</script>
<script>
{views}
{player}
</script>
</body>
</html>
"""


def export_html(recording: Recording, path: str | Path, *, colors: ColorMap | None = None,
                options: FrameOptions | None = None, steps: range | None = None, start: int | None = None,
                title: str = "minfer: the scheduler, step by step", progress: bool = True) -> Path:
    """Write ``recording`` as a standalone interactive HTML file; returns its path.

    ``colors``: the dashboard's request colours (so the file matches the screen); ``steps``: the step
    indices to include (default: all); ``start``: the index the page opens at (default: the last)."""
    if not len(recording):
        raise ValueError("the recording has no steps to export")
    colors = colors or ColorMap()
    options = options or FrameOptions()
    steps = steps if steps is not None else range(len(recording))
    if not steps or steps[0] < 0 or steps[-1] >= len(recording):
        raise ValueError(f"steps must be a non-empty range within 0..{len(recording) - 1}, got {steps}")
    frames = [dashboard_frame(recording, i, colors, options)
              for i in tqdm(steps, desc="frames", unit="step", disable=not progress or len(steps) < 50)]
    opening = len(frames) - 1 if start is None else list(steps).index(start)
    packed = gzip.compress(json.dumps(frames, separators=(",", ":")).encode(), compresslevel=6, mtime=0)
    payload = base64.b64encode(packed).decode()  # inside a script tag: base64 never closes it
    page = PAGE.format(title=html.escape(title), css=static_text("dashboard.css"), plotly=plotly_js(),
                       start=opening, frames=payload, views=static_text("views.js"),
                       player=static_text("player.js"))
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
