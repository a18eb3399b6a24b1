"""A real browser drives the dashboard the way a lecturer does: headless Chromium opens chapter 11 in a
JupyterLab server started here, runs every cell, and then checks what once broke in a lecture hall:

* the rendered page holds the recording's numbers (the notebook prints them: ``VIEW-COUNTS {...}``);
* every text is readable (font sizes measured at 1x and 2x) and the figures fill their width;
* Run on the finished recording replays it (and says so);
* the lecture layout: at 1366x768 the controls and all five views on screen at once, the controls row
  staying in sight as the notebook scrolls; at font scale 2 the controls' text grew too, and nothing clips;
* the arrow keys step; Pause during Run stops within one step (3 tries, at 4 steps/s);
* the PNG button downloads an image; the HTML export opens in Chromium, offline, and scrubs;
* a second view of an output draws the same colours as the first;
* after a page reload every chart of every dashboard has data again;
* (on an HTML export of 32 requests, without JupyterLab) every status, narration and legend text reaches 4.5:1
  against what is under it, 32 requests show in 32 colours, and the PNG keeps the legend's patterns, the name
  chips and the status line.

It prints the response times it measured (``RESPONSE-TIMES ...``). Wall-clock times on a shared machine
are noisy: the assertions bound behaviour (steps, sizes, data), never speed. It needs Debian's Chromium
(``apt-get install -y chromium``) and the ``playwright`` package (never ``playwright install``: it would
download another browser); without them it skips -- or fails, when ``MINFER_REQUIRE_BROWSER=1`` (CI).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from conftest import require_browser
from minfer.viz.snapshot import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "11_scheduler_visualizer.ipynb"
RUN_TIMEOUT = 420  # seconds for the whole notebook: its budget is two minutes, the rest absorbs a busy machine
# JupyterLab settings for the test's own (throwaway) settings directory
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server on a free localhost port, serving a copy of chapter 11 without its outputs
    (so the counts the test reads are the fresh ones, and the repository's notebook is never autosaved)."""
    require_browser()
    work = tmp_path_factory.mktemp("lab")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, work / NOTEBOOK.name)
    settings = work / ".settings"
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    port = free_port()
    log = open(work / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         "--IdentityProvider.token=", "--ServerApp.password=", "--allow-root", f"--ServerApp.root_dir={work}",
         f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={work / '.workspaces'}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}; see {work / 'jupyterlab.log'}")
            try:
                if urllib.request.urlopen(f"{url}/lab", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {url}/lab in 90 s; see {work / 'jupyterlab.log'}")
            time.sleep(0.5)
        yield url, work
    finally:
        server.terminate()  # by its own process id; it shuts its kernel down on the way out
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


VISIBLE = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen (not a hidden tab)


def bar_counts(page, css_class: str, root: str = VISIBLE) -> list[int]:
    """Bars drawn per bar trace inside the first view with ``css_class`` under ``root`` ([]: no such view)."""
    return page.evaluate(
        """([root, cls]) => {
            const view = document.querySelector(root + ' .' + cls);
            if (!view) return [];
            const traces = Array.from(view.querySelectorAll('g.trace.bars'));
            return traces.map(t => t.querySelectorAll('g.point').length);
        }""", [root, css_class])


def accept_dialogs(page) -> None:
    """JupyterLab may ask which kernel to start: take its default (the notebook's own python3)."""
    dialog = page.locator(".jp-Dialog .jp-mod-accept")
    if dialog.count():
        dialog.first.click()


def settled_on_one_kernel(url: str, quiet: float = 3.0):
    """A condition for ``wait_until``: the server has run one and the same kernel for ``quiet`` seconds."""
    last: dict = {"ids": None, "since": time.monotonic()}

    def settled() -> bool:
        with urllib.request.urlopen(f"{url}/api/kernels", timeout=5) as reply:
            ids = sorted(k["id"] for k in json.load(reply))
        if ids != last["ids"]:
            last.update(ids=ids, since=time.monotonic())
        return len(ids) == 1 and time.monotonic() - last["since"] >= quiet

    return settled


def wait_until(page, condition, timeout: float, what: str | None = None):
    """Poll ``condition`` until true; past ``timeout``, fail naming ``what`` (or return if it is None)."""
    deadline = time.monotonic() + timeout
    while True:
        accept_dialogs(page)
        value = condition()
        if value or time.monotonic() > deadline:
            if not value and what:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
            return value
        page.wait_for_timeout(500)


def shown_step(dashboard) -> int:
    """The step number in a dashboard's status line (-1 before the first step)."""
    m = re.search(r"step (\d+)", dashboard.locator(".minfer-status").inner_text())
    return int(m.group(1)) if m else -1


VIEW_MARKS = """(sel) => [...document.querySelectorAll(sel + ' .minfer-canvas')].map(c =>
    [...c.querySelectorAll('.minfer-view')].map(v => v.querySelectorAll('g.point, path.js-line').length))"""


def view_marks(page, root: str) -> list[list[int]]:
    """Per dashboard under ``root``, per view: how many marks (bars, points, lines) it drew."""
    return page.evaluate(VIEW_MARKS, root)


FONT_SIZES = """(d) => {
    const px = (s) => { const e = d.querySelector(s); return e ? parseFloat(getComputedStyle(e).fontSize) : 0; };
    return {status: px('.minfer-status'), narration: px('.minfer-narration'), legend: px('.minfer-legend'),
            title: px('.minfer-batch-chart .gtitle'), tick: px('.minfer-batch-chart .xtick text'),
            axis_title: px('.minfer-batch-chart .xtitle'), grid_label: px('.minfer-block-grid .textpoint text'),
            queue_legend: px('.minfer-queues .legendtext')};
}"""
WIDTHS = """(d) => [d.querySelector('.minfer-canvas').clientWidth,
    ...[...d.querySelectorAll('.minfer-view')].map(v => v.querySelector('.main-svg').getBoundingClientRect().width)]"""
# each timeline bar's fill; a patterned fill (a url to an SVG pattern, its id unique per view) by the
# colours the pattern is drawn in
TIMELINE_FILLS = """([sel, i]) => { const el = document.querySelectorAll(sel)[i];
    const fill = (p) => {
        const url = /url\\("?#([^")]+)"?\\)/.exec(p.style.fill);
        if (!url) return p.style.fill + ' ' + p.style.fillOpacity;
        const pattern = document.getElementById(url[1]);
        return 'pattern ' + (pattern ? [...pattern.querySelectorAll('*')].map(e => getComputedStyle(e).fill)
            .join(',') : '?');
    };
    return el ? [...el.querySelectorAll('.minfer-timeline g.trace.bars g.point path')].map(fill) : []; }"""
# records, when a click on the Pause button reaches the page, which step the dashboard was showing
WATCH_PAUSE = """(b) => { window.__pausedAt = null; b.addEventListener('click', () => {
    const status = b.closest('.minfer-dashboard').querySelector('.minfer-status').innerText;
    const m = /step (\\d+)/.exec(status);
    window.__pausedAt = {t: Date.now(), step: m ? Number(m[1]) : -1}; }, {capture: true, once: true}); }"""


def exported_frames(path: Path) -> list[dict]:
    """The frames inside an exported HTML file (gzipped JSON, base64, in a script tag)."""
    packed = re.search(r'id="minfer-frames">([^<]*)</script>', path.read_text()).group(1)
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def run_all(page, url: str, work: Path, times: dict, hint) -> None:
    page.goto(f"{url}/lab/tree/{NOTEBOOK.name}", timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    wait_until(page, idle.count, 90, "the kernel to start")
    # On a busy machine JupyterLab has been seen opening the notebook with a burst of kernels, each
    # started and shut down in turn; "Run All" sent during that burst ran on a kernel about to go.
    wait_until(page, settled_on_one_kernel(url), 90, "JupyterLab to settle on one kernel")
    wait_until(page, idle.count, 90, "the kernel to start")
    prompts: list[str] = []
    cells = page.locator(".jp-CodeCell .jp-InputPrompt")
    errors = page.locator("[data-mime-type='application/vnd.jupyter.error']")

    def finished() -> bool:
        prompts[:] = [p.strip() for p in cells.all_inner_texts()]
        if errors.count():  # a failed cell stops "Run All": report it now, not at the timeout
            pytest.fail("a cell failed in the browser:\n" + "\n".join(errors.all_inner_texts()))
        return bool(prompts) and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)

    def started() -> bool:
        return finished() or any(p != "[ ]:" for p in prompts)

    for _ in range(3):  # a click that lands before the kernel is fully connected does nothing
        page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
        page.click("li.lm-Menu-item:has-text('Run All Cells')")
        if wait_until(page, started, 30):
            break
    began = time.monotonic()
    page.wait_for_selector(f"{VISIBLE} .minfer-block-grid .main-svg", timeout=RUN_TIMEOUT * 1000)
    times["first dashboard drawn after Run All (s)"] = round(time.monotonic() - began, 1)
    if not wait_until(page, finished, RUN_TIMEOUT):
        pytest.fail(f"the notebook did not finish in {RUN_TIMEOUT} s; cell prompts {prompts}; "
                    f"server log {work / 'jupyterlab.log'}{hint()}")
    times["Run All (s)"] = round(time.monotonic() - began, 1)


def check_fonts_and_widths(page, dash, times: dict) -> None:
    """Readable from the back row: no text under 12 px at 1x, every text twice as big at 2x; figures as
    wide as the dashboard (or half of it, side by side)."""
    small = dash.evaluate(FONT_SIZES)
    assert min(small.values()) >= 12, f"text under 12 px at 1x: {small}"
    widths = dash.evaluate(WIDTHS)
    times["canvas and figure widths (px)"] = widths
    assert widths[0] > 800 and all(w >= widths[0] * 0.45 for w in widths[1:]), f"figure widths {widths}"
    handle = dash.locator(".widget-hslider .noUi-handle").nth(1)  # the font slider (after the step slider)
    handle.focus()
    for _ in range(4):  # 1x → 2x in steps of 0.25
        handle.press("ArrowRight")
    wait_until(page, lambda: dash.evaluate(FONT_SIZES)["tick"] >= 2 * small["tick"] - 1, 30, "the 2x font")
    big = dash.evaluate(FONT_SIZES)
    times["font sizes 1x (px)"], times["font sizes 2x (px)"] = small, big
    for name, size in small.items():
        assert abs(big[name] - 2 * size) <= 1.5, f"{name}: {size} px at 1x but {big[name]} px at 2x"


def check_keys_and_exports(page, browser, dash, work: Path, tmp_path: Path, times: dict) -> None:
    """← → step; PNG downloads the step on screen; the HTML export plays in an offline browser."""
    at = shown_step(dash)
    dash.locator(".minfer-narration").click()
    page.keyboard.press("ArrowLeft")
    wait_until(page, lambda: shown_step(dash) == at - 1, 30, "← to step back")
    page.keyboard.press("ArrowRight")
    wait_until(page, lambda: shown_step(dash) == at, 30, "→ to step forward")

    began = time.monotonic()
    with page.expect_download(timeout=60_000) as download:
        dash.locator("button.minfer-export-png").click()
    times["PNG downloaded (s)"] = round(time.monotonic() - began, 1)
    png = tmp_path / "step.png"
    download.value.save_as(png)
    assert download.value.suggested_filename == f"minfer-step-{at}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    wait_until(page, lambda: (work / f"minfer-step-{at}.png").exists(), 30, "the kernel to save the PNG")

    dash.locator("button.minfer-export-html").click()
    wait_until(page, lambda: "open it in any browser" in dash.inner_text(), 60, "the HTML export")
    exported = work / "minfer-dashboard.html"
    frames = exported_frames(exported)
    offline = browser.new_context(viewport={"width": 1300, "height": 1400}, offline=True).new_page()
    began = time.monotonic()
    offline.goto(exported.as_uri())
    offline.wait_for_selector(".minfer-block-grid .main-svg", timeout=60_000)
    times["exported HTML drawn (s)"] = round(time.monotonic() - began, 1)

    def shows(index: int) -> bool:  # the page draws the file's own frame for that step
        drawn = bar_counts(offline, "minfer-block-grid", root="")
        want = [len(frames[index]["views"]["grid"]["data"][i]["x"]) for i in (0, 1)]
        return offline.evaluate("document.body.dataset.index") == str(index) and drawn[:2] == want

    wait_until(offline, lambda: shows(at), 30, "the exported file at the step that was on screen")
    offline.keyboard.press("ArrowLeft")
    wait_until(offline, lambda: shows(at - 1), 30, "← in the exported file")
    offline.fill("#minfer-slider", "3")  # drag the slider
    wait_until(offline, lambda: shows(3), 30, "the exported file's slider")
    offline.click("#minfer-play")
    wait_until(offline, lambda: int(offline.evaluate("document.body.dataset.index")) >= 5, 30, "Play")
    offline.close()


def check_pause(page, dash, times: dict, tries: int = 3) -> None:
    """Pause during Run, clicked as a user clicks (no waiting for the page to be idle): the step on screen
    when the click reached the page, and the step the run stopped at, differ by at most one."""
    dash.locator("button.minfer-apply").click()  # start the scenario over
    wait_until(page, lambda: shown_step(dash) == -1, 60, "Apply & reset")
    dash.locator(".widget-dropdown select").nth(2).select_option(label="4 steps/s")
    pauses = []
    for _ in range(tries):
        dash.locator("button.minfer-run").click()
        wait_until(page, lambda: "running at" in dash.locator(".minfer-status").inner_text(), 30, "Run")
        page.wait_for_timeout(1500)
        button = dash.locator("button.minfer-pause")
        button.evaluate(WATCH_PAUSE)
        box = button.bounding_box()
        clicked = time.time()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        wait_until(page, lambda: "running at" not in dash.locator(".minfer-status").inner_text(), 30, "a stop")
        stopped = time.time()
        seen = page.evaluate("window.__pausedAt")
        page.wait_for_timeout(500)
        final = shown_step(dash)
        pauses.append(dict(on_screen_at_click=seen["step"], stopped_at=final,
                           click_reached_page_s=round(seen["t"] / 1000 - clicked, 2),
                           stopped_on_screen_s=round(stopped - clicked, 2)))
        assert final - seen["step"] <= 1, f"Pause let {final - seen['step']} more steps run: {pauses}"
    times["Pause during Run at 4 steps/s"] = pauses
    draws = sorted(d["total"] for d in page.evaluate("globalThis.__minferDrawTimes || []"))
    times["browser draw time per frame (ms): median, max"] = [round(draws[len(draws) // 2]), round(draws[-1])]


def check_second_view(page, dash, hint) -> None:
    """'Create New View for Cell Output': the new view draws the timeline in the same colours."""
    from minfer.viz.style import REQUEST_HUES

    before = page.evaluate(TIMELINE_FILLS, [f"{VISIBLE} .minfer-dashboard", 2])
    dash.locator(".minfer-status").click(button="right")
    page.click("li.lm-Menu-item:has-text('Create New View for Cell Output')")
    wait_until(page, lambda: page.evaluate(TIMELINE_FILLS, [".jp-LinkedOutputView", 0]) == before, 60)
    after = page.evaluate(TIMELINE_FILLS, [".jp-LinkedOutputView", 0])
    assert before and after == before, f"the second view's timeline colours differ{hint()}"
    hues = {"rgb({}, {}, {})".format(*(int(h[i:i + 2], 16) for i in (1, 3, 5))) for h in REQUEST_HUES}
    assert {f.rsplit(" ", 1)[0] for f in after} & hues, f"the timeline is not in the request hues: {set(after)}"


def check_run_replays_a_finished_run(page, dash) -> None:
    """After Run All the engine has finished: Run replays the recording from the slider's step (it used to
    do nothing, and say nothing), and the message line says so."""
    at = shown_step(dash)
    dash.locator("button.minfer-run").click()
    note = r"replaying the recording from step \d+: the engine has finished"  # said while the replay lasts
    wait_until(page, lambda: re.search(note, dash.locator(".minfer-message").inner_text()), 30,
               "the message line to say that Run replays")
    wait_until(page, lambda: shown_step(dash) != at, 30, "Run on a finished run to replay it")


def lecture(page, dash) -> None:
    """Press a dashboard's *lecture* button; wait until its views are laid out for one screen."""
    dash.locator("button.minfer-layout").click()
    wait_until(page, lambda: dash.locator(".minfer-canvas.minfer-layout-lecture").count() == 1, 30,
               "the lecture layout")
    page.wait_for_timeout(1000)  # plotly redraws at the new sizes


# the boxes that must be on screen at once: the controls row and each view's figure (CSS pixels)
BOXES = """(d) => { const box = (e) => { const r = e.getBoundingClientRect();
        return [Math.round(r.left), Math.round(r.top), Math.round(r.right), Math.round(r.bottom)]; };
    const out = {controls: box(d.querySelector('.minfer-controls'))};
    for (const v of d.querySelectorAll('.minfer-view')) out[v.classList[1]] = box(v.querySelector('.main-svg'));
    const s = d.closest('.jp-WindowedPanel-outer') || document.documentElement;
    return {boxes: out, screen: box(s)}; }"""


def check_lecture_layout_fits_a_projector(page, dash, times: dict) -> None:
    """At 1366x768 (a projector), with the side panel closed, the lecture layout shows the controls and all
    five views at once; scrolled on, the controls row stays in sight."""
    page.set_viewport_size({"width": 1366, "height": 768})
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").first.click()  # close the side panel
    lecture(page, dash)
    dash.evaluate("d => d.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    seen = dash.evaluate(BOXES)
    times["lecture layout at 1366x768 (boxes, screen)"] = seen
    top, bottom = max(seen["screen"][1], 0), min(seen["screen"][3], 768)
    outside = {n: b for n, b in seen["boxes"].items() if b[0] < 0 or b[2] > 1366 or b[1] < top or b[3] > bottom}
    assert len(seen["boxes"]) == 6 and not outside, f"not on screen at 1366x768: {outside} (screen {top}-{bottom})"
    page.mouse.move(700, 500)
    page.mouse.wheel(0, 300)  # the notebook scrolls on: the controls row stays at the top
    page.wait_for_timeout(500)
    controls = dash.evaluate(BOXES)["boxes"]["controls"]
    hiding = dash.evaluate("""(d) => { const out = []; for (let e = d; e; e = e.parentElement) {
        const o = getComputedStyle(e).overflow;
        if (o !== 'visible') out.push(e.className + ': ' + o); } return out; }""")
    assert top - 1 <= controls[1] <= top + 40, \
        f"the controls row scrolled away: {controls}, screen top {top}; boxes that clip it: {hiding}"
    page.set_viewport_size({"width": 1400, "height": 2600})


# texts of a dashboard cut off: an HTML element narrower (or shorter) than its text where it hides
# overflow, or an SVG text outside its figure
CLIPPED = """(d) => { const out = [];
    for (const e of d.querySelectorAll('*')) {
        if (e instanceof SVGElement || !e.textContent.trim()) continue;
        const st = getComputedStyle(e);
        if (st.display === 'none' || e.offsetParent === null) continue;
        const wide = e.scrollWidth > e.clientWidth + 1 && st.overflowX !== 'visible';
        const tall = e.scrollHeight > e.clientHeight + 1 && st.overflowY !== 'visible';
        if (wide || tall) out.push(`${e.className || e.tagName}: ${e.textContent.trim().slice(0, 40)}`);
    }
    for (const svg of d.querySelectorAll('.minfer-view .main-svg')) {
        const r = svg.getBoundingClientRect();
        for (const t of svg.parentNode.querySelectorAll('text')) {
            const b = t.getBoundingClientRect();
            const out_x = b.left < r.left - 1 || b.right > r.right + 1;
            if (b.width && (out_x || b.top < r.top - 1 || b.bottom > r.bottom + 1))
                out.push(`${t.closest('.minfer-view').classList[1]} text: ${t.textContent.slice(0, 40)}`);
        }
    }
    return out; }"""
CONTROL_FONTS = """(d) => Object.fromEntries(['.minfer-run', '.widget-label', 'select', 'input[type=number]',
    '.widget-readout', '.widget-html'].map(s => { const e = d.querySelector(s);
    return [s, e ? parseFloat(getComputedStyle(e).fontSize) : 0]; }))"""


def check_nothing_clips_at_2x(page, dash, times: dict) -> None:
    """Font scale 2 in the lecture layout: the controls' text grew with the charts' (buttons, dropdowns,
    knobs, slider labels), and no text of the dashboard is cut off."""
    lecture(page, dash)
    fonts = dash.evaluate(CONTROL_FONTS)
    times["control font sizes at 2x (px)"] = fonts
    assert all(size >= 25 for size in fonts.values()), f"controls that kept their 1x font: {fonts}"
    clipped = dash.evaluate(CLIPPED)
    assert not clipped, f"text cut off at font scale 2: {clipped}"


def test_dashboard_in_a_lecture(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, work = lab
    times: dict[str, object] = {}  # the response times this test measured, printed at the end
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            # tall enough for a whole dashboard in one screenshot (the README's)
            page = browser.new_context(viewport={"width": 1400, "height": 2600}, accept_downloads=True).new_page()
            console: list[str] = []  # the page's warnings and errors, reported if the views are wrong
            page.on("console", lambda m: console.append(f"{m.type}: {m.text[:300]}") if m.type in (
                "error", "warning") else None)
            page.on("pageerror", lambda e: console.append(f"page error: {str(e)[:300]}"))

            def hint() -> str:
                shot = tmp_path / "page.png"
                page.screenshot(path=str(shot), full_page=True)
                return f"; page at {shot}; browser console:\n" + "\n".join(console[-20:])

            run_all(page, url, work, times, hint)
            text = page.locator(".jp-OutputArea-output:has-text('VIEW-COUNTS')").first.inner_text()
            expected = json.loads(text.split("VIEW-COUNTS", 1)[1].splitlines()[0])
            dashboards = page.locator(f"{VISIBLE} .minfer-dashboard")
            assert dashboards.count() == 3, "chapter 11 shows three dashboards (SmolLM2, simulator, replay)"
            first, sim, replayed = dashboards.nth(0), dashboards.nth(1), dashboards.nth(2)

            # the rendered page holds the recording's numbers
            grid = [expected["grid_cells"], expected["grid_used"]]
            batch = [expected["decode_bars"], expected["prefill_bars"]]
            seen = {}

            def rendered() -> bool:
                seen["grid"] = bar_counts(page, "minfer-block-grid")[:2]
                seen["batch"] = bar_counts(page, "minfer-batch-chart")[:2]
                return seen["grid"] == grid and seen["batch"] == batch

            wait_until(page, rendered, 60)  # the browser draws the newest frame when it gets to it
            shot = tmp_path / "dashboard.png"  # the replay of the simulated bursts, at its first preemption
            wait_until(page, lambda: replayed.locator(".minfer-timeline g.point").count() > 0, 60)
            replayed.screenshot(path=str(shot))
            if os.environ.get("MINFER_SCREENSHOT"):  # e.g. docs/images/dashboard.png, for the README
                shutil.copy(shot, os.environ["MINFER_SCREENSHOT"])
            assert seen["grid"] == grid, f"the grid drew {seen['grid']} (cells, fill bars), expected {grid}{hint()}"
            assert seen["batch"] == batch, f"the batch chart drew {seen['batch']} (decode, prefill), not {batch}"
            narration = first.locator(".minfer-narration").inner_text()
            assert narration.startswith(f"step {shown_step(first)} ·"), f"the narration line: {narration!r}"

            check_fonts_and_widths(page, first, times)
            check_nothing_clips_at_2x(page, first, times)
            check_keys_and_exports(page, browser, replayed, work, tmp_path, times)
            check_run_replays_a_finished_run(page, sim)  # at its last step: the replay starts over
            check_lecture_layout_fits_a_projector(page, sim, times)
            check_pause(page, sim, times)
            check_second_view(page, replayed, hint)

            # reload: every chart of every dashboard has data again
            page.keyboard.press("Control+s")
            page.wait_for_timeout(2000)
            page.reload()
            began = time.monotonic()
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)

            def restored() -> bool:
                marks = view_marks(page, VISIBLE)
                return len(marks) == 3 and all(len(v) == 5 and all(v) for v in marks)

            if not wait_until(page, restored, 120):
                pytest.fail(f"after the reload some charts are empty: {view_marks(page, VISIBLE)}{hint()}")
            times["reload to every chart drawn (s)"] = round(time.monotonic() - began, 1)
            wait_until(page, rendered, 60)
            assert seen["grid"] == grid and seen["batch"] == batch, f"after the reload: {seen}{hint()}"
            failed = [c for c in console if "Failed to initialize model" in c or "model not found" in c]
            assert not failed, f"widgets failed to load: {failed}"
        finally:
            print("RESPONSE-TIMES", json.dumps(times))
            browser.close()


# ---- the HTML export in Chromium: contrast, 32 colours, a PNG as good as the screen (issue 37) --------------
# Each text node of the status, narration and legend: its colour, the colour under it (the first opaque
# background up the tree, translucent ones blended on the way) and WCAG's contrast ratio of the two.
TEXT_CONTRAST = """() => {
    const rgba = (c) => { const v = c.match(/[\\d.]+/g).map(Number);
        return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
    const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3]));
    const lum = (rgb) => {
        const f = (c) => { c /= 255; return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
        return 0.2126 * f(rgb[0]) + 0.7152 * f(rgb[1]) + 0.0722 * f(rgb[2]); };
    const under = (el) => {
        const layers = [];
        for (let e = el; e; e = e.parentElement) {
            const c = rgba(getComputedStyle(e).backgroundColor);
            if (c[3] > 0) layers.push(c);
            if (c[3] >= 1) break;
        }
        return layers.reverse().reduce((rgb, c) => over(c, rgb), [255, 255, 255]);
    };
    const out = [];
    for (const part of document.querySelectorAll('.minfer-status, .minfer-narration, .minfer-legend')) {
        const walk = document.createTreeWalker(part, NodeFilter.SHOW_TEXT);
        for (let node = walk.nextNode(); node; node = walk.nextNode()) {
            if (!node.textContent.trim()) continue;
            const el = node.parentElement, bg = under(el), fg = over(rgba(getComputedStyle(el).color), bg);
            const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
            out.push({part: part.className, text: node.textContent.trim().slice(0, 30),
                      chip: el.matches('.minfer-name'), color: fg.map(Math.round),
                      background: bg.map(Math.round), ratio: (hi + 0.05) / (lo + 0.05)});
        }
    }
    return out;
}"""
# Where, in the PNG of the dashboard (scale x the page), the page drew what the PNG must keep: the phase
# swatches (hatched prefill, crossed preempted), the name chips with their hue, the status line.
PNG_REGIONS = """(scale) => {
    const origin = document.querySelector('.minfer-canvas').getBoundingClientRect();
    const box = (el, inset) => { const r = el.getBoundingClientRect();
        return [r.left - origin.left + inset, r.top - origin.top + inset, r.width - 2 * inset, r.height - 2 * inset]
            .map(v => Math.round(v * scale)); };
    const swatches = [...document.querySelectorAll('.minfer-legend .minfer-swatch')];
    const chips = [...document.querySelectorAll('.minfer-narration .minfer-name, .minfer-legend .minfer-name')];
    return {prefill: box(swatches[2], 2), preempted: box(swatches[4], 2),
            status: box(document.querySelector('.minfer-status'), 0),
            chips: chips.map(c => ({text: c.innerText, box: box(c, 2),
                                    hue: getComputedStyle(c).backgroundColor.match(/\\d+/g).slice(0, 3).map(Number)}))};
}"""
# Per region of a PNG (base64): its pixel count, how many are dark (text), how many are within 40 of a
# colour (a chip's hue), and its darkest and lightest luminance (a hatch spans both).
PNG_PIXELS = """async ([png, regions]) => {
    const img = new Image();
    await new Promise((ok, fail) => { img.onload = ok; img.onerror = fail; img.src = 'data:image/png;base64,' + png; });
    const canvas = document.createElement('canvas');
    canvas.width = img.width; canvas.height = img.height;
    const ctx = canvas.getContext('2d');
    ctx.drawImage(img, 0, 0);
    return regions.map(([[x, y, w, h], hue]) => {
        const d = ctx.getImageData(x, y, w, h).data;
        let dark = 0, near = 0, lo = 1, hi = 0;
        for (let i = 0; i < d.length; i += 4) {
            const l = (0.2126 * d[i] + 0.7152 * d[i + 1] + 0.0722 * d[i + 2]) / 255;
            lo = Math.min(lo, l); hi = Math.max(hi, l);
            if (Math.max(d[i], d[i + 1], d[i + 2]) < 90) dark++;
            if (hue && Math.hypot(d[i] - hue[0], d[i + 1] - hue[1], d[i + 2] - hue[2]) < 40) near++;
        }
        return {n: d.length / 4, dark, near, lo, hi};
    });
}"""
# the distinct colours of the timeline's solid (decode) and hatched (prefill) bars: one per request
TIMELINE_HUES = """() => [...new Set([...document.querySelectorAll('.minfer-timeline g.trace.bars g.point path')]
    .filter(p => !/url/.test(p.style.fill) && (p.style.fillOpacity === '' || Number(p.style.fillOpacity) === 1))
    .map(p => p.style.fill))]"""


@pytest.fixture(scope="module")
def exported_32(tmp_path_factory, tiny) -> tuple[Path, int]:
    """An HTML export of 32 requests of the tiny model in a small pool (waits, chunks, preemptions), opening at
    the first step where one request's need preempts another (so the narration names three: "preempted r5
    (pool full: r0 needed a block; ...)"); no JupyterLab."""
    require_browser()
    from conftest import tiny_engine
    from minfer import SamplingParams
    from minfer.viz import Recorder, export_html

    engine = tiny_engine(tiny, block_size=4, num_blocks=24, max_num_seqs=12, chunked_prefill_size=32)
    for i in range(32):
        engine.add_request(f"r{i}", list(range(10, 18 + i % 9)), SamplingParams(max_tokens=12, ignore_eos=True,
                           temperature=0.0), arrival_time=0.0)
    rec = Recorder(engine).run()
    shown = next(i for i, t in enumerate(rec.trace)
                 if any(d.kind == "preempted" and d.by != d.request for d in t.decisions))
    path = export_html(rec, tmp_path_factory.mktemp("export") / "run.html", start=shown, progress=False)
    return path, shown


def test_exported_dashboard_reads_at_a_distance_and_its_png_keeps_it(exported_32, tmp_path):
    """Opened offline in Chromium: every text of the status, narration and legend reaches 4.5:1 against what
    is under it (measured on the rendered page); the 32 requests show in 32 colours; the PNG button's picture
    keeps the legend's patterns, the name chips in their hues and the status line."""
    from playwright.sync_api import sync_playwright

    path, shown = exported_32
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1300, "height": 1400}, offline=True,
                                       accept_downloads=True).new_page()
            page.goto(path.as_uri())
            page.wait_for_selector(".minfer-block-grid .main-svg", timeout=60_000)
            wait_until(page, lambda: page.evaluate("document.body.dataset.index") == str(shown), 30,
                       "the export at its preemption")

            texts = page.evaluate(TEXT_CONTRAST)
            low = [t for t in texts if t["ratio"] < 4.5]
            assert not low, f"text under 4.5:1: {low}"
            chips = [t for t in texts if t["chip"]]
            assert {t["part"] for t in chips} == {"minfer-narration", "minfer-legend"}, f"names not on chips: {texts}"
            told = [t["text"] for t in chips if t["part"] == "minfer-narration"]
            assert len(told) >= 3 and "preempted" in told, f"the preemption, its victim and its cause: {told}"

            with page.expect_download(timeout=60_000) as download:
                page.click("#minfer-png")
            png = tmp_path / "step.png"
            download.value.save_as(png)
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            where = page.evaluate(PNG_REGIONS, 2)
            regions = [[where["prefill"], None], [where["preempted"], None], [where["status"], None],
                       *([c["box"], c["hue"]] for c in where["chips"])]
            prefill, preempted, status, *chip_pixels = page.evaluate(
                PNG_PIXELS, [base64.b64encode(png.read_bytes()).decode(), regions])
            assert prefill["hi"] - prefill["lo"] > 0.25, f"the prefill swatch lost its hatching: {prefill}"
            assert preempted["hi"] - preempted["lo"] > 0.25, f"the preempted swatch lost its crossing: {preempted}"
            assert status["dark"] > 200, f"no status line in the PNG: {status}"
            faded = [(c["text"], px) for c, px in zip(where["chips"], chip_pixels) if px["near"] < 0.5 * px["n"]]
            assert chip_pixels and not faded, f"name chips not in their hue in the PNG: {faded}"

            page.fill("#minfer-slider", str(int(page.get_attribute("#minfer-slider", "max"))))  # the last step
            wait_until(page, lambda: len(page.evaluate(TIMELINE_HUES)) >= 32, 30)
            hues = page.evaluate(TIMELINE_HUES)
            assert len(hues) == 32, f"32 requests drawn in {len(hues)} colours: {hues}"
            legend = page.evaluate("""() => [...document.querySelectorAll('.minfer-legend [data-request]')]
                .map(c => getComputedStyle(c.querySelector('.minfer-name') || c).backgroundColor)""")
            assert len(legend) == 32 and len(set(legend)) == 32, f"the legend's 32 requests: {legend}"
        finally:
            browser.close()
