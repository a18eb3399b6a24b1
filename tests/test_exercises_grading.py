"""Grading from the instructor's copy cannot be fooled from the student's tree.

On a class handout made from this checkout (``build_student_copy``, what ``make student`` writes), this proves:

* the handout carries no answers: no reference source (its stand-ins are compiled), no hidden cases, no model
  answers, no tests whose wrong solutions are the reference with one line changed, no region's code in its files;
* a student's round trip: the stub fails its own check, a correct solution of their own (not the reference's
  text) passes it, and the instructor's grade says ``pass``; the reference pasted in is graded ``revealed``;
* every route by which a student could try to raise the grade from their tree -- editing or deleting the
  checks, the catalog, the stand-ins, adding a ``sitecustomize.py``, code appended to a module outside the
  markers, a forged progress file -- leaves the grade of a wrong solution exactly what it was;
* code between the markers that rewrites the harness while the check runs is graded ``tampered``, a region
  whose markers are gone ``missing``, and the grader refuses to run inside a student build.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from minfer.exercises.checking import subprocess_env
from minfer.exercises.regions import find_regions, replace_bodies
from minfer.exercises.standin import ROOT, is_student_build

pytestmark = pytest.mark.skipif(is_student_build(), reason="grades from the reference repository")

EX, FILE, UNIT = "E2.1", "minfer/baselines.py", "slot_accounting"  # a check that runs in about two seconds
REFERENCE = next(r.body for r in find_regions(ROOT) if (r.exercise, r.unit) == (EX, UNIT))
WRONG = REFERENCE.replace("range(1, max(outs))", "range(max(outs))")  # one decode pass too many
# a correct solution of the student's own: the same counts, computed row by row
OWN = '''
    steps = []
    for batch in _batches(len(prompt_lens), batch_size):
        lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
        longest = max(lens)
        steps.append({"batch_slots": batch_size, "useful": sum(lens),
                      "padding": sum(longest - n for n in lens), "idle_slots": batch_size - len(batch), "bubbles": 0})
        for t in range(1, max(outs)):
            useful = len([n for n in outs if n > t])
            steps.append({"batch_slots": batch_size, "useful": useful, "padding": 0,
                          "idle_slots": batch_size - len(batch), "bubbles": len(batch) - useful})
    return steps
'''


def copy_of(handout: Path, where: Path, body: str | None = None) -> Path:
    """A student's copy of the handout, with ``body`` written into E2.1's region."""
    shutil.copytree(handout, where, symlinks=True)
    if body is not None:
        path = where / FILE
        path.write_text(replace_bodies(path.read_text(), path, FILE, {(EX, UNIT, 0): body}))
    return where


def python(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=subprocess_env(cwd), capture_output=True,
                          text=True, timeout=600)


def graded(*copies: Path, out: Path, only: str = EX) -> dict[str, dict]:
    """Grade ``copies`` from this checkout; each student's JSON report by name."""
    run = python(ROOT, "-m", "minfer.exercises.grade", *map(str, copies), "--only", only, "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    return {c.name: json.loads((out / f"{c.name}.json").read_text()) for c in copies}


def test_the_handout_carries_no_answers(handout):
    pkg = handout / "minfer/exercises"
    assert json.loads((pkg / "student_build.json").read_text())["edition"] == "class"
    assert not (pkg / "solutions.json").exists() and not (pkg / "hidden").exists()
    compiled = (pkg / "reference.marshal").read_bytes()  # the stand-ins: code objects, no source line
    assert not [line for r in find_regions(ROOT) for line in r.body.splitlines()
                if len(line.strip()) >= 24 and line.strip().encode() in compiled]
    assert not list((handout / "tests").glob("test_exercises*")), "the exercise machinery's tests stay home"
    guide = (handout / "docs/instructor.md").read_text()
    assert "model answers" in guide and "## " not in guide, "only a page saying where the guide is"
    regions = find_regions(ROOT)
    assert all(r.is_stub for r in find_regions(handout))
    texts = {p: re.sub(r"\s+", " ", p.read_text(errors="ignore")) for p in handout.rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".ipynb", ".json", ".txt", ".cfg", ".toml")}
    for r in regions:
        lines = [x.strip() for x in r.body.splitlines() if x.strip() and not x.strip().startswith("#")]
        for i in range(len(lines) - 2):  # three lines of a region in a row give it away (one line may recur:
            piece = " ".join(lines[i : i + 3])  # HostBlockPool.blocks_for is BlockPool's one-line ceiling division)
            leaks = [p.relative_to(handout) for p, t in texts.items() if piece in t]
            assert not leaks, f"{r.exercise} {r.unit}: {piece!r} is in {leaks}"


def test_a_students_round_trip(handout, tmp_path):
    student = copy_of(handout, tmp_path / "ada")
    run = python(student, "-m", "minfer.exercises", "check", EX, "--json")
    first = json.loads(run.stdout.splitlines()[-1])
    assert first["status"] == "failed" and first["stub"] == EX, "the stub fails, naming itself"
    path = student / FILE
    path.write_text(replace_bodies(path.read_text(), path, FILE, {(EX, UNIT, 0): OWN}))
    run = python(student, "-m", "minfer.exercises", "check", EX, "--json")
    assert json.loads(run.stdout.splitlines()[-1])["status"] == "passed", run.stdout[-2000:]
    assert not json.loads(run.stdout.splitlines()[-1])["hidden_cases"], "the handout runs the public cases only"
    pasted = copy_of(handout, tmp_path / "bob", REFERENCE)
    untouched = copy_of(handout, tmp_path / "cy")
    report = graded(student, pasted, untouched, out=tmp_path / "grades")
    assert report["ada"]["exercises"][EX]["mark"] == "pass" and report["ada"]["score"] == 1
    assert report["bob"]["exercises"][EX]["mark"] == "revealed" and report["bob"]["score"] == 0
    assert report["cy"]["exercises"][EX]["mark"] == "todo"
    table = (tmp_path / "grades/grades.csv").read_text().splitlines()
    assert table[0] == f"student,{EX},score,problem" and table[1].startswith("ada,pass,1")


def _edit(rel: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(copy: Path) -> None:
        path = copy / rel
        path.write_text(change(path.read_text()))
    return apply


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def apply(copy: Path) -> None:
        (copy / rel).write_text(text)
    return apply


PASS_EVERYTHING = """
import minfer.exercises.checking as _c
from minfer.exercises.harness import CheckResult as _R
_c.run_exercise = lambda ex, *a, **k: _R(ex, "build", "passed")
"""
ROUTES: dict[str, Callable[[Path], None]] = {
    "a checker that checks nothing": _edit("minfer/exercises/checks/ch02.py",
                                           lambda s: s + "\n\ndef check_slot_accounting(t):\n    pass\n"),
    "the checks deleted": lambda copy: shutil.rmtree(copy / "minfer/exercises/checks"),
    "the catalog pointing elsewhere": _edit("minfer/exercises/catalog.py",
                                            lambda s: s.replace("ch02:check_slot_accounting", "ch01:check_kv_cache")),
    "stand-ins that never install": _edit("minfer/exercises/standin.py",
                                          lambda s: s + "\nStandIns.install_bodies = lambda self, bodies: None\n"),
    "a sitecustomize.py": _write("sitecustomize.py", PASS_EVERYTHING),
    "code appended to the module": _edit(FILE, lambda s: s + PASS_EVERYTHING),
    "a forged progress file": _write("progress.json", json.dumps(
        {"checks": [{"exercise": EX, "status": "passed", "when": "2026-01-01 00:00:00"}]})),
}


@pytest.fixture(scope="module")
def wrong_grade(handout, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wrong")
    report = graded(copy_of(handout, tmp / "plain", WRONG), out=tmp / "grades")["plain"]["exercises"][EX]
    assert report["mark"] == "FAIL" and report["case"], report
    return report


@pytest.mark.parametrize("route", list(ROUTES))
def test_editing_the_students_tree_cannot_raise_the_grade(handout, wrong_grade, tmp_path, route):
    copy = copy_of(handout, tmp_path / "eve", WRONG)
    ROUTES[route](copy)
    report = graded(copy, out=tmp_path / "grades")["eve"]["exercises"][EX]
    assert (report["mark"], report["case"]) == (wrong_grade["mark"], wrong_grade["case"]), route


def test_code_that_rewrites_the_harness_is_graded_tampered(handout, tmp_path):
    body = WRONG.replace("    steps = []\n", """    import contextlib
    from minfer.exercises import harness

    @contextlib.contextmanager
    def lenient(self, name, hint=""):
        try:
            yield
        except AssertionError:
            self.passed.append(name)

    harness.Tester.case = lenient
    steps = []
""", 1)
    report = graded(copy_of(handout, tmp_path / "mal", body), out=tmp_path / "grades")["mal"]["exercises"][EX]
    assert report["mark"] == "tampered" and "Tester.case" in report["message"], report
    assert any("minfer.exercises" in f for f in report["flags"]), "the body is flagged for the instructor to read"


def test_removed_markers_are_missing_and_a_student_build_cannot_grade(handout, tmp_path):
    copy = copy_of(handout, tmp_path / "max")
    _edit(FILE, lambda s: s.replace("# BEGIN EXERCISE E2.1", "# (mine)").replace("# END EXERCISE", "# (end)"))(copy)
    assert graded(copy, out=tmp_path / "grades")["max"]["exercises"][EX]["mark"] == "missing"
    run = python(handout, "-m", "minfer.exercises.grade", str(copy), "--only", EX)
    assert run.returncode != 0 and "instructor's full checkout" in run.stderr
