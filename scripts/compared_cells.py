"""How much of each chapter's stored output nbval compares (``make test`` runs it strict).

    python scripts/compared_cells.py            # a table: chapter, code cells with outputs, compared, share

A code cell's outputs are *compared* when it has stored outputs and carries neither ``# NBVAL_IGNORE_OUTPUT``
(wall-clock timings) nor ``# NBVAL_SKIP`` (not run at all). Cells without outputs are left out of the count:
nbval would compare nothing there. ``tests/test_notebooks_compared.py`` keeps the share at least 70% over the
course and 40% in every chapter, so a chapter cannot quietly stop being checked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MARKERS = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP")
TAGS = ("nbval-ignore-output", "nbval-skip")


@dataclass(slots=True, frozen=True)
class Share:
    chapter: str
    with_outputs: int
    compared: int

    @property
    def share(self) -> float:
        return self.compared / self.with_outputs if self.with_outputs else 0.0


def is_compared(cell: nbformat.NotebookNode) -> bool:
    """True when nbval compares this code cell's stored outputs with a fresh run's."""
    if cell.cell_type != "code" or not cell.get("outputs"):
        return False
    first_lines = cell.source.splitlines()[:3]
    marked = any(marker in line for line in first_lines for marker in MARKERS)
    tagged = any(tag in cell.get("metadata", {}).get("tags", []) for tag in TAGS)
    return not (marked or tagged)


def share_of(path: Path) -> Share:
    nb = nbformat.read(path, as_version=4)
    with_outputs = [c for c in nb.cells if c.cell_type == "code" and c.get("outputs")]
    return Share(path.stem, len(with_outputs), sum(is_compared(c) for c in with_outputs))


def course_shares(paths: list[Path] = CHAPTERS) -> tuple[list[Share], float]:
    """Each chapter's share, and the course's (compared cells over all code cells with outputs)."""
    shares = [share_of(p) for p in paths]
    total = sum(s.with_outputs for s in shares)
    return shares, (sum(s.compared for s in shares) / total if total else 0.0)


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or CHAPTERS
    shares, overall = course_shares(paths)
    print(f"{'chapter':45s} {'outputs':>8s} {'compared':>9s} {'share':>6s}")
    for s in shares:
        print(f"{s.chapter:45s} {s.with_outputs:8d} {s.compared:9d} {s.share:6.0%}")
    print(f"{'course':45s} {sum(s.with_outputs for s in shares):8d} {sum(s.compared for s in shares):9d} "
          f"{overall:6.0%}")


if __name__ == "__main__":
    main(sys.argv[1:])
