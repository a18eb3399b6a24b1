"""Every figure the chapters store follows the course style (``minfer.viz.style.check_figure``): every
numeric axis titled, the one course template, no fixed width -- checked on the committed outputs, so a
figure added without the style fails here, not in front of a class."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from minfer.viz import style

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"


def stored_figures() -> list[tuple[str, dict]]:
    figures = []
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            for out in cell.get("outputs", []):
                if PLOTLY in out.get("data", {}):
                    figures.append((f"{path.stem} cell {i}", out["data"][PLOTLY]))
    return figures


def test_the_course_stores_figures():
    assert len(stored_figures()) >= 20


@pytest.mark.parametrize("where, fig", stored_figures(), ids=lambda v: v if isinstance(v, str) else "")
def test_stored_figure_follows_the_course_style(where, fig):
    assert style.check_figure(fig) == [], where
