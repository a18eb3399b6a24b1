"""A freshly generated student build is honest: complete, stubbed, and still a working course.

What is proved here, on student builds made from this checkout (``build_student_copy``, what ``make student``
runs) in a temporary folder, with this environment's Python (the package imported from the copy -- checked):

* the copy holds every file of the repository but the instructor's own; only the exercise regions, the solution
  cells and the outputs that would give an answer away differ; every region is the stub; the self-study
  edition's ``solutions.json`` is the reference;
* in the class handout (the default; ``test_exercises_grading.py`` proves it carries no answers and how it is
  graded) every build check fails, each on its *own* stub (the failure is that exercise's
  ``NotImplementedError``, not an import error or another exercise's stub: the compiled reference stands in
  for the others meanwhile);
* the handout's test suite passes, except tests that reach an unwritten exercise, which are skipped with its
  name; a test skipped for another reason (no GPU) is skipped for that same reason in the repository;
* a chapter runs to the end in the handout for a student who has written nothing (the compiled reference
  stands in, saying so);
* in the self-study edition ``reveal`` writes the reference back and the check passes; a wrong edit of the file
  fails it again.

Bounded for CI: the handout's test suite runs a file for each piece of the engine the exercises write
(``HANDOUT_TESTS``), not all of them, without the ``browser`` test
(chapter 11 in a real browser: no exercise code of its own; the chapter run below covers stand-ins), and without
the ``slow`` (real model) and ``soak`` tests: every exercise region is reached by the tiny-model tests, and the
chapter run below drives the real model through the stand-ins. One chapter runs under nbval, not all twelve.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

from minfer.exercises import EXERCISES
from minfer.exercises.checking import subprocess_env
from minfer.exercises.regions import find_regions, replace_bodies
from minfer.exercises.standin import ROOT, is_student_build
from minfer.exercises.student import build_student_copy, instructor_only, output_text, repository_files

pytestmark = pytest.mark.skipif(is_student_build(), reason="makes a student build of the repository")
BUILD = [e.id for e in EXERCISES if e.kind == "build"]
# the engine with shared blocks: block pool, scheduler, runner and prefix cache at work, in about 20 s (chapter 06,
# the engine under memory pressure, runs 1,300 real-model steps: a minute longer)
CHAPTER = "notebooks/08_prefix_caching.ipynb"
# the handout's own tests, a file for each piece of the engine the exercises write (E1.1 the model's cache, E2.1 the
# baselines, E3.1/E8.x the pool, E4-E6 the engine and preemption, E9.x the policies, E10.x the simulator, E11.1 the
# trace, E12.1 the sampler), the layering and the docs, and one that skips without a GPU: about 40 s, where the
# whole suite takes 8 minutes and proves nothing more about stubs
HANDOUT_TESTS = [f"tests/test_{name}.py" for name in (
    "model", "baselines", "block_pool", "engine", "preemption", "prefix_caching", "policies", "sim", "decisions",
    "viz", "sampler", "layers", "docs", "cuda")]


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    """The self-study edition."""
    dest = tmp_path_factory.mktemp("student") / "course"
    build_student_copy(ROOT, dest, self_study=True)
    return dest


def python(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=subprocess_env(cwd), capture_output=True,
                          text=True, timeout=timeout)


def test_the_copy_is_complete_and_every_region_is_a_stub(student):
    reference = find_regions(ROOT)
    stubbed = {r.rel for r in reference}
    for rel in repository_files(ROOT):
        if instructor_only(rel):
            assert not (student / rel).is_file() or rel == "docs/instructor.md", f"{rel} is the instructor's"
            continue
        assert (student / rel).is_file(), f"{rel} is missing from the student build"
        if rel not in stubbed and not rel.endswith(".ipynb"):
            assert (student / rel).read_bytes() == (ROOT / rel).read_bytes(), f"{rel} changed"
    regions = find_regions(student)
    key = lambda r: (r.exercise, r.rel, r.unit, r.index)  # noqa: E731
    assert sorted(map(key, regions)) == sorted(map(key, reference))
    assert all(r.is_stub for r in regions), [key(r) for r in regions if not r.is_stub]
    solutions = json.loads((student / "minfer/exercises/solutions.json").read_text())["regions"]
    assert {(s["exercise"], s["file"], s["unit"], s["index"]): s["body"] for s in solutions} == \
        {key(r): r.body for r in reference}
    giveaways = {line.strip() for r in reference for line in r.body.splitlines() if len(line.strip()) >= 24}
    for path in sorted((student / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            tags = cell.metadata.get("tags", [])
            assert "solution" not in tags, f"{path.name}: a solution cell was left in"
            if cell.cell_type == "code":
                text = output_text(cell.outputs)
                assert not ("exercise" in tags and cell.outputs), f"{path.name}: an exercise cell kept its output"
                assert not [g for g in giveaways if g in text], f"{path.name}: an output shows reference code"
    run = python(student, "-c", "import minfer; print(minfer.__file__)")
    assert Path(run.stdout.strip()).is_relative_to(student), "the copy must import its own package"


def test_every_build_check_fails_on_its_own_stub(handout):
    run = python(handout, "-m", "minfer.exercises", "check", "--all", "--json")
    data = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(data["package"]).is_relative_to(handout)
    results = {r["exercise"]: r for r in data["results"]}
    assert sorted(results) == sorted(BUILD)
    for ex, r in results.items():
        assert r["status"] == "failed" and r["stub"] == ex, f"{ex} did not fail on its own stub: {r}"


@pytest.mark.long  # the student build's own pytest, whole
def test_the_handouts_tests_pass_or_skip_naming_an_exercise(handout, tmp_path):
    junit = tmp_path / "student.xml"
    run = python(handout, "-m", "pytest", *HANDOUT_TESTS, "-q", "-p", "no:cacheprovider",
                 "-m", "not (browser or slow or soak)", f"--junitxml={junit}", timeout=1800)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        assert bad is None, f"{node} failed in the student build:\n{bad.get('message')}\n{run.stdout[-3000:]}"
        skip = case.find("skipped")
        outcomes[node] = None if skip is None else skip.get("message", "")
    assert run.returncode == 0, run.stdout[-3000:]
    by_exercise = [n for n, why in outcomes.items() if why and "needs exercise E" in why]
    passed = [n for n, why in outcomes.items() if why is None]
    assert by_exercise and passed, "some tests need an exercise, others need none"
    other = {n: why for n, why in outcomes.items() if why and "needs exercise E" not in why}
    if other:  # skipped for another reason (no GPU...): the repository must skip them for that same reason
        ref_junit = tmp_path / "reference.xml"
        python(ROOT, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={ref_junit}",
               *sorted({module_path(n) for n in other}))
        reference = {f"{c.get('classname')}::{c.get('name')}": c.find("skipped")
                     for c in ET.parse(ref_junit).getroot().iter("testcase")}
        for node, why in other.items():
            ref = reference.get(node)
            assert ref is not None and ref.get("message", "") == why, (
                f"{node} is skipped in the student build ({why}) but not for that reason in the repository")


def module_path(node: str) -> str:
    """``tests.test_cuda.TestX::test_y`` -> ``tests/test_cuda.py``."""
    parts = node.split("::")[0].split(".")
    last = next(i for i, p in enumerate(parts) if p.startswith("test_"))
    return "/".join(parts[: last + 1]) + ".py"


@pytest.mark.long
def test_a_chapter_runs_for_a_student_who_wrote_nothing(handout):
    run = python(handout, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "-q",
                 CHAPTER, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]


def test_reveal_and_file_edits_reach_the_check(student):
    """Runs last: it edits the copy (and puts the stubs back)."""
    path = student / "minfer/kv/block_pool.py"
    stubbed = path.read_text()
    try:
        assert python(student, "-m", "minfer.exercises", "reveal", "E3.1").returncode == 0
        assert not any(r.is_stub for r in find_regions(student) if r.exercise == "E3.1")
        run = python(student, "-m", "minfer.exercises", "check", "E3.1", "--json")
        assert json.loads(run.stdout.splitlines()[-1])["status"] == "passed", run.stdout
        text = path.read_text()
        wrong = {("E3.1", "BlockPool.blocks_for", 0): "        return num_tokens // self.block_size + 1\n"}
        path.write_text(replace_bodies(text, path, "minfer/kv/block_pool.py", wrong))
        run = python(student, "-m", "minfer.exercises", "check", "E3.1", "--json")
        result = json.loads(run.stdout.splitlines()[-1])
        assert result["status"] == "failed" and result["stub"] is None and "blocks_for" in result["case"]
        status = python(student, "-m", "minfer.exercises", "status").stdout
        assert "E3.1" in status and "written" in status and "not started" in status
    finally:
        path.write_text(stubbed)
