"""Root pytest configuration, shared by the unit tests and the notebooks run under nbval."""

from __future__ import annotations

import os
import sys


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


# In a student build (make student), tests that reach an exercise not written yet are skipped with its name.
pytest_plugins = ["minfer.exercises.pytest_plugin"]
