"""Grade a class: every build check on every student's copy, one table.

    python -m minfer.exercises grade submissions/*        # or: make grade SUBMISSIONS="submissions/*"

Each submission is a student's copy of the student build. Its checks run in a fresh process *inside that
copy* (``PYTHONPATH`` points there, and the result says which package it imported, so a copy that does not
import its own code is caught), with this environment's Python. Running a submission runs the student's
code: do it in a container or a throw-away account.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from minfer.exercises.catalog import EXERCISES
from minfer.exercises.checking import subprocess_env
from minfer.exercises.harness import CheckResult

MARKS = {"passed": "pass", "failed": "FAIL", "timeout": "TIME", "error": "ERR"}


@dataclass(slots=True)
class Graded:
    name: str
    results: dict[str, CheckResult] = field(default_factory=dict)
    problem: str = ""  # why nothing could be checked

    def mark(self, ex: str) -> str:
        r = self.results.get(ex)
        if r is None:
            return "ERR" if self.problem else "-"
        if r.stub == ex:
            return "todo"  # still the stub: not attempted
        return MARKS.get(r.status, r.status)

    @property
    def score(self) -> int:
        return sum(r.passed for r in self.results.values())


def grade_one(path: Path, timeout: float = 1800) -> Graded:
    g = Graded(path.name)
    if not (path / "minfer" / "exercises").is_dir():
        g.problem = "not a minfer copy (no minfer/exercises)"
        return g
    cmd = [sys.executable, "-m", "minfer.exercises", "check", "--all", "--json"]
    try:
        proc = subprocess.run(cmd, cwd=path, env=subprocess_env(path.resolve()), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        g.problem = f"no answer after {timeout:.0f} s"
        return g
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        g.problem = "did not run: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return g
    data = json.loads(line)
    if not Path(data["package"]).resolve().is_relative_to(path.resolve()):
        g.problem = f"imported minfer from {data['package']}, not from the submission"
        return g
    g.results = {d["exercise"]: CheckResult.from_dict(d) for d in data["results"]}
    return g


def grade(paths: list[Path], csv_path: Path | None = None) -> list[Graded]:
    """Check every submission and print one row per student: pass / FAIL / todo (still the stub) / TIME / ERR."""
    builds = [e.id for e in EXERCISES if e.kind == "build"]
    rows = []
    for p in paths:
        print(f"checking {p} ...", file=sys.stderr, flush=True)
        rows.append(grade_one(p))
    name_w = max([len("student")] + [len(g.name) for g in rows])
    print("student".ljust(name_w) + "".join(f"  {b:>5}" for b in builds) + "  score")
    for g in rows:
        print(g.name.ljust(name_w) + "".join(f"  {g.mark(b):>5}" for b in builds) + f"  {g.score}/{len(builds)}"
              + (f"  ({g.problem})" if g.problem else ""))
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", *builds, "score", "problem"])
            for g in rows:
                w.writerow([g.name, *(g.mark(b) for b in builds), g.score, g.problem])
    return rows
