"""Root pytest configuration, shared by the unit tests and the notebooks run under nbval."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test`` runs two processes), each process gets its share of the cores for torch's
    threads -- and so do the notebook kernels and commands it starts, which inherit ``OMP_NUM_THREADS``. Two
    processes of two threads each on two cores would fight over them; one thread each keeps both busy. A count
    set by the user is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # imported already (a plugin): it read the variable before it was set
        sys.modules["torch"].set_num_threads(threads)


_share_the_cores()


def pytest_collectstart(collector):
    # nbval: notebooks print progress bars and warnings to stderr; never compare those
    if getattr(collector, "skip_compare", None) is not None:
        collector.skip_compare += ("stderr",)


def _chapter_seconds() -> dict[str, float]:
    """Each chapter's last run time, which ``scripts/run_notebooks.py`` records when it stores the outputs."""
    path = Path(__file__).parent / "notebooks" / "run_times.json"
    return json.loads(path.read_text()) if path.exists() else {}


def pytest_collection_modifyitems(config, items):
    """Chapters longest first. ``make test`` hands the chapters whole to two processes as each frees up; in xdist's
    own order (by number of cells) the last ones handed out can be long ones, and one process then runs alone at the
    end while the other waits. Longest first, the end is made of short chapters and both stay busy (the classic rule
    for sharing jobs among machines). A chapter's cells keep their order; the unit tests keep theirs."""
    seconds = _chapter_seconds()
    if not seconds or not any(item.path.suffix == ".ipynb" for item in items):
        return
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    items.sort(key=lambda item: (-seconds.get(item.path.stem, 0.0), first[item.path]))


# In a student build (make student), tests that reach an exercise not written yet are skipped with its name.
pytest_plugins = ["minfer.exercises.pytest_plugin"]
