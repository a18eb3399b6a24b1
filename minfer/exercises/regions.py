"""Exercise regions: the lines of real package code a student writes.

A *build* exercise is a stretch of the engine between two comments::

    def allocate(self, owner: str, n: int) -> list[int]:
        \"\"\"Append ``n`` fresh blocks to ``owner``'s table.\"\"\"
        # BEGIN EXERCISE E3.1
        ...the reference code...
        # END EXERCISE

In the repository the region holds the reference solution, so the engine, the tests and the chapters run
on it. ``make student`` replaces each region's lines by one ``raise NotImplementedError("E3.1: ...")``
(``stub``); the markers stay, so the student sees where to write and the tools can find the region again.

Every region lives inside one function -- a method or a module-level function, its *unit* -- and a unit
holds regions of one exercise only. That is what lets a stand-in (``standin.py``) swap a whole unit for
its reference version without touching the student's other code. This module only reads and rewrites
text; it imports nothing of the engine.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN EXERCISE (?P<id>E\d+\.\d+)[ \t]*$")
END = re.compile(r"^[ \t]*# END EXERCISE[ \t]*$")
STUB = re.compile(r"^\s*raise NotImplementedError\(\"(?P<id>E\d+\.\d+): [^\n]*\"\)\s*$")
STUB_MESSAGE = re.compile(r"^(?P<id>E\d+\.\d+): .*see chapter \d\d")  # what a stub raises, and nothing else does


class RegionError(ValueError):
    """A marker out of place: unmatched, nested, outside a function, or two exercises in one function."""


@dataclass(slots=True, frozen=True)
class Region:
    exercise: str  # "E3.1"
    path: Path  # the file
    rel: str  # the file relative to the repository root, with "/" separators
    unit: str  # qualified name of the function holding it: "BlockPool.allocate"
    index: int  # the how-manieth region of this exercise in this unit (0 for nearly all)
    begin: int  # 1-based line of the BEGIN marker
    end: int  # 1-based line of the END marker
    indent: str  # the markers' indentation: the body's first level
    body: str  # the lines between the markers, each ending in a newline

    @property
    def is_stub(self) -> bool:
        """Still the untouched stub of ``make student``?"""
        m = STUB.match(self.body)
        return m is not None and m["id"] == self.exercise


def stub_body(region: Region, message: str) -> str:
    """The one line that replaces a region's body in the student build."""
    return f"{region.indent}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})\n"


def units(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and methods (of classes at any depth), with their qualified names."""
    found: list = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + node.name, node))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


def unit_span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """First line (its first decorator) and last line of a function, 1-based."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return first, node.end_lineno or node.lineno


def regions_in_text(text: str, path: Path, rel: str) -> list[Region]:
    """Every region of one file. Raises ``RegionError`` for a marker out of place."""
    if "# BEGIN EXERCISE" not in text:
        return []
    return list(_parsed_regions(text, path, rel))


@functools.lru_cache(maxsize=256)
def _parsed_regions(text: str, path: Path, rel: str) -> tuple[Region, ...]:
    """The regions of one file's text, parsed once per content. One check reads the package's regions four times
    (the stand-ins it installs and removes, the reference, the progress file), and tokenizing every file that holds
    one was 40% of a quick check. The key is the text itself, so an edited file is parsed anew; a marker out of place
    raises every time, since a raise is never cached."""
    lines = text.splitlines(keepends=True)
    spans: list[tuple[str, str, int, int]] = []  # (id, indent, begin, end), 1-based
    open_: tuple[str, str, int] | None = None
    for n in comment_lines(text):  # real comments only: a docstring may show a marker as an example
        line = lines[n - 1]
        if m := BEGIN.match(line):
            if open_:
                raise RegionError(f"{rel}:{n}: BEGIN EXERCISE {m['id']} inside {open_[0]} (line {open_[2]})")
            open_ = (m["id"], m["indent"], n)
        elif END.match(line):
            if not open_:
                raise RegionError(f"{rel}:{n}: END EXERCISE without a BEGIN")
            spans.append((*open_, n))
            open_ = None
        elif "EXERCISE" in line and line.lstrip().startswith(("# BEGIN", "# END")):
            raise RegionError(f"{rel}:{n}: malformed marker {line.strip()!r}")
    if open_:
        raise RegionError(f"{rel}:{open_[2]}: BEGIN EXERCISE {open_[0]} is never closed")
    tree = ast.parse(text, filename=rel)
    owners: dict[str, str] = {}
    found: list[Region] = []
    count: dict[tuple[str, str], int] = {}
    for ex, indent, begin, end in spans:
        holders = [(name, node) for name, node in units(tree) if unit_span(node)[0] < begin <= unit_span(node)[1]]
        if not holders:
            raise RegionError(f"{rel}:{begin}: exercise {ex} is not inside a function or method")
        name = holders[-1][0]  # the innermost method or module-level function (nested defs are part of it)
        if any(begin < unit_span(node)[0] <= end for _, node in units(tree)):
            raise RegionError(f"{rel}:{begin}: exercise {ex}'s region runs into the next function")
        if owners.setdefault(name, ex) != ex:
            raise RegionError(f"{rel}:{begin}: {name} already holds a region of {owners[name]}; one exercise per unit")
        index = count.get((ex, name), 0)
        count[(ex, name)] = index + 1
        found.append(Region(ex, path, rel, name, index, begin, end, indent, "".join(lines[begin : end - 1])))
    return tuple(found)


def comment_lines(text: str) -> list[int]:
    """1-based numbers of the lines that hold nothing but a comment."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and not t.line[: t.start[1]].strip()]


def package_files(root: Path) -> list[Path]:
    """The Python files of the ``minfer`` package under the repository root ``root``."""
    return sorted(p for p in (root / "minfer").rglob("*.py") if "__pycache__" not in p.parts)


def find_regions(root: Path) -> list[Region]:
    """Every region in the package, in file and line order."""
    out: list[Region] = []
    for path in package_files(root):
        out += regions_in_text(path.read_text(), path, path.relative_to(root).as_posix())
    return out


def replace_bodies(text: str, path: Path, rel: str, bodies: dict[tuple[str, str, int], str]) -> str:
    """``text`` with the body of each region keyed ``(exercise, unit, index)`` in ``bodies`` replaced."""
    lines = text.splitlines(keepends=True)
    for r in sorted(regions_in_text(text, path, rel), key=lambda r: -r.begin):  # bottom up: lines stay valid
        new = bodies.get((r.exercise, r.unit, r.index))
        if new is not None:
            lines[r.begin : r.end - 1] = [new]
    return "".join(lines)
