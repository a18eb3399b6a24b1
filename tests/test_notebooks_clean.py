"""Notebooks are committed small and clean: no saved widget state, under 500 KB each apart from the pictures of
their dashboards (static views: a PNG each, under 400 KB, stored where a saved widget would show nothing)."""

from pathlib import Path

import nbformat
import pytest
import torch

LIMIT = 500_000  # bytes of a chapter, its dashboards' pictures aside
PICTURE_LIMIT = 400_000  # bytes of one picture (base64): a dashboard at 1x is ~300 KB

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "the course has no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    pictures = [out["data"]["image/png"] for cell in nb.cells for out in cell.get("outputs", [])
                if out.get("metadata", {}).get("minfer", {}).get("static_view") and "image/png" in out.get("data", {})]
    for picture in pictures:
        assert len(picture) < PICTURE_LIMIT, f"{path.name}: a static view of {len(picture) // 1000} KB"
    size = path.stat().st_size - sum(len(p) for p in pictures)
    assert size < LIMIT, f"{path.name} is {size // 1000} KB without its static views: strip outputs"
    assert "widgets" not in nb.metadata, f"{path.name} carries saved widget state: run scripts/clean_notebooks.py"
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-state+json" not in out.get("data", {})


def test_the_course_device_follows_minfer_device(monkeypatch):
    from minfer.notebook import course_device

    monkeypatch.setenv("MINFER_DEVICE", "cpu")
    assert course_device() == "cpu"
    monkeypatch.delenv("MINFER_DEVICE")
    assert course_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("MINFER_DEVICE", "gpu")
    with pytest.raises(ValueError, match="MINFER_DEVICE"):
        course_device()
