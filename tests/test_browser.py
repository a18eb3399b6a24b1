"""A real browser renders the dashboard: headless Chromium opens chapter 11 in a JupyterLab server started
here, runs every cell, and counts the block grid's cells and the batch chart's bars on the page.

The expected counts come from the notebook itself: it asserts that its figures hold the recording's
numbers and prints them (``VIEW-COUNTS {...}``); this test checks the *rendered* SVG against them. It
needs Debian's Chromium (``apt-get install -y chromium``) and the ``playwright`` package (never
``playwright install``: it would download another browser); without them it skips -- or fails, when
``MINFER_REQUIRE_BROWSER=1`` (CI).
"""

from __future__ import annotations

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

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "11_scheduler_visualizer.ipynb"
CHROMIUM = os.environ.get("MINFER_CHROMIUM", "/usr/bin/chromium")
# Chromium in a closed network: no sandbox (root in CI), no GPU, and none of its background traffic
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage"]
RUN_TIMEOUT = 300  # seconds for the whole notebook: its budget is a minute, the rest absorbs a busy machine
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
    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium`"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "playwright is not installed: pip install -e '.[dev]' (never `playwright install`)"
    if missing:  # CI sets MINFER_REQUIRE_BROWSER=1: there a missing install step fails instead of skipping
        (pytest.fail if os.environ.get("MINFER_REQUIRE_BROWSER") else pytest.skip)(missing)
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


def bar_counts(page, css_class: str) -> list[int] | None:
    """Bars drawn per bar trace inside the first view with ``css_class`` (None: no such view)."""
    return page.evaluate(
        """(cls) => {
            const view = document.querySelector('""" + VISIBLE + """ .' + cls);
            if (!view) return null;
            const traces = Array.from(view.querySelectorAll('g.trace.bars'));
            return traces.map(t => t.querySelectorAll('g.point').length);
        }""", css_class)


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


def test_dashboard_renders_the_recorded_numbers(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, work = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            console: list[str] = []  # the page's warnings and errors, reported if the views are wrong
            page.on("console", lambda m: console.append(f"{m.type}: {m.text[:300]}") if m.type in (
                "error", "warning") else None)
            page.on("pageerror", lambda e: console.append(f"page error: {str(e)[:300]}"))
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
            if not wait_until(page, finished, RUN_TIMEOUT):
                page.screenshot(path=str(tmp_path / "timeout.png"))
                pytest.fail(f"the notebook did not finish in {RUN_TIMEOUT} s; cell prompts {prompts}; "
                            f"page at {tmp_path / 'timeout.png'}, server log {work / 'jupyterlab.log'}")
            text = page.locator(".jp-OutputArea-output:has-text('VIEW-COUNTS')").first.inner_text()
            expected = json.loads(text.split("VIEW-COUNTS", 1)[1].splitlines()[0])

            grid = [expected["grid_cells"], expected["grid_used"]]
            batch = [expected["decode_bars"], expected["prefill_bars"]]
            seen = {}

            def rendered() -> bool:
                seen["grid"] = bar_counts(page, "minfer-block-grid")
                seen["batch"] = bar_counts(page, "minfer-batch-chart")
                return seen["grid"] == grid and seen["batch"] == batch

            try:
                wait_until(page, rendered, 30)  # plotly draws asynchronously
            finally:
                shot = tmp_path / "dashboard.png"
                dashboard = page.locator(f"{VISIBLE} .minfer-dashboard").first
                (dashboard if dashboard.count() else page).screenshot(path=str(shot))
                if os.environ.get("MINFER_SCREENSHOT"):  # e.g. docs/images/dashboard.png, for the README
                    shutil.copy(shot, os.environ["MINFER_SCREENSHOT"])
            hint = f"; screenshot {shot}; browser console:\n" + "\n".join(console[-20:])
            assert seen["grid"] == grid, (
                f"block grid drew {seen['grid']} (cells, fill bars), expected {grid}{hint}")
            assert seen["batch"] == batch, (
                f"batch chart drew {seen['batch']} (decode, prefill bars), expected {batch}{hint}")
            assert page.locator(".minfer-dashboard .widget-slider").count(), "the step slider rendered"
        finally:
            browser.close()
