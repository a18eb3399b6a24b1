"""``list`` and ``show``: the exercises as text, for a student at a shell rather than in a notebook.

``show`` says everything a student needs to start one exercise without opening the chapter first: its kind,
chapter and section, the task, where the code goes (for a build exercise: the file, line and function of each
region, and whether it is still the stub), how to check it, and -- once it has been checked and did not pass --
the failing case and its hint from the latest check. A checker's other cases and hints stay hidden until a check
meets them: they are the checker's, not the task's.
"""

from __future__ import annotations

import textwrap

from minfer.exercises.catalog import EXERCISES, Exercise
from minfer.exercises.progress import build_states, history
from minfer.exercises.regions import find_regions
from minfer.exercises.standin import ROOT


def listing() -> str:
    """Every exercise, one line each: id, kind, chapter, difficulty, time, prerequisites, title."""
    rows = [("id", "kind", "chapter", "difficulty", "time", "after", "title")]
    rows += [(e.id, e.kind, f"{e.chapter:02d}", f"{e.difficulty} of 3", f"{e.minutes} min",
              ", ".join(e.requires) or "-", e.title) for e in EXERCISES]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[6] for r in rows)


def notebook_of(ex: Exercise) -> str:
    """The chapter's notebook, relative to the repository root ("" if it cannot be found)."""
    found = sorted((ROOT / "notebooks").glob(f"{ex.chapter:02d}_*.ipynb"))
    return found[0].relative_to(ROOT).as_posix() if found else ""


def describe(ex: Exercise) -> str:
    """What ``python -m minfer.exercises show E4.1`` prints."""
    notebook = notebook_of(ex)
    after = f"; after {', '.join(ex.requires)}" if ex.requires else ""
    lines = [f"{ex.id}: {ex.title}",
             f"{ex.kind} exercise, {ex.notebook_hint}{f' ({notebook})' if notebook else ''}, difficulty "
             f"{ex.difficulty} of 3, about {ex.minutes} min{after}",
             "", textwrap.fill(ex.task, 100), ""]
    if ex.kind == "build":
        state = build_states().get(ex.id, "")
        lines.append(f"Your code goes between '# BEGIN EXERCISE {ex.id}' and '# END EXERCISE' ({state}):")
        lines += [f"  {r.rel}:{r.begin}  {r.unit}" for r in find_regions(ROOT) if r.exercise == ex.id]
        lines.append(f"Check it: make check EX={ex.id}, or check({ex.id!r}) in a notebook.")
    elif ex.kind == "predict":
        lines.append(f"Write your number down first, then check it: make check EX={ex.id} ANSWER=<number>\n"
                     f"(or python -m minfer.exercises check {ex.id} <number>; a notebook: check({ex.id!r}, number)).")
    else:
        lines.append("Write your answer in the chapter's notebook: nothing to run.")
    mine = [h for h in history() if h["exercise"] == ex.id]
    if mine:
        last = mine[-1]
        lines.append(f"Your latest check ({last['when'][:16]}): {last['status']}"
                     + (f", failing case: {last['case']}" if last.get("case") else ""))
        if last.get("hint"):
            lines.append(f"  hint: {last['hint']}")
    return "\n".join(lines)
