"""The front door tells the truth: what the README and docs/ show is what the code does.

A reader trusts a README's examples more than its prose, so each kind of claim gets a check a change cannot slip
past:

* a ``python`` block followed by an ``output`` block is an example: it is run (the blocks of one page in order, in
  one namespace) and must print exactly the output shown;
* every link resolves: relative files exist, ``#anchors`` name a heading of the page they point to; external
  URLs are checked for form only (tests never touch the network);
* every ``make`` target the pages name has a rule (``make -n``), partial runs survive pytest's "no tests
  collected", and ``make lab`` starts as root and without a display;
* the README stays a front door: at most 200 lines, its course map counted from the exercise catalog, its results
  copied from the full table in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest

from minfer.exercises.catalog import EXERCISES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from run_notebooks import minutes  # noqa: E402  (how scripts/run_notebooks.py writes the course map's run times)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STAMP = ".venv/.installed"  # `make -o STAMP ...` never (re)installs the environment, whether or not it exists


@dataclass(slots=True, frozen=True)
class Block:
    lang: str  # the fence's info string: "python", "bash", "output", ""
    text: str
    line: int  # 1-based line of the opening fence
    follows: Block | None  # the block just before this one, when only blank lines separate them


def fenced_blocks(markdown: str) -> list[Block]:
    """The page's fenced code blocks, in order."""
    blocks: list[Block] = []
    lines = markdown.split("\n")
    i, last_end = 0, -1  # last_end: the line of the previous block's closing fence
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        between = lines[last_end + 1:start]
        follows = blocks[-1] if blocks and not any(s.strip() for s in between) else None
        blocks.append(Block(m.group(1), "\n".join(lines[start + 1:i]), start + 1, follows))
        last_end = i
        i += 1
    return blocks


def examples(page: Path) -> list[tuple[Block, str]]:
    """(python block, the output it must print) for every python block followed by an ``output`` block."""
    return [(b.follows, b.text) for b in fenced_blocks(page.read_text())
            if b.lang == "output" and b.follows is not None and b.follows.lang == "python"]


def without_fences(markdown: str) -> str:
    """The page without its fenced blocks: where headings live (a ``#`` in a bash block is a comment)."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def prose(markdown: str) -> str:
    """The page without its code, fenced or inline: where links live."""
    return re.sub(r"`[^`\n]*`", "", without_fences(markdown))


def code(markdown: str) -> str:
    """The page's code, fenced or inline: where commands live."""
    inline = re.findall(r"`([^`\n]*)`", without_fences(markdown))
    return "\n".join([*(b.text for b in fenced_blocks(markdown)), *inline])


# ---- examples ---------------------------------------------------------------------------------------------

PAGES_WITH_EXAMPLES = [p for p in PAGES if examples(p)]


def test_the_readme_has_examples_to_run():
    assert examples(README), "the README shows no example with its output (a python block, then an output block)"


@pytest.mark.slow  # the README's examples run the real model
@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_examples_print_what_they_show(page):
    """Run every example of the page, in order, in one namespace (a later block may use an earlier one's names,
    as a reader does): each must print exactly its output block."""
    namespace: dict = {"__name__": "__docs__"}
    for block, shown in examples(page):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block.text, f"{page.name}:{block.line}", "exec"), namespace)
        got = [line.rstrip() for line in printed.getvalue().rstrip("\n").split("\n")]
        assert got == [line.rstrip() for line in shown.split("\n")], (
            f"{page.name} line {block.line}: the example prints\n" + "\n".join(got))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_are_python(page):
    """A block that is not run must still parse (top-level await is allowed: notebooks run it)."""
    import ast

    for b in fenced_blocks(page.read_text()):
        if b.lang == "python":
            compile(b.text, f"{page.name}:{b.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_fenced_blocks_are_found():
    """The parser the two tests above rely on: an output block is paired with the python block right above it."""
    page = "text\n\n```python\nprint(1)\n```\n\n```output\n1\n```\n\n```python\nx = 2\n```\ntext\n```output\n2\n```\n"
    blocks = fenced_blocks(page)
    assert [b.lang for b in blocks] == ["python", "output", "python", "output"]
    assert blocks[1].follows is blocks[0] and blocks[3].follows is None


# ---- links ------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for line in without_fences(markdown).split("\n"):
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            s = slug(m.group(1))
            out.add(s if not seen[s] else f"{s}-{seen[s]}")
            seen[s] += 1
    return out


def links(markdown: str) -> list[str]:
    return re.findall(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)", prose(markdown))


def broken_link(source: Path, target: str) -> str | None:
    """Why ``target``, linked from ``source``, does not resolve (None when it does)."""
    url = urlparse(target)
    if url.scheme:
        ok = url.scheme in ("http", "https") and "." in url.netloc and " " not in target
        return None if ok else "not a well-formed http(s) URL"
    path, _, anchor = target.partition("#")
    file = (source.parent / path).resolve() if path else source
    if not file.exists():
        return f"{path}: no such file"
    if not file.is_relative_to(ROOT):
        return f"{path}: outside the repository"
    if anchor:
        if file.suffix != ".md":
            return f"#{anchor}: anchors are checked only into markdown pages"
        if anchor not in anchors(file.read_text()):
            return f"#{anchor}: no such heading in {file.relative_to(ROOT)}"
    return None


def notebook_markdown(path: Path) -> str:
    return "\n\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


@pytest.mark.parametrize("page", PAGES + NOTEBOOKS, ids=lambda p: p.name)
def test_every_link_resolves(page):
    text = notebook_markdown(page) if page.suffix == ".ipynb" else page.read_text()
    broken = [f"{t}: {why}" for t in links(text) if (why := broken_link(page, t))]
    assert not broken, f"{page.relative_to(ROOT)}: broken links\n" + "\n".join(broken)


def test_link_checking_catches_what_it_should():
    text = "# A `code` heading\n## A heading\n## A heading\n"
    assert anchors(text) == {"a-code-heading", "a-heading", "a-heading-1"}
    assert links("[a](x.md#y) `[b](not-a-link)` ![img](i.png)\n```\n[c](in-a-block)\n```") == ["x.md#y", "i.png"]
    assert broken_link(README, "docs/no-such-page.md") is not None
    assert broken_link(README, "#no-such-heading") is not None
    assert broken_link(README, "https://example.org/x") is None and broken_link(README, "http:/x") is not None


def test_the_docs_are_reachable_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text())}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs/ pages the README does not link: {missing}"


# ---- make -------------------------------------------------------------------------------------------------

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``make ARGS`` in the repository with this Python (BIN) and without reinstalling (``-o STAMP``), apart from
    any make that runs these tests (its command-line variables would reach this one through MAKEFLAGS)."""
    base = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_ARGS",
                                                             "TESTS", "NOTEBOOKS", "LAB_ARGS")}
    command = ["make", "--no-print-directory", "-o", STAMP, f"BIN={Path(sys.executable).parent}", *args]
    return subprocess.run(command, cwd=ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=600)


def named_targets() -> set[str]:
    text = "\n".join(code(p.read_text()) for p in PAGES)
    return set(re.findall(r"(?:^|[\s;&|(])make ([a-z][\w-]*)", text, flags=re.M))


def phony_targets() -> set[str]:
    line = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert line, "the Makefile has no .PHONY line"
    return set(line.group(1).split())


def test_the_pages_name_make_targets():
    assert {"lab", "test", "student", "grade"} <= named_targets()


@needs_make
@pytest.mark.parametrize("target", sorted(named_targets() | phony_targets()))
def test_every_make_target_named_has_a_rule(target):
    """A dry run (nothing is executed) of every target the pages name, and of every .PHONY one."""
    dry = make("-n", target)
    assert dry.returncode == 0, f"make -n {target}: {dry.stderr}"
    assert dry.stdout.strip() or target == "setup", f"make -n {target} would do nothing: no rule?"


@pytest.mark.long  # make test itself, on one file and one chapter
@needs_make
def test_a_partial_run_that_selects_nothing_in_a_stage_goes_on():
    """`make test PYTEST_ARGS="-k engine"` selects no notebook cell: pytest exits 5 there, which a partial run
    reports and passes over. Here both stages select nothing (one small file, one chapter, collected only)."""
    run = make("test", "TESTS=tests/test_docs.py", f"NOTEBOOKS={NOTEBOOKS[0].relative_to(ROOT)}",
               "PYTEST_ARGS=-q -k no_test_has_this_name")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "make test-unit: PYTEST_ARGS selected no test here" in run.stdout
    assert "make test-notebooks: PYTEST_ARGS selected no test here" in run.stdout


@needs_make
@pytest.mark.long  # make itself, as the one above
def test_a_full_run_that_collects_nothing_fails(tmp_path):
    run = make("test-unit", f"TESTS={tmp_path}")
    assert run.returncode != 0 and "Error 5" in run.stderr, "a run with no PYTEST_ARGS that collected no test passed"


@needs_make
def test_make_lab_starts_as_root_and_without_a_display():
    headless = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    lab = make("-n", "lab", env=headless | {"DISPLAY": "", "WAYLAND_DISPLAY": ""}).stdout
    command = next(line for line in lab.splitlines() if "jupyter lab" in line)
    assert ("--allow-root" in command) == (os.geteuid() == 0)
    if sys.platform.startswith("linux"):
        assert "--no-browser" in command and "no display" in lab
    with_display = make("-n", "lab", env={"DISPLAY": ":0"}).stdout
    assert "--no-browser" not in with_display


# ---- the README as a front door ---------------------------------------------------------------------------

def test_the_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the essay to docs/"


def exercise_cell(chapter: int) -> str:
    """The course map's exercise column for a chapter, counted from the catalog."""
    kinds = [e.kind for e in EXERCISES if e.chapter == chapter]
    return f"{len(kinds)}: {', '.join(kinds)}" if kinds else "none"


def table_rows(markdown: str, header: str) -> list[list[str]]:
    """The cells of each body row of the table whose header row starts with ``header``."""
    lines = markdown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def test_the_course_map_matches_the_notebooks_and_the_catalog():
    rows = table_rows(README.read_text(), "| # | chapter |")
    assert [r[1] for r in rows] == [f"[{p.stem}](notebooks/{p.name})" for p in NOTEBOOKS]
    run_times = json.loads((ROOT / "notebooks" / "run_times.json").read_text())  # scripts/run_notebooks.py keeps it
    for (number, _, _, exercises, runs_in), path in zip(rows, NOTEBOOKS, strict=True):
        expected = exercise_cell(int(number))
        assert exercises == expected, f"chapter {number}: the catalog says {expected}"
        assert path.stem in run_times, f"{path.name} has no run time: store it with scripts/run_notebooks.py"
        assert runs_in == minutes(run_times[path.stem]), \
            f"chapter {number} ran in {run_times[path.stem]} s when it was stored: the map says {runs_in}"


def test_the_run_time_column_rounds_up_to_half_minutes():
    assert [minutes(s) for s in (5, 30, 31, 59, 60, 61, 149)] == \
        ["0.5 min", "0.5 min", "1 min", "1 min", "1 min", "1.5 min", "2.5 min"]


def test_the_readme_results_are_rows_of_the_full_table():
    full = {r[0]: r for r in table_rows((ROOT / "docs/benchmarks.md").read_text(), "| system (version) |")}
    short = table_rows(README.read_text(), "| system | output tokens/s |")
    assert short, "the README has no results table"
    for row in short:
        assert row[0] in full, f"{row[0]}: not a row of docs/benchmarks.md's table"
        assert row[1:] == full[row[0]][2:], f"{row[0]}: the README's figures differ from docs/benchmarks.md"
