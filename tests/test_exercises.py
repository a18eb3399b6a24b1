"""The exercises on the reference code: the catalog is complete, every region is well formed, every check
passes, every prediction is measured and compared, and every exercise is reachable from its chapter."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from minfer.exercises import EXERCISES, check, get, run_exercise, stand_in
from minfer.exercises.catalog import stub_message
from minfer.exercises.checking import checker_of
from minfer.exercises.regions import RegionError, find_regions, regions_in_text, stub_body
from minfer.exercises.standin import ROOT, is_student_build
from minfer.exercises.student import validate

BUILD = [e.id for e in EXERCISES if e.kind == "build"]
PREDICT = [e.id for e in EXERCISES if e.kind == "predict"]
pytestmark = pytest.mark.skipif(is_student_build(), reason="checks the reference repository")


def notebook_of(chapter: int) -> Path:
    (path,) = (ROOT / "notebooks").glob(f"{chapter:02d}_*.ipynb")
    return path


# every chapter after the tour sets exercises: 01-15
CHAPTERS = sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if p.name[:2] != "00")


def test_every_chapter_sets_exercises():
    ids = [e.id for e in EXERCISES]
    assert len(ids) == len(set(ids)) >= 40
    for e in EXERCISES:
        assert re.fullmatch(rf"E{e.chapter}\.\d+", e.id), f"{e.id} is numbered for chapter {e.chapter}"
    assert CHAPTERS[:15] == list(range(1, 16))
    assert {e.chapter for e in EXERCISES} == set(CHAPTERS), "an exercise without its chapter, or the reverse"
    for chapter in CHAPTERS:
        mine = [e for e in EXERCISES if e.chapter == chapter]
        numbers = sorted(int(e.id.split(".")[1]) for e in mine)
        assert numbers == list(range(1, len(mine) + 1)), f"chapter {chapter}: exercises {numbers} are not 1..n"
        assert any(e.kind == "build" for e in mine), f"chapter {chapter:02d} has no build exercise"
    kinds = {e.kind for e in EXERCISES}
    assert kinds == {"build", "predict", "explain"}


def test_regions_name_build_exercises_and_every_build_exercise_has_one():
    regions = find_regions(ROOT)
    validate(regions)
    for r in regions:
        assert not r.is_stub and r.body.strip(), f"{r.rel}:{r.begin}: the repository must hold the reference"
        msg = stub_message(get(r.exercise), r.unit)
        assert re.search(r"see chapter \d\d §", msg) and "\n" not in msg


def test_misplaced_markers_are_refused():
    def regions(src: str):
        return regions_in_text(src, Path("x.py"), "x.py")

    with pytest.raises(RegionError, match="never closed"):
        regions("def f():\n    # BEGIN EXERCISE E3.1\n    return 1\n")
    with pytest.raises(RegionError, match="not inside a function"):
        regions("# BEGIN EXERCISE E3.1\nX = 1\n# END EXERCISE\n")
    with pytest.raises(RegionError, match="one exercise per unit"):
        regions("def f():\n    # BEGIN EXERCISE E3.1\n    a = 1\n    # END EXERCISE\n"
                "    # BEGIN EXERCISE E8.1\n    return a\n    # END EXERCISE\n")
    with pytest.raises(RegionError, match="runs into the next function"):
        regions("def f():\n    # BEGIN EXERCISE E3.1\n    return 1\ndef g():\n    return 2\n# END EXERCISE\n")
    (r,) = regions('class A:\n    def f(self):\n        """doc: # BEGIN EXERCISE E9.9"""\n'
                   "        # BEGIN EXERCISE E3.1\n        return 1\n        # END EXERCISE\n")
    assert (r.unit, r.body, r.indent) == ("A.f", "        return 1\n", "        ")
    stub = '        raise NotImplementedError("E3.1: x, see chapter 03 §y")\n'
    assert stub_body(r, "E3.1: x, see chapter 03 §y") == stub


def test_regions_follow_the_text_they_were_read_from():
    """Regions are parsed once per file content (a check reads them four times): the same file with new text gives
    the new text's regions, each read hands out a list of its own, and a marker out of place is refused on every
    read, not only the first."""
    src = "def f():\n    # BEGIN EXERCISE E3.1\n    return 1\n    # END EXERCISE\n"
    first = regions_in_text(src, Path("x.py"), "x.py")
    first.clear()
    (a,) = regions_in_text(src, Path("x.py"), "x.py")
    (b,) = regions_in_text(src.replace("return 1", "return 2"), Path("x.py"), "x.py")
    assert (a.body, b.body) == ("    return 1\n", "    return 2\n")
    for _ in range(2):
        with pytest.raises(RegionError, match="never closed"):
            regions_in_text(src.replace("    # END EXERCISE\n", ""), Path("x.py"), "x.py")


@pytest.mark.parametrize("exercise", BUILD)
def test_reference_passes_its_check(exercise):
    result = run_exercise(exercise)
    assert result.passed, result.report()
    assert result.stand_ins == [], "in the repository nothing needs a stand-in"


@pytest.mark.parametrize("exercise", PREDICT)
def test_prediction_is_measured_and_compared(exercise):
    m = checker_of(get(exercise))()
    assert m.value == m.value and len(m.explain) > 100, "a number, and why it is what it is"
    assert m.accepts(m.value) and m.tolerance_text()
    assert not m.accepts(10 * m.value + 100) and not m.accepts(-1), "a wild guess must not pass"
    assert run_exercise(exercise).status == "unanswered", "no number yet: nothing is measured or revealed"


def test_check_runs_in_a_fresh_process_and_prints_a_verdict(capsys):
    result = check("E3.2", 4)
    out = capsys.readouterr().out
    assert result.passed and "PASSED" in out and "49" in out
    result = check("E3.2", 3)
    out = capsys.readouterr().out
    assert result.status == "failed" and result.measured == 4 and "predicted 3 blocks, measured 4" in out
    assert check("E3.3").status == "written" and "docs/instructor.md" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no exercise 'E99.1'"):
        check("E99.1")


def test_stand_in_does_nothing_in_the_repository():
    assert stand_in() == []


def test_every_exercise_is_reachable_from_its_chapter():
    for chapter in sorted({e.chapter for e in EXERCISES}):
        nb = nbformat.read(notebook_of(chapter), as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for e in (e for e in EXERCISES if e.chapter == chapter):
            assert f"### Exercise {e.id} · {e.kind}" in text, f"chapter {chapter:02d} does not set {e.id}"
            if e.kind != "explain":
                assert re.search(rf'check\("{re.escape(e.id)}"', code), f"chapter {chapter:02d} never checks {e.id}"


def test_exercise_cells_keep_notebooks_honest():
    """Check cells are tagged (the student build clears their outputs) and skipped by nbval (tests above run
    every check); a model prediction sits in a cell tagged `solution`, after the student's own cell."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            tags = cell.metadata.get("tags", [])
            if cell.cell_type == "code" and re.search(r'check\("E', cell.source):
                assert "exercise" in tags and "NBVAL_SKIP" in cell.source, f"{path.name} cell {i}"
            if "solution" in tags:
                assert "prediction = None" in nb.cells[i - 1].source, f"{path.name} cell {i}: no student cell before"


def test_the_instructor_guide_answers_every_exercise():
    guide = (ROOT / "docs/instructor.md").read_text()
    for e in EXERCISES:
        after = ", ".join(e.requires) or "-"
        assert f"| {e.id} | {e.kind} | {e.minutes} | {e.difficulty} | {after} | {e.title} |" in guide, (
            f"{e.id}: not in the guide's table (or not as the catalog says)")
        assert re.search(rf"^#### {re.escape(e.id)} · {e.kind}: ", guide, re.M), f"{e.id}: no model answer in the guide"


def test_the_course_ramps_and_every_chapter_announces_its_exercises_as_the_catalog_says():
    """Kind, difficulty, time and prerequisites are stated once, in the catalog; every chapter's heading of an
    exercise is the catalog's ``heading``. Prerequisites come earlier; never two hard exercises in a row."""
    order = [e.id for e in EXERCISES]
    for i, e in enumerate(EXERCISES):
        assert e.difficulty in (1, 2, 3) and e.minutes > 0, e.id
        assert all(r in order[:i] for r in e.requires), f"{e.id} requires {e.requires}: not all set before it"
        if i and e.difficulty == 3:
            assert EXERCISES[i - 1].difficulty < 3, f"{EXERCISES[i - 1].id} and {e.id}: two hard exercises in a row"
    for chapter in CHAPTERS:
        cells = [c.source for c in nbformat.read(notebook_of(chapter), as_version=4).cells if c.cell_type == "markdown"]
        for e in (e for e in EXERCISES if e.chapter == chapter):
            assert any(c.startswith(f"### {e.heading}\n") for c in cells), f"chapter {chapter:02d} lacks '{e.heading}'"
