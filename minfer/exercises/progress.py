"""Where the student stands: ``status()``, read from the files and from the progress file.

The files say how far each build exercise is written: a region that is still the stub, the reference written
back by ``reveal``, or the student's own code. They cannot say whether that code passed, or what the student
predicted. So every check the student runs -- ``check()`` in a notebook, ``python -m minfer.exercises check`` or
``make check`` in a shell -- is appended to ``progress.json`` at the root of the student build: the exercise, the
verdict, when, the failing case, and for a prediction the number given and the number measured. ``status()``
shows the latest of each beside the files' state.

Only a student build keeps the file. In the repository the checks are the reference's own (CI runs them), and
a progress file there would be copied into every student build. Grading runs with ``--json`` and records
nothing: the file is the student's notebook of attempts, not evidence (the instructor's grade runs the checks).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from minfer.exercises.catalog import EXERCISES
from minfer.exercises.harness import CheckResult
from minfer.exercises.regions import find_regions
from minfer.exercises.standin import ROOT, is_student_build, key, reference_bodies

PROGRESS_FILE = "progress.json"  # at the root of a student build


def progress_file() -> Path | None:
    """The progress file of this copy: ``progress.json`` in a student build, ``None`` in the repository."""
    return ROOT / PROGRESS_FILE if is_student_build() else None


def record(result: CheckResult, path: Path | None = None) -> None:
    """Append ``result`` to the progress file (``path``, by default this copy's). A check that judged nothing --
    an explain exercise, a prediction not given yet -- leaves no record."""
    path = path or progress_file()
    if path is None or result.status in ("written", "unanswered"):
        return
    stub = result.stub == result.exercise  # the exercise's own stub raised: nothing of the student's ran yet
    entry: dict[str, object] = {
        "exercise": result.exercise, "status": "not written" if stub else result.status,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "case": result.case, "hint": "" if stub else result.hint,
        "cases_passed": result.cases_passed}
    if result.kind == "predict":
        entry |= {"prediction": result.prediction, "measured": result.measured, "unit": result.unit}
    data = {"checks": history(path) + [entry]}
    path.write_text(json.dumps(data, indent=1) + "\n")


def history(path: Path | None = None) -> list[dict]:
    """Every check recorded in the progress file, oldest first (none if there is no file)."""
    path = path or progress_file()
    if path is None or not path.exists():
        return []
    return list(json.loads(path.read_text()).get("checks", []))


def build_states() -> dict[str, str]:
    """Per build exercise: "reference" (the repository), "not started" (the stub), "revealed" (the reference
    written back) or "written" (the student's own code)."""
    if not is_student_build():
        return {e.id: "reference" for e in EXERCISES if e.kind == "build"}
    refs = reference_bodies()
    states: dict[str, set[str]] = {}
    for r in find_regions(ROOT):
        s = "not started" if r.is_stub else "revealed" if r.body == refs.get(key(r)) else "written"
        states.setdefault(r.exercise, set()).add(s)
    return {ex: ("not started" if s == {"not started"} else "revealed" if s == {"revealed"} else "written")
            for ex, s in states.items()}


def last_checks(path: Path | None = None) -> dict[str, str]:
    """Per exercise checked at least once: its latest verdict, when, and how many checks so far --
    ``"passed 2026-03-02 14:05 (3 checks)"``; a prediction also says what was predicted and measured."""
    runs: dict[str, list[dict]] = {}
    for entry in history(path):
        runs.setdefault(entry["exercise"], []).append(entry)
    out = {}
    for ex, entries in runs.items():
        last = entries[-1]
        verdict = {"failed": "not yet"}.get(last["status"], last["status"])
        if last.get("prediction") is not None:
            measured = "?" if last.get("measured") is None else f"{last['measured']:g}"
            unit = f" {last['unit']}" if last.get("unit") else ""
            verdict += f" (predicted {last['prediction']:g}, measured {measured}{unit})"
        count = f"{len(entries)} check{'s' if len(entries) > 1 else ''}"
        out[ex] = f"{verdict}, {last['when'][:16]} ({count})"
    return out


def status(path: Path | None = None) -> list[tuple[str, str, str, str, str]]:
    """Print a table of all exercises -- id, kind, time, title, how far the files are written, the latest check --
    and return its rows as (id, kind, title, files, latest check)."""
    states, checks = build_states(), last_checks(path)
    rows = [(e.id, e.kind, f"{e.minutes} min", e.title, states.get(e.id, ""), checks.get(e.id, "")) for e in EXERCISES]
    header = ("id", "kind", "time", "exercise", "files", "last check")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for r in [header, *rows]:
        print(("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5]).rstrip())
    return [(r[0], r[1], r[3], r[4], r[5]) for r in rows]
