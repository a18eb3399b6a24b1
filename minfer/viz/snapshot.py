"""Pictures of dashboard frames without a notebook: headless Chromium draws them with the dashboard's own code.

A live dashboard is a widget: its picture exists only in a browser that talks to a running kernel. Saved,
the notebook keeps no widget state (it would carry plotly.js, ~5 MB, per notebook), so GitHub, nbviewer,
the course site and a JupyterLab without a kernel show an empty output. When a chapter is stored
(``scripts/run_notebooks.py``), each dashboard's last frame is therefore drawn here, once, to a JPEG that is
stored beside the widget (``scripts/static_views.py``). JPEG, not PNG: the hatch patterns that mark prefill
steps defeat PNG's compression (~300 KB a dashboard), and a chapter showing three dashboards must stay under
500 KB; at 3/4 scale and quality 45 a dashboard is ~120 KB, its 13 px text still legible.

The picture is the real thing: the page holds plotly.js, ``static/views.js`` and ``static/dashboard.css``
-- exactly what the widget and the HTML export run -- and Chromium screenshots the drawn element, hatch
patterns, name colours and all. It needs Debian's Chromium (``apt-get install chromium``) and the
``playwright`` package (a dev dependency; never ``playwright install``, which downloads another browser).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from minfer.viz.widget import plotly_js, static_text

CHROMIUM = os.environ.get("MINFER_CHROMIUM", "/usr/bin/chromium")
# Chromium in a closed network: no sandbox (root in CI), no GPU, and none of its background traffic
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage"]
WIDTH = 1000  # CSS pixels: a notebook's output area on a laptop screen
SCALE = 0.75  # device pixels per CSS pixel (1 is sharper and ~1.3x the bytes: a chapter must stay small)
QUALITY = 45  # JPEG quality, 0-100
MIME = "image/jpeg"  # what frame_pictures returns

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body {{ margin: 0; background: white; }} #stage {{ width: {width}px; padding: 8px; }} {css}</style>
</head><body><div id="stage"></div></body></html>"""

DRAW = """async (frame) => {
  const stage = document.getElementById("stage");
  stage.replaceChildren();
  const parts = MinferViews.build(stage);
  await MinferViews.draw(Plotly, parts, frame);
}"""


class NoBrowser(RuntimeError):
    """Chromium or playwright is missing: the message says what to install."""


def browser_missing() -> str | None:
    """Why frames cannot be drawn here (None: they can)."""
    if not Path(CHROMIUM).exists():
        return (f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium` "
                "(or set MINFER_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]' (never `playwright install`)"
    return None


def frame_pictures(frames: Sequence[dict], *, width: int = WIDTH, scale: float = SCALE) -> list[bytes]:
    """One JPEG per frame (a dict from ``minfer.viz.frame.dashboard_frame``, or a widget's stored ``frame``),
    drawn in one headless Chromium page by the dashboard's own JavaScript."""
    if why := browser_missing():
        raise NoBrowser(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width + 16, "height": 800}, device_scale_factor=scale)
            page.set_content(PAGE.format(width=width, css=static_text("dashboard.css")))
            page.add_script_tag(content=plotly_js())
            page.add_script_tag(content=static_text("views.js") + "\nglobalThis.MinferViews = MinferViews;")
            pictures = []
            for frame in frames:
                page.evaluate(DRAW, json.loads(json.dumps(frame)))
                pictures.append(page.locator("#stage").screenshot(type="jpeg", quality=QUALITY, animations="disabled"))
            return pictures
        finally:
            browser.close()
