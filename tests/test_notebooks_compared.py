"""nbval compares most of what the course shows: at least 70% of the code cells with stored outputs over the
course, and 40% in every chapter (``scripts/compared_cells.py`` prints the table; ``-s`` shows it here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from compared_cells import CHAPTERS, course_shares, main  # noqa: E402

COURSE_MIN, CHAPTER_MIN = 0.70, 0.40


def test_most_stored_outputs_are_compared(capsys):
    assert len(CHAPTERS) >= 13
    shares, overall = course_shares()
    with capsys.disabled():
        main([])
    low = [f"{s.chapter}: {s.compared}/{s.with_outputs}" for s in shares if s.share < CHAPTER_MIN]
    assert not low, f"chapters whose outputs nbval mostly does not compare (under {CHAPTER_MIN:.0%}): {low}"
    assert overall >= COURSE_MIN, f"the course compares {overall:.0%} of its stored outputs (at least {COURSE_MIN:.0%})"


def test_markers_are_counted_as_not_compared(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    for source in ("print(1)", "# NBVAL_IGNORE_OUTPUT\nprint(2)", "# NBVAL_SKIP\nprint(3)", "x = 1"):
        cell = nbformat.v4.new_code_cell(source)
        if "print" in source:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
        nb.cells.append(cell)
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, path)
    shares, overall = course_shares([path])
    assert (shares[0].with_outputs, shares[0].compared) == (3, 1) and abs(overall - 1 / 3) < 1e-9
