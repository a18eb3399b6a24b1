"""Grade a class from the instructor's copy: the students' code, the instructor's checks.

    python -m minfer.exercises.grade submissions/*          # or: make grade STUDENT=... / SUBMISSIONS="..."

Run it in the instructor's full checkout (the reference repository), never in a student build. For each
submission -- a student's copy of the handout -- and each build exercise, only the *bodies of the exercise
regions* are read from the student's files, as text. Each exercise is then checked in a fresh process of
*this* checkout (``graded_run.py``): the student's bodies are swapped into the instructor's package, and the
instructor's public and hidden cases run against them. Nothing else of the student's tree is imported or run:
not its ``checks/``, its catalog, its stand-ins, a ``sitecustomize.py``, nor code added to a module outside
the markers -- so editing or deleting any of that cannot change the grade. (Code a student writes *between*
the markers does run, in the grading process, like any code under test: the grader flags a body that reaches
for the harness and refuses a check whose harness changed while it ran; run grades in a container or a
throw-away account all the same.)

Per exercise the report says: ``pass``; ``FAIL`` with the failing case; ``todo`` (not attempted: still the
stub); ``revealed`` (the reference solution itself, comments aside: copied or revealed, not passed);
``missing`` (the markers were removed or broken); ``TIME``; ``ERR``; ``tampered``. It writes one JSON file per
student and a table for the class (``--out``, by default ``build/grades/``).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minfer.exercises.catalog import EXERCISES, get
from minfer.exercises.checking import CHECK_TIMEOUT
from minfer.exercises.harness import CheckResult
from minfer.exercises.regions import Region, RegionError, find_regions, regions_in_text
from minfer.exercises.standin import ROOT, Key, is_student_build, key

MARKS = {"passed": "pass", "failed": "FAIL", "timeout": "TIME", "error": "ERR", "not attempted": "todo",
         "revealed": "revealed", "missing": "missing", "tampered": "tampered"}
# names a region body has no business using: reaching for them is how code would fool the harness
SUSPICIOUS = re.compile(r"\b(minfer\.exercises|exercises\b|sys\.modules|builtins|__builtins__|__import__|importlib|"
                        r"sitecustomize|_getframe|f_back|f_globals|gc\.|os\._exit|sys\.exit|atexit|settrace|setprofile|"
                        r"globals\(\)|__code__|__globals__)")


@dataclass(slots=True)
class ExerciseGrade:
    exercise: str
    status: str  # passed | failed | not attempted | revealed | missing | timeout | error | tampered
    case: str | None = None  # the failing case
    message: str = ""
    hint: str = ""
    flags: list[str] = field(default_factory=list)  # for the instructor's eyes: a body reaching for the harness
    notes: list[str] = field(default_factory=list)  # what the check measured (a capstone's scores)
    seconds: float = 0.0

    @property
    def mark(self) -> str:
        return MARKS.get(self.status, self.status)


@dataclass(slots=True)
class StudentGrade:
    name: str
    path: str
    exercises: dict[str, ExerciseGrade] = field(default_factory=dict)
    problem: str = ""  # why nothing could be graded

    @property
    def score(self) -> int:
        return sum(g.status == "passed" for g in self.exercises.values())

    def mark(self, ex: str) -> str:
        g = self.exercises.get(ex)
        return g.mark if g else ("ERR" if self.problem else "-")

    def to_dict(self) -> dict:
        return {"student": self.name, "path": self.path, "score": self.score, "of": len(self.exercises),
                "problem": self.problem, "graded_with": instructor_version(),
                "exercises": {ex: asdict(g) | {"mark": g.mark} for ex, g in self.exercises.items()}}


def build_ids() -> list[str]:
    return [e.id for e in EXERCISES if e.kind == "build"]


def instructor_version() -> str:
    """The commit of the instructor's checkout that graded (with ``+changes`` if its files differ from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def same_code(a: str, b: str) -> bool:
    """Do two region bodies hold the same code, comments and layout aside?"""
    try:
        return ast.dump(ast.parse(textwrap.dedent(a))) == ast.dump(ast.parse(textwrap.dedent(b)))
    except SyntaxError:
        return False


def student_regions(student: Path, reference: list[Region]) -> dict[Key, Region | None]:
    """The student's region for every region of the reference, read as text file by file (``None`` where the
    file, its markers or the region are gone or broken: one broken file does not hide the others)."""
    found: dict[Key, Region | None] = {key(r): None for r in reference}
    for rel in sorted({r.rel for r in reference}):
        path = student / rel
        try:
            regions = regions_in_text(path.read_text(), path, rel)
        except (OSError, UnicodeDecodeError, SyntaxError, RegionError):
            continue
        for r in regions:
            if key(r) in found:
                found[key(r)] = r
    return found


def assess(ex_id: str, reference: list[Region], mine: dict[Key, Region | None]) -> ExerciseGrade | None:
    """What can be said of an exercise without running it (``None``: it must run)."""
    refs = [r for r in reference if r.exercise == ex_id]
    theirs = [m for r in refs if (m := mine[key(r)]) is not None]
    if len(theirs) < len(refs):
        return ExerciseGrade(ex_id, "missing", message="its region markers were removed or broken: nothing to grade")
    if all(r.is_stub for r in theirs):
        return ExerciseGrade(ex_id, "not attempted")
    if all(same_code(r.body, ref.body) for r, ref in zip(theirs, refs)):
        return ExerciseGrade(ex_id, "revealed", message="the reference solution itself (revealed or copied)")
    return None


def flags_of(bodies: dict[Key, str]) -> list[str]:
    return sorted({f"uses {m.group(0)!r}" for body in bodies.values() for m in SUSPICIOUS.finditer(body)})


def run_one(ex_id: str, bodies: dict[Key, str], timeout: float) -> ExerciseGrade:
    """Check one exercise with the student's bodies in a fresh process of this checkout."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minfer-grade-") as tmp:
        src, out = Path(tmp) / "bodies.json", Path(tmp) / "result.json"
        src.write_text(json.dumps([[list(k), b] for k, b in bodies.items()]))
        cmd = [sys.executable, "-m", "minfer.exercises.graded_run", ex_id, str(src), str(out), str(timeout)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                                  timeout=timeout + 120)
        except subprocess.TimeoutExpired:
            return ExerciseGrade(ex_id, "timeout", message=f"no answer after {timeout + 120:.0f} s",
                                 seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if not out.exists():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return ExerciseGrade(ex_id, "error", message=f"the check wrote no result: {tail}", seconds=seconds)
        r = CheckResult.from_dict(json.loads(out.read_text()))
    return ExerciseGrade(ex_id, r.status, r.case, r.message, r.hint, notes=r.notes, seconds=seconds)


def clean_env() -> dict[str, str]:
    """This process's environment, with this checkout first on the path and nothing of a student's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def grade_student(path: Path, only: list[str] | None = None, timeout: float = CHECK_TIMEOUT) -> StudentGrade:
    """Grade one student's copy: every build exercise (or ``only`` these)."""
    g = StudentGrade(path.name, str(path))
    if not (path / "minfer").is_dir():
        g.problem = "not a copy of the course (no minfer/ folder)"
        return g
    reference = find_regions(ROOT)
    mine = student_regions(path, reference)
    for ex_id in only or build_ids():
        verdict = assess(ex_id, reference, mine)
        if verdict is None:
            bodies = {key(r): m.body for r in reference if r.exercise == ex_id and (m := mine[key(r)]) is not None}
            verdict = run_one(ex_id, bodies, timeout)
            verdict.flags = flags_of(bodies)
        print(f"  {g.name} {ex_id}: {verdict.mark}" + (f" ({verdict.case})" if verdict.case else "")
              + (f" {verdict.seconds:.1f} s" if verdict.seconds else ""), file=sys.stderr, flush=True)
        g.exercises[ex_id] = verdict
    return g


def table(rows: list[StudentGrade], ids: list[str]) -> str:
    """One line per student, one column per exercise, and the score."""
    name_w = max([len("student")] + [len(g.name) for g in rows])
    width = max([5, *(len(ex) for ex in ids), *(len(g.mark(ex)) for g in rows for ex in ids)])
    lines = ["student".ljust(name_w) + "".join(f"  {ex:>{width}}" for ex in ids) + "  score"]
    for g in rows:
        lines.append(g.name.ljust(name_w) + "".join(f"  {g.mark(ex):>{width}}" for ex in ids)
                     + f"  {g.score}/{len(ids)}" + (f"  ({g.problem})" if g.problem else ""))
    notes = [f"{g.name} {ex}: {', '.join(e.flags)} -- read this body yourself"
             for g in rows for ex, e in g.exercises.items() if e.flags]
    return "\n".join(lines + ([""] + notes if notes else []))


def grade(paths: list[Path], out: Path | None = None, csv_path: Path | None = None, only: list[str] | None = None,
          timeout: float = CHECK_TIMEOUT) -> list[StudentGrade]:
    """Grade every submission; print the class table; write ``<student>.json`` and ``grades.csv`` into ``out``."""
    if is_student_build():
        raise SystemExit("grade runs in the instructor's full checkout, not in a student build: the hidden cases "
                         "and the reference are there")
    ids = [get(e).id for e in only] if only else build_ids()
    rows = []
    for p in paths:
        print(f"grading {p} ...", file=sys.stderr, flush=True)
        rows.append(grade_student(p, ids, timeout))
    print(table(rows, ids))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for g in rows:
            (out / f"{g.name}.json").write_text(json.dumps(g.to_dict(), indent=1) + "\n")
        csv_path = csv_path or out / "grades.csv"
    if csv_path is not None:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", *ids, "score", "problem"])
            for g in rows:
                w.writerow([g.name, *(g.mark(ex) for ex in ids), g.score, g.problem])
    if out is not None:
        print(f"reports: {out}/<student>.json and {csv_path}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minfer.exercises.grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("submissions", nargs="+", type=Path, help="students' copies of the handout (folders)")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "grades", help="where the reports go")
    p.add_argument("--csv", type=Path, help="the class table as CSV (default: OUT/grades.csv)")
    p.add_argument("--only", nargs="+", metavar="EX", help="grade these exercises only")
    p.add_argument("--timeout", type=float, default=CHECK_TIMEOUT, help="seconds per check")
    args = p.parse_args(argv)
    folders = [s for s in args.submissions if s.is_dir()]
    if not folders:
        p.error("no submission folder given")
    grade(folders, args.out, args.csv, args.only, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
