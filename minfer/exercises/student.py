"""``make student``: a copy of the repository in which the student writes the engine.

The copy is complete -- the package, the chapters, the tests, the Makefile -- with these changes:

1. the body of every exercise region becomes ``raise NotImplementedError("E3.1: write BlockPool.allocate
   (...), see chapter 03 §The BlockPool")``; the markers stay, so the student (and the grader) find the place;
2. notebook cells tagged ``solution`` (model predictions) are removed, and outputs that would give an
   answer away -- those of cells tagged ``exercise`` (a check that passed on the reference) and any output
   quoting a region's code (``show_source`` of a function the student is to write) -- are cleared;
3. what only the instructor may hold stays out (``INSTRUCTOR_ONLY``): the hidden cases, the model answers of
   ``docs/instructor.md`` (a page saying where the guide is takes its place, so links still work), and the
   tests of the exercise machinery, whose wrong solutions are the reference with one line changed;
4. ``minfer/exercises/student_build.json`` marks the copy as a student build and names its edition.

Two editions. The **class handout** (the default) carries no reference *source*: its students are graded,
from the instructor's copy (``grade.py``), so nothing in their tree can raise the grade, and nothing in it is an
answer to copy. Yet a chapter needs the whole engine before the student has written all of it (chapter 01
already runs the scheduler of chapter 04), so the handout keeps the stand-ins as compiled code objects
(``reference.marshal``): they run like the reference, and ``reveal`` has nothing to show. (Compiled code can be
disassembled, as the public repository can be read: the grade does not rest on it -- hidden cases, and a body
equal to the reference's is graded "revealed".) The **self-study** edition (``self_study=True``, ``make student
SELF_STUDY=1``) ships ``solutions.json`` instead, the reference bodies as source, for ``reveal`` -- peeking is
allowed when no one grades.
"""

from __future__ import annotations

import ast
import json
import marshal
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from minfer.exercises.catalog import BY_ID, EXERCISES, get, stub_message
from minfer.exercises.regions import Region, RegionError, find_regions, replace_bodies, stub_body
from minfer.exercises.standin import COMPILED, ROOT, SOLUTIONS, STUDENT_BUILD, compile_unit, is_triton_module

INSTRUCTOR_ONLY = ("minfer/exercises/hidden/", "docs/instructor.md", "tests/test_exercises", "tests/exercise_")
GUIDE_PLACEHOLDER = """# The instructor's guide

This is a student build of the course: the instructor's guide -- the model answers of the predict and explain
exercises, the rubrics and the grading workflow -- is not part of it. Your checks say what each build exercise
needs; your instructor has the rest.
"""
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
             ".ipynb_checkpoints", "node_modules"}


@dataclass(slots=True)
class StudentBuild:
    path: Path
    files: int
    regions: int
    notebooks: int
    solution_cells: int
    cleared_outputs: int
    edition: str  # "class" (no reference solutions) or "self-study" (solutions.json for reveal and stand-ins)


def repository_files(root: Path) -> list[str]:
    """Files of the repository, relative to ``root``: what git tracks plus new files it does not ignore (a
    clean clone gives exactly the tracked files); without git, every file outside build and cache folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout.decode()
        return sorted(f for f in set(out.split("\0")) if f and (root / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(root).parts)
                      and not any(part.endswith(".egg-info") for part in p.parts))


def validate(regions: list[Region]) -> None:
    """Every region names a build exercise of the catalog, and every build exercise has a region."""
    for r in regions:
        ex = BY_ID.get(r.exercise)
        if ex is None or ex.kind != "build":
            raise RegionError(f"{r.rel}:{r.begin}: {r.exercise} is not a build exercise of the catalog")
    missing = [e.id for e in EXERCISES if e.kind == "build" and e.id not in {r.exercise for r in regions}]
    if missing:
        raise RegionError(f"build exercises without a region in the package: {', '.join(missing)}")


def compiled_stand_ins(src: Path, regions: list[Region]) -> bytes:
    """The class handout's stand-ins: every unit holding a region, with the reference bodies, as a compiled code
    object (``marshal``), and the Python version that compiled it. A Triton kernel has none: Triton compiles a
    kernel from its source, and only chapter 07 launches it."""
    compiled = {}
    for rel, unit in sorted({(r.rel, r.unit) for r in regions}):
        if is_triton_module(src / rel):
            continue
        bodies = {(r.exercise, r.unit, r.index): r.body for r in regions if (r.rel, r.unit) == (rel, unit)}
        exercise, _, code = compile_unit(src, rel, unit, bodies)
        compiled[(rel, unit)] = (exercise, code)
    return marshal.dumps({"python": list(sys.version_info[:2]), "units": compiled})


def instructor_only(rel: str) -> bool:
    """Is this file the instructor's alone (never in a student build)?"""
    return rel.startswith(INSTRUCTOR_ONLY)


def build_student_copy(src: Path, dest: Path, self_study: bool = False) -> StudentBuild:
    """Write the student build of the repository at ``src`` into ``dest`` (replacing an earlier build): the
    class handout, or with ``self_study`` the edition that carries the reference for ``reveal`` and stand-ins."""
    src, dest = src.resolve(), dest.resolve()
    marker, solutions_file, compiled_file = (p.relative_to(ROOT) for p in (STUDENT_BUILD, SOLUTIONS, COMPILED))
    if (src / marker).exists():
        raise ValueError(f"{src} is already a student build: make one from the reference repository")
    if dest.exists():
        if not (dest / marker).exists():
            raise ValueError(f"{dest} exists and is not a student build: remove it or choose another folder")
        shutil.rmtree(dest)
    regions = find_regions(src)
    validate(regions)
    files = [rel for rel in repository_files(src) if not instructor_only(rel)]
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    if (src / "docs/instructor.md").exists():
        (dest / "docs").mkdir(exist_ok=True)
        (dest / "docs/instructor.md").write_text(GUIDE_PLACEHOLDER)

    for rel in sorted({r.rel for r in regions}):
        path = dest / rel
        stubs = {(r.exercise, r.unit, r.index): stub_body(r, stub_message(get(r.exercise), r.unit))
                 for r in regions if r.rel == rel}
        text = replace_bodies(path.read_text(), path, rel, stubs)
        ast.parse(text, filename=rel)  # the stubbed file must still be valid Python
        path.write_text(text)
    edition = "self-study" if self_study else "class"
    (dest / marker).write_text(json.dumps({"edition": edition}) + "\n")
    if self_study:
        solutions = {"regions": [dict(exercise=r.exercise, file=r.rel, unit=r.unit, index=r.index, body=r.body)
                                 for r in regions]}
        (dest / solutions_file).write_text(json.dumps(solutions, indent=1) + "\n")
    else:
        (dest / compiled_file).write_bytes(compiled_stand_ins(src, regions))

    giveaways = {line.strip() for r in regions for line in r.body.splitlines() if len(line.strip()) >= 24}
    notebooks = sorted(rel for rel in files if rel.startswith("notebooks/") and rel.endswith(".ipynb"))
    removed = cleared = 0
    for rel in notebooks:
        r, c = strip_notebook(dest / rel, giveaways)
        removed, cleared = removed + r, cleared + c
    return StudentBuild(dest, len(files), len(regions), len(notebooks), removed, cleared, edition)


def strip_notebook(path: Path, giveaways: set[str]) -> tuple[int, int]:
    """Remove ``solution`` cells; clear outputs of ``exercise`` cells and outputs quoting reference code.
    Returns (cells removed, outputs cleared)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    tags = lambda cell: cell.get("metadata", {}).get("tags", [])  # noqa: E731
    kept = [c for c in nb.cells if "solution" not in tags(c)]
    removed = len(nb.cells) - len(kept)
    cleared = 0
    for cell in kept:
        if cell.cell_type != "code" or not cell.outputs:
            continue
        text = output_text(cell.outputs)
        if "exercise" in tags(cell) or any(g in text for g in giveaways):
            if "NBVAL_CHECK_OUTPUT" in cell.source:
                raise ValueError(f"{path.name}: a cell whose output is compared (NBVAL_CHECK_OUTPUT) shows "
                                 "exercise code; the student build cannot keep it")
            cell.outputs, cell.execution_count = [], None
            cleared += 1
    if removed or cleared:
        nb.cells = kept
        nbformat.write(nb, path)
    return removed, cleared


def output_text(outputs: list) -> str:
    """Everything a cell's outputs would show, as one string (streams, text, markdown, html)."""
    parts = []
    for out in outputs:
        parts.append("".join(out.get("text", "")))
        for value in out.get("data", {}).values():
            parts.append("".join(value) if isinstance(value, (list, str)) else json.dumps(value))
    return "\n".join(parts)
