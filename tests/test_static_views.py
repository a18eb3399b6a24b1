"""Every widget a stored chapter shows leaves a picture: the static views ``scripts/static_views.py`` stores
beside widget outputs, the checker that finds a widget without one, and the dashboard drawn to a picture."""

from __future__ import annotations

import base64
import struct
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import require_browser, tiny_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from static_views import (  # noqa: E402
    WIDGET_STATE,
    WIDGET_VIEW,
    add_static_views,
    is_static_view,
    progress_line,
    unseen_widgets,
)

from minfer import SamplingParams  # noqa: E402
from minfer.viz.frame import FrameOptions, dashboard_frame  # noqa: E402
from minfer.viz.recorder import Recorder  # noqa: E402
from minfer.viz.snapshot import MIME, SCALE, WIDTH, frame_pictures  # noqa: E402
from minfer.viz.style import ColorMap  # noqa: E402

JPEG_START = b"\xff\xd8\xff"  # a JPEG file's first bytes (start of image, then a marker)


def tqdm_states(value: int, total: int) -> dict[str, dict]:
    """The models tqdm's notebook bar is made of: an HBox of (description, bar, counts)."""
    return {
        "box": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_desc", "IPY_MODEL_bar", "IPY_MODEL_counts"]},
        "desc": {"_model_name": "HTMLModel", "value": "frames: 100%" if value == total else "frames:   0%"},
        "bar": {"_model_name": "FloatProgressModel", "value": value, "max": total},
        "counts": {"_model_name": "HTMLModel", "value": f" {value}/{total} [00:04&lt;00:00, 27.1it/s]"},
    }


def notebook_showing(model_id: str, states: dict[str, dict], source: str = "# NBVAL_IGNORE_OUTPUT\nshow()"):
    """An executed notebook (widget state still recorded, as the runner holds it) with one widget output."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0},
        "text/plain": "HBox(children=(...))"})]
    nb.cells.append(cell)
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": {k: {"state": v} for k, v in states.items()}}}
    return nb


def test_a_progress_bar_is_stored_at_its_end():
    states = tqdm_states(119, 119)
    assert progress_line(states["box"], states) == "frames: 100%|##########| 119/119 [00:04<00:00, 27.1it/s]"
    nb = notebook_showing("box", states)
    assert add_static_views(nb) == 1
    widget, view = nb.cells[0].outputs
    assert is_static_view(view) and view.data["text/plain"].endswith("119/119 [00:04<00:00, 27.1it/s]")
    assert widget.data["text/plain"] == view.data["text/plain"]  # the widget's own fallback no longer says 0/119
    assert unseen_widgets(nb) == []


def test_storing_twice_replaces_the_static_view():
    nb = notebook_showing("box", tqdm_states(119, 119))
    add_static_views(nb)
    add_static_views(nb)
    assert [is_static_view(o) for o in nb.cells[0].outputs] == [False, True]


def test_a_widget_it_cannot_draw_is_an_error():
    nb = notebook_showing("w", {"w": {"_model_name": "IntSliderModel", "value": 3}})
    with pytest.raises(ValueError, match="IntSliderModel"):
        add_static_views(nb)


def test_the_checker_finds_what_a_reader_would_miss():
    nb = notebook_showing("box", tqdm_states(0, 119), source="show()")
    problems = unseen_widgets(nb)
    assert any("no static view" in p for p in problems)
    assert any("NBVAL_IGNORE_OUTPUT" in p for p in problems)
    frozen = nbformat.v4.new_code_cell("run()")
    frozen.outputs = [nbformat.v4.new_output("stream", name="stderr",
                                             text="frames:   0%|          | 0/119 [00:00<?, ?it/s]\r"
                                                  "frames:  50%|#####     | 60/119 [00:02<00:02, 27it/s]")]
    nb.cells.append(frozen)
    assert "cell 1: a progress bar stored at 60/119" in unseen_widgets(nb)
    frozen.outputs[0].text += "\rframes: 100%|##########| 119/119 [00:04<00:00, 27it/s]"
    assert not any(p.startswith("cell 1") for p in unseen_widgets(nb))  # what \r left on screen is the end


def test_a_dashboard_frame_is_drawn_to_a_picture(tiny):
    require_browser()
    frames = dashboard_frames(tiny)
    pictures = frame_pictures(frames)
    assert len(pictures) == 2
    for picture in pictures:
        assert picture.startswith(JPEG_START)
        height, width = jpeg_size(picture)
        assert width == round((WIDTH + 16) * SCALE) and height > 300  # the stage (WIDTH + padding), charts and all
    assert pictures[0] != pictures[1]  # two steps, two pictures


def jpeg_size(picture: bytes) -> tuple[int, int]:
    """(height, width) from the JPEG's frame header (a baseline or progressive SOF marker)."""
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        if (at := picture.find(marker)) >= 0:
            return struct.unpack(">HH", picture[at + 5:at + 9])
    raise AssertionError("no frame header: not a JPEG")


def dashboard_frames(tiny) -> list[dict]:
    """The first and last frame of a small recorded run on the tiny model."""
    engine = tiny_engine(tiny)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(10, 30 + 4 * i)),
                           SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0))
    rec = Recorder(engine)
    while not rec.done():
        rec.step()
        engine.scheduler.check_invariants()
    rec.sync_metrics()
    colors = ColorMap()
    return [dashboard_frame(rec.recording, i, colors, FrameOptions()) for i in (0, len(rec.recording) - 1)]


def test_stored_static_views_are_pictures():
    """Every stored dashboard view is a JPEG, and every stored chapter passes the checker."""
    stored = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    images = 0
    for path in stored:
        nb = nbformat.read(path, as_version=4)
        assert unseen_widgets(nb) == [], path.name
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                if is_static_view(out) and set(out.get("data", {})) != {"text/plain"}:
                    assert base64.b64decode(out.data[MIME]).startswith(JPEG_START)
                    images += 1
    assert images >= 4, "chapters 11 and 12 show dashboards: their static views are missing"
