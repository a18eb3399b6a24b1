"""Strip what must not be committed from notebooks: widget state, execution timing metadata.

Usage: python scripts/clean_notebooks.py notebooks/*.ipynb
Outputs stay (they show the course on a web page); the saved widget state goes (one plotly
FigureWidget stores ~5 MB of JavaScript there), as do per-cell execution timestamps.
"""

from __future__ import annotations

import sys

import nbformat


def clean(path: str) -> bool:
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            data.pop("application/vnd.jupyter.widget-state+json", None)
    after = nbformat.writes(nb)
    if after != before:
        nbformat.write(nb, path)
        return True
    return False


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(("cleaned  " if clean(p) else "clean    ") + p)
