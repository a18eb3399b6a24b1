"""Every widget a stored chapter shows leaves a picture beside it (``scripts/run_notebooks.py`` calls this).

A widget's output holds only a reference to a model in the kernel. The notebook is committed without widget
state (``clean_notebooks.py``: plotly.js alone is ~5 MB of it), so once saved the output is blank -- on
GitHub, nbviewer, the course site (``make book``) and in a JupyterLab with no kernel. When a chapter is
executed for storage, the runner still holds every widget's final state (nbclient records it from the kernel's
messages), so right after each widget output this inserts a *static view* of that state:

* a scheduler dashboard (any widget holding a dashboard ``frame``): a JPEG of its last frame, drawn by the
  dashboard's own code in headless Chromium (``minfer.viz.snapshot``) -- the step it was left on, not step 0;
* a progress bar (tqdm's widget): its final line, ``frames: 100%|##########| 119/119 [...]``, not the 0/119
  it was displayed with.

A widget of any other kind is an error: add its static view here. The static view is an ordinary display
output marked ``{"minfer": {"static_view": <model id>}}`` in its metadata, which the tests and the book read.
Cells showing a widget are ``# NBVAL_IGNORE_OUTPUT`` (tests/test_notebooks_clean.py): a fresh run under
nbval does not repeat the storage step, and is not compared with it.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterator
from typing import Any

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
BAR_WIDTH = 10
PROGRESS = re.compile(r"\|\s*(\d+)/(\d+) \[")  # tqdm's "| 12/119 [" (a bar's counts)


def is_static_view(output: dict) -> bool:
    return "static_view" in output.get("metadata", {}).get("minfer", {})


def widget_states(nb: nbformat.NotebookNode) -> dict[str, dict]:
    """model id -> that model's state, as the runner recorded it (empty once the notebook is cleaned)."""
    stored = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return {model_id: entry.get("state", {}) for model_id, entry in stored.items()}


def descendants(model_id: str, states: dict[str, dict]) -> Iterator[tuple[str, dict]]:
    """The model and every model below it (containers name their children ``IPY_MODEL_<id>``), depth first."""
    state = states.get(model_id, {})
    yield model_id, state
    for child in state.get("children", []):
        if isinstance(child, str) and child.startswith("IPY_MODEL_"):
            yield from descendants(child.removeprefix("IPY_MODEL_"), states)


def plain(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup or "")).strip()


def progress_line(container: dict, states: dict[str, dict]) -> str | None:
    """tqdm's widget is an HBox of (description HTML, progress bar, counts HTML): its line as text shows it."""
    parts = [states.get(c.removeprefix("IPY_MODEL_"), {}) for c in container.get("children", [])]
    bars = [p for p in parts if p.get("_model_name") in PROGRESS_MODELS]
    if not bars:
        return None
    bar = bars[0]
    done = 0 if not bar.get("max") else min(1.0, float(bar.get("value", 0)) / float(bar["max"]))
    filled = round(done * BAR_WIDTH)
    text = [plain(p.get("value", "")) for p in parts if p.get("_model_name") == "HTMLModel"]
    left, right = (text + ["", ""])[:2]
    return f"{left}|{'#' * filled}{' ' * (BAR_WIDTH - filled)}| {right}".strip()


def static_outputs(model_id: str, states: dict[str, dict]) -> list[dict]:
    """The static views of the widget output showing ``model_id`` (at least one, or ValueError)."""
    frames, lines = [], []
    for mid, state in descendants(model_id, states):
        if isinstance(state.get("frame"), dict) and state["frame"].get("views"):
            frames.append((mid, state["frame"]))
        elif (line := progress_line(state, states)) is not None:
            lines.append((mid, line))
    if not frames and not lines:
        kind = states.get(model_id, {}).get("_model_name", "no recorded state")
        raise ValueError(f"widget {model_id} ({kind}) has no static view: teach scripts/static_views.py to draw it")
    outputs = []
    if frames:
        from minfer.viz.snapshot import MIME, frame_pictures

        for (mid, frame), picture in zip(frames, frame_pictures([f for _, f in frames]), strict=True):
            caption = f"Static view of the dashboard as this chapter left it: {plain(frame.get('status', ''))}"
            outputs.append(nbformat.v4.new_output(
                "display_data", data={MIME: base64.b64encode(picture).decode(), "text/plain": caption},
                metadata={"minfer": {"static_view": mid}}))
    for mid, line in lines:
        outputs.append(nbformat.v4.new_output("display_data", data={"text/plain": line},
                                              metadata={"minfer": {"static_view": mid}}))
    return outputs


def add_static_views(nb: nbformat.NotebookNode) -> int:
    """Insert a static view after every widget output of ``nb`` (executed, widget state still recorded);
    returns how many were added. Static views from an earlier storage are replaced, never stacked."""
    states = widget_states(nb)
    added = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs: list[Any] = []
        for out in cell.get("outputs", []):
            if is_static_view(out):
                continue
            outputs.append(out)
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view:
                extra = static_outputs(view["model_id"], states)
                if len(extra) == 1 and set(extra[0]["data"]) == {"text/plain"}:  # one line of text says it all:
                    out["data"]["text/plain"] = extra[0]["data"]["text/plain"]  # the widget's fallback says it too
                outputs.extend(extra)
                added += len(extra)
        cell.outputs = outputs
    return added


def unseen_widgets(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader without a kernel would miss in a stored notebook: a widget output with no static view of
    its model right after it, a widget in a cell nbval compares, a progress bar stored short of its end."""
    problems = []
    for index, cell in enumerate(nb.cells):
        outputs = cell.get("outputs", []) if cell.cell_type == "code" else []
        for i, out in enumerate(outputs):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view:
                follows = outputs[i + 1] if i + 1 < len(outputs) else {}
                if not is_static_view(follows):
                    problems.append(f"cell {index}: a widget output with no static view after it")
                if "NBVAL_IGNORE_OUTPUT" not in cell.source:
                    problems.append(f"cell {index}: shows a widget but nbval compares it (# NBVAL_IGNORE_OUTPUT)")
            for text in (out.get("text", ""), out.get("data", {}).get("text/plain", "")):
                shown = "\n".join(line.rsplit("\r", 1)[-1] for line in str(text).split("\n"))  # what \r left
                for done, total in PROGRESS.findall(shown):
                    if done != total:
                        problems.append(f"cell {index}: a progress bar stored at {done}/{total}")
    return problems
