"""Re-execute the course's chapters in place, then strip what must not be committed (``make notebooks``).

    python scripts/run_notebooks.py                      # every chapter, in order
    python scripts/run_notebooks.py notebooks/05_*.ipynb  # some of them

After a change to the package, the stored outputs of the chapters that render or run it are stale, and
``make test`` (nbval, every output compared) fails on them. This refreshes them in one command: each
notebook runs top to bottom in a fresh kernel of this environment, from the ``notebooks/`` folder (as
JupyterLab runs it); every widget output gets a static view of its final state beside it (``static_views.py``),
and then the widget state and timing metadata are removed. It prints how long each chapter took, keeps it in
``notebooks/run_times.json`` and writes it in the README's course map: a chapter should run in about two minutes
on a 2-core CPU. Cells nbval skips (an exercise's check) are
not run: they stay in place without outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).parent))
from clean_notebooks import clean  # noqa: E402
from static_views import add_static_views  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMES = ROOT / "notebooks" / "run_times.json"  # chapter -> seconds of its last stored run (the course map's column)


def skipped(cell: nbformat.NotebookNode) -> bool:
    """A cell nbval never runs (``# NBVAL_SKIP``): an exercise's check, which tests/test_exercises*.py run on
    the reference. Running each here would add its own fresh process and half a minute to the chapter."""
    return cell.cell_type == "code" and cell.source.lstrip().startswith("# NBVAL_SKIP")


def run(path: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    held = {i: cell for i, cell in enumerate(nb.cells) if skipped(cell)}
    nb.cells = [cell for i, cell in enumerate(nb.cells) if i not in held]
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                   record_timing=False).execute()
    seconds = time.perf_counter() - start
    for i, cell in sorted(held.items()):  # back in place, not run: no outputs
        cell.outputs, cell.execution_count = [], None
        nb.cells.insert(i, cell)
    add_static_views(nb)  # a picture beside every widget, drawn from its recorded state, before that state goes
    nbformat.write(nb, path)
    clean(str(path))
    return seconds


def record_run_time(chapter: str, seconds: float) -> None:
    """Keep how long ``chapter`` took when it was stored, and say it in the README's course map (its last column;
    tests/test_docs.py holds the two to each other)."""
    times = json.loads(RUN_TIMES.read_text()) if RUN_TIMES.exists() else {}
    times[chapter] = round(seconds)
    RUN_TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    readme = ROOT / "README.md"
    row = re.compile(rf"^(\| \d\d \| \[{re.escape(chapter)}\]\(.*\| )[^|]*( \|)$", flags=re.M)
    readme.write_text(row.sub(lambda m: f"{m[1]}{minutes(times[chapter])}{m[2]}", readme.read_text()))


def minutes(seconds: int) -> str:
    """A run time as the course map states it: minutes, to the half minute above (a reader plans with it)."""
    return f"{max(1, math.ceil(seconds / 30)) / 2:g} min"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    p.add_argument("--timeout", type=int, default=900, help="seconds one cell may take")
    args = p.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    from minfer.model.loader import resolve_checkpoint

    resolve_checkpoint("smollm2-135m")  # the one-time conversion happens here, never in a stored chapter's output
    total = 0.0
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} ...", end=" ", flush=True)
        seconds = run(path.resolve(), args.timeout)
        record_run_time(path.stem, seconds)
        total += seconds
        print(f"{seconds:.0f} s", flush=True)
    print(f"{len(paths)} notebooks re-executed in {total / 60:.1f} min")


if __name__ == "__main__":
    main()
