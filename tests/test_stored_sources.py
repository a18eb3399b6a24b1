"""Every ``show_source`` output stored in a chapter is the package's current source, at the line it names.

A chapter shows the package's real code, but the stored output is a snapshot: edit the package and the stored
cell goes stale until the chapter is re-executed. Strict nbval finds that too, minutes into CI; this test finds
it in a second, before a commit, and names the chapter to re-execute.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SHOWN = re.compile(r"\A`(?P<path>minfer/[^`]+)` line (?P<line>\d+)\n\n```\w*\n(?P<code>.*)\n```\Z", re.DOTALL)


def stored_sources(notebook: Path) -> list[tuple[int, str, int, list[str]]]:
    """(cell index, file, first line, code lines) of each stored ``show_source`` output."""
    found = []
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        for output in cell.get("outputs", []):
            markdown = output.get("data", {}).get("text/markdown")
            text = "".join(markdown) if isinstance(markdown, list) else markdown
            if text and (match := SHOWN.match(text)):
                found.append((index, match["path"], int(match["line"]), match["code"].split("\n")))
    return found


def drift(path: str, first: int, code: list[str]) -> str | None:
    """Why the stored ``code`` is not ``path``'s lines from ``first`` on (``None`` when it is).

    ``show_source`` dedents a method's source, so each stored line is the file's line less one common indent."""
    lines = (ROOT / path).read_text().split("\n")[first - 1 : first - 1 + len(code)]
    if len(lines) < len(code):
        return f"{path} has fewer than {first + len(code) - 1} lines"
    indents = set()
    for offset, (shown, actual) in enumerate(zip(code, lines)):
        if not shown.strip() and not actual.strip():
            continue
        indent = actual[: len(actual) - len(shown)]
        if not actual.endswith(shown) or indent.strip():
            return f"{path} line {first + offset} is now {actual.strip()!r}, the chapter shows {shown.strip()!r}"
        indents.add(indent)
    return None if len(indents) <= 1 else f"{path} from line {first}: the stored lines are not one common dedent"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_show_source_matches_the_package(notebook: Path) -> None:
    stale = [
        f"cell {index}: {why}"
        for index, path, first, code in stored_sources(notebook)
        if (why := drift(path, first, code))
    ]
    assert not stale, f"re-execute {notebook.name} (scripts/run_notebooks.py):\n" + "\n".join(stale)


def test_the_check_sees_a_stale_source() -> None:
    """The check accepts a current, dedented source and rejects a shifted line number or an edited line."""
    assert sum(len(stored_sources(nb)) for nb in NOTEBOOKS) > 20, "the chapters show source through show_source"
    lines = (ROOT / "minfer/notebook.py").read_text().split("\n")
    first = next(i for i, line in enumerate(lines, 1) if line.startswith("def source_of"))
    body = [line[4:] if line.startswith("    ") else line for line in lines[first : first + 6]]  # a dedented slice
    assert drift("minfer/notebook.py", first + 1, body) is None
    assert drift("minfer/notebook.py", first + 2, body) is not None
    assert drift("minfer/notebook.py", first + 1, [*body[:-1], body[-1] + "  # edited"]) is not None
