"""``reveal("E3.1")``: write the reference solution into the student's files (a self-study build only).

Self-study courses allow peeking: a student who is stuck, or wants to compare, reveals an exercise. What
they had written is not lost -- it is saved to ``attempts/E3.1-<time>.py`` at the root of their copy
first. Only the regions' bodies change; everything else in the file stays as the student left it. A class
handout carries no reference, so there ``reveal`` only says so.
"""

from __future__ import annotations

import time

from minfer.exercises.catalog import get
from minfer.exercises.regions import find_regions, replace_bodies
from minfer.exercises.standin import ROOT, is_student_build, key, reference_bodies


def reveal(exercise: str) -> list[str]:
    """Write the reference solution of a build exercise into your files; returns the files changed."""
    ex = get(exercise)
    if ex.kind != "build":
        raise ValueError(f"{ex.id} is a {ex.kind} exercise: its model answer is in docs/instructor.md")
    if not is_student_build():
        print(f"This is the reference repository: {ex.id}'s solution is the code between its markers already.")
        return []
    refs = reference_bodies()
    if not refs:
        print(f"This copy is a class handout: it carries no reference source to reveal. Stuck on {ex.id}? Its "
              "check's failing case and hint say what went wrong; your instructor can say more.")
        return []
    regions = [r for r in find_regions(ROOT) if r.exercise == ex.id]
    yours = [r for r in regions if not r.is_stub and r.body != refs[key(r)]]
    if yours:
        saved = ROOT / "attempts" / f"{ex.id}-{time.strftime('%Y%m%d-%H%M%S')}.py"
        saved.parent.mkdir(exist_ok=True)
        saved.write_text("".join(f"# {r.rel}: {r.unit}\n{r.body}\n" for r in yours))
        print(f"your own code for {ex.id} is saved in {saved.relative_to(ROOT)}")
    changed = []
    for rel in sorted({r.rel for r in regions}):
        path = ROOT / rel
        bodies = {(r.exercise, r.unit, r.index): refs[key(r)] for r in regions if r.rel == rel}
        path.write_text(replace_bodies(path.read_text(), path, rel, bodies))
        changed.append(rel)
    units = ", ".join(sorted({r.unit for r in regions}))
    print(f"wrote the reference solution of {ex.id} into {', '.join(changed)} ({units}); restart the kernel "
          "to run it in a notebook")
    return changed
