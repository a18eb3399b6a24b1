"""``status()``: every exercise, and where the student stands on the build ones (read from the files)."""

from __future__ import annotations

from minfer.exercises.catalog import EXERCISES
from minfer.exercises.regions import find_regions
from minfer.exercises.standin import ROOT, is_student_build, key, reference_bodies


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


def status() -> list[tuple[str, str, str, str]]:
    """Print a table of all exercises (id, kind, time, title, state) and return its rows."""
    states = build_states()
    rows = [(e.id, e.kind, f"{e.minutes} min", e.title, states.get(e.id, "")) for e in EXERCISES]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    return [(r[0], r[1], r[3], r[4]) for r in rows]
