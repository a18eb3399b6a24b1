"""Notebooks are committed small and clean: no saved widget state, under 500 KB each."""

from pathlib import Path

import nbformat
import pytest
import torch

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "the course has no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    assert path.stat().st_size < 500_000, f"{path.name} is {path.stat().st_size // 1000} KB: strip outputs"
    nb = nbformat.read(path, as_version=4)
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
