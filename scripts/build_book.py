"""Build the course as a static web site from the notebooks' stored outputs (``make book``).

    python scripts/build_book.py                  # writes build/book/; open build/book/index.html
    python scripts/build_book.py --out /tmp/site

Nothing is executed: each chapter's page shows the outputs its notebook stores (what ``make notebooks`` last
ran and ``make test`` compares), so the site is exactly the course a reader would see after running it. A page
per chapter (markdown, highlighted code, printed text, Plotly figures, the dashboards' static views, the chapter's
exercises), a page per ``docs/*.md``, and an index. Everything the pages need is in the site (``plotly.min.js`` is
copied from the installed plotly package once): it opens from disk with no network.

Why not Jupyter Book 2 (mystmd), which the issue asked for: its ``build --html`` downloads the book theme from
api.mystmd.org, which is unreachable here and in CI, and the theme is on neither PyPI nor npm. This builder is the
small offline stand-in; ``check_site`` is what its test holds it to.
"""

from __future__ import annotations

import argparse
import html
import json
import posixpath
import re
import shutil
import sys
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import mistune
import nbformat
import plotly
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer, TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from minfer.exercises.catalog import EXERCISES

sys.path.insert(0, str(Path(__file__).parent))
from static_views import is_static_view  # noqa: E402  (how a stored chapter marks a widget's static view)

if int(mistune.__version__.split(".")[0]) < 3:  # nbconvert allows mistune 2, whose renderer methods differ
    raise SystemExit(f"scripts/build_book.py needs mistune 3 (installed: {mistune.__version__})")

ROOT = Path(__file__).resolve().parents[1]
CSS = Path(__file__).with_name("book.css")
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
MARKER = ".minfer-book"  # marks a folder this script built, so that a rebuild may empty it first
COURSE_TITLE = "minfer: the course"

WIDGET = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
IMAGES = ("image/png", "image/jpeg")  # pictures a page shows as <img> (dashboards' static views are JPEG)
# Which of an output's representations the page shows: the first one it has, in Jupyter's own order of preference
# (a live widget or figure before a picture, a picture before HTML, HTML before plain text).
SHOWN_FIRST = (WIDGET, PLOTLY, *IMAGES, "text/html", "text/markdown", "text/plain")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NBVAL_MARKER = re.compile(r"^# NBVAL_\w+[^\n]*\n?", flags=re.M)  # a line for the tests (nbval), not the reader


# ---- where each file of the repository lives in the site ----------------------------------------------------

def chapter_notebooks(notebooks_dir: Path) -> list[Path]:
    """The course's chapters, in order: ``NN_name.ipynb``."""
    return sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))


# folders of docs/ the site carries as they are: the pictures the pages show, the files they offer to download
# (the Grafana dashboard)
COPIED_DOC_FOLDERS = ("images", "grafana")


def site_path(repo_path: str) -> str | None:
    """Where the repository file ``repo_path`` (``docs/engine.md``) is in the site, or None if the site lacks it."""
    if repo_path == "README.md":
        return "index.html"
    if m := re.fullmatch(r"notebooks/([^/]+)\.ipynb", repo_path):
        return f"{m[1]}.html"
    if m := re.fullmatch(r"docs/([^/]+)\.md", repo_path):
        return f"docs/{m[1]}.html"
    if any(repo_path.startswith(f"docs/{folder}/") for folder in COPIED_DOC_FOLDERS):
        return repo_path
    return None


def rewrite_url(url: str, source: str, page: str) -> str:
    """``url`` as written in the repository file ``source`` (``docs/course.md``), as page ``page`` of the site
    (``docs/course.html``) must write it: ``../notebooks/03_x.ipynb`` becomes ``../03_x.html``. External URLs and
    same-page anchors are kept; a link to a file the site does not hold is kept as written, and check_site reports
    it (a broken link should fail the build, not vanish)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return url
    target = site_path(posixpath.normpath(posixpath.join(posixpath.dirname(source), unquote(parts.path))))
    if target is None:
        return url
    relative = posixpath.relpath(target, posixpath.dirname(page) or ".")
    return relative + (f"#{parts.fragment}" if parts.fragment else "")


def relative_root(page: str) -> str:
    """The way back from ``page`` to the site's root folder: ``""`` or ``"../"``."""
    return "../" * page.count("/")


# ---- markdown ------------------------------------------------------------------------------------------------

def slug(text: str) -> str:
    """GitHub's anchor for a heading (what the repository's links name): lower case, punctuation dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def highlighted(code: str, language: str = "python") -> str:
    """``code`` as highlighted HTML (pygments); an unknown language (``output``) is shown as plain text."""
    try:
        lexer = PythonLexer() if language == "python" else get_lexer_by_name(language)
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(code, lexer, HtmlFormatter())


class PageRenderer(mistune.HTMLRenderer):
    """mistune's HTML, with the repository's links rewritten for the site, headings given GitHub's anchors (the
    docs link to them) and fenced code highlighted. One per page: it numbers repeated headings as GitHub does."""

    def __init__(self, source: str, page: str) -> None:
        super().__init__(escape=False)  # notebook markdown may hold HTML of its own
        self.source, self.page = source, page
        self.seen: dict[str, int] = {}

    def link(self, text: str, url: str, title: str | None = None) -> str:
        return super().link(text, rewrite_url(url, self.source, self.page), title)

    def image(self, text: str, url: str, title: str | None = None) -> str:
        return super().image(text, rewrite_url(url, self.source, self.page), title)

    def heading(self, text: str, level: int, **attrs: object) -> str:
        anchor = slug(html.unescape(re.sub(r"<[^>]+>", "", text)))
        count = self.seen.get(anchor, 0)
        self.seen[anchor] = count + 1
        return super().heading(text, level, id=anchor if not count else f"{anchor}-{count}")

    def block_code(self, code: str, info: str | None = None) -> str:
        return highlighted(code, (info or "").split()[0] if info and info.strip() else "text")


def markdown_renderer(source: str, page: str) -> mistune.Markdown:
    """A markdown-to-HTML function for one page. Math (``$x$``) stays as its source text in a span: the course
    has little of it, and typesetting it would need MathJax, which is a download."""
    md = mistune.create_markdown(renderer=PageRenderer(source, page),
                                 plugins=["table", "strikethrough", "math"])
    md.renderer.register("inline_math", lambda _, text: f'<span class="math">${html.escape(text)}$</span>')
    md.renderer.register("block_math", lambda _, text: f'<pre class="math">$$\n{html.escape(text)}\n$$</pre>\n')
    return md


def first_heading(markdown: str, fallback: str) -> str:
    """The text of the first ``# `` heading: a chapter's or a page's title."""
    m = re.search(r"^#\s+(.+?)\s*$", markdown, flags=re.M)
    return m.group(1).replace("`", "") if m else fallback


# ---- a notebook's stored outputs -----------------------------------------------------------------------------

def shown_mime(output: dict) -> str | None:
    """Which representation of a display or result output the page shows (None: it holds none the page can)."""
    return next((mime for mime in SHOWN_FIRST if mime in output.get("data", {})), None)


@dataclass(slots=True, frozen=True)
class StoredFigures:
    """What a page must show of its notebook: one Plotly div per stored Plotly figure, one image per stored picture."""

    plotly: int
    images: int


def stored_figures(notebook: Path) -> StoredFigures:
    """Count the figures the notebook stores (the outputs whose shown representation is a figure or a picture)."""
    shown = [shown_mime(o) for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"
             for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
    return StoredFigures(shown.count(PLOTLY), sum(shown.count(mime) for mime in IMAGES))


def plain(text: str) -> str:
    """Printed text as a terminal would leave it: colour codes dropped, a line redrawn after ``\\r`` (a progress
    bar) shown as it ended."""
    text = ANSI.sub("", text)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def pre(text: str, css: str) -> str:
    return f'<pre class="{css}">{html.escape(plain(text))}</pre>'


class ChapterRenderer:
    """Renders one notebook's cells, numbering its Plotly figures so that each has a div of its own."""

    def __init__(self, source: str, page: str) -> None:
        self.markdown = markdown_renderer(source, page)
        self.figures = 0

    def cell(self, cell: dict) -> str:
        if cell["cell_type"] == "markdown":
            return f'<div class="cell markdown">\n{self.markdown(cell["source"])}</div>\n'
        if cell["cell_type"] != "code" or not (cell["source"].strip() or cell.get("outputs")):
            return ""
        outputs = cell.get("outputs", [])
        # the runner stores a widget's static view right after it (under the id of the model it drew)
        viewed = [i + 1 < len(outputs) and is_static_view(outputs[i + 1]) for i in range(len(outputs))]
        shown = "".join(self.output(o, v) for o, v in zip(outputs, viewed))
        body = f'<div class="input">{highlighted(NBVAL_MARKER.sub("", cell["source"]))}</div>\n'
        if shown:
            body += f'<div class="outputs">\n{shown}</div>\n'
        return f'<div class="cell code">\n{body}</div>\n'

    def output(self, output: dict, view_follows: bool) -> str:
        kind = output["output_type"]
        if kind == "stream":
            return pre(output["text"], output.get("name", "stdout")) + "\n"
        if kind == "error":
            return pre("\n".join(output.get("traceback") or [f'{output["ename"]}: {output["evalue"]}']), "error") + "\n"
        data = output.get("data", {})
        mime = shown_mime(output)
        if is_static_view(output):  # the picture a chapter stores after a widget (scripts/static_views.py)
            return self.static_view(data) + "\n"
        if mime == WIDGET:
            return ('<p class="note">live widget: run the notebook to use it; '
                    + ("its static view follows</p>\n" if view_follows else "no static view of it is stored</p>\n"))
        if mime == PLOTLY:
            return self.plotly(data[PLOTLY]) + "\n"
        if mime in IMAGES:
            return picture(mime, data[mime]) + "\n"
        if mime == "text/html":
            return f'<div class="html-output">{data["text/html"]}</div>\n'
        if mime == "text/markdown":
            return f'<div class="markdown-output">{self.markdown(data["text/markdown"])}</div>\n'
        if mime == "text/plain":
            return pre(data["text/plain"], "result") + "\n"
        return f'<p class="note">an output of type {", ".join(sorted(data)) or "none"} (not shown here)</p>\n'

    def plotly(self, figure: dict) -> str:
        """A div and the script that draws the stored figure into it (assets/plotly.min.js, loaded in the head)."""
        self.figures += 1
        div = f"figure-{self.figures}"
        spec = json.dumps([figure.get("data", []), figure.get("layout", {})], separators=(",", ":"))
        spec = spec.replace("</", "<\\/")  # a string in the figure must not close the script
        return (f'<div class="plotly-figure" id="{div}"></div>\n'
                f'<script>(function(f){{Plotly.newPlot("{div}",f[0],f[1],{{responsive:true}});}})({spec});</script>')

    def static_view(self, data: dict) -> str:
        """A dashboard as its chapter left it: the stored picture with its caption (or a progress bar's last line)."""
        caption = html.escape(plain(data.get("text/plain", "")))
        if mime := next((m for m in IMAGES if m in data), None):
            shown = picture(mime, data[mime], caption)
            return f'<figure class="static-view">{shown}<figcaption>{caption}</figcaption></figure>'
        return f'<figure class="static-view"><pre class="result">{caption}</pre></figure>'


def picture(mime: str, b64: str, alt: str = "a figure the notebook stores") -> str:
    return f'<img class="output" alt="{alt}" src="data:{mime};base64,{b64.strip()}">'


# ---- pages ---------------------------------------------------------------------------------------------------

def page_html(page: str, title: str, body: str, *, nav: str = "", plotly_js: bool = False) -> str:
    """One page of the site: the shared stylesheet, a bar with the way home (and prev/next), the body."""
    root = relative_root(page)
    script = f'<script src="{root}assets/plotly.min.js"></script>\n' if plotly_js else ""
    bar = f'<a href="{root}index.html">{html.escape(COURSE_TITLE)}</a>{nav}'
    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n"
            f'<link rel="stylesheet" href="{root}assets/book.css">\n{script}</head>\n<body>\n'
            f'<nav class="site top">{bar}</nav>\n<main>\n{body}</main>\n'
            f'<nav class="site bottom">{bar}</nav>\n</body>\n</html>\n')


def exercises_section(chapter: int, docs: set[str]) -> str:
    """The chapter's exercises, from the catalog, and how to check one."""
    head = '<section class="exercises" id="exercises-in-this-chapter">\n<h2>Exercises in this chapter</h2>\n'
    mine = [e for e in EXERCISES if e.chapter == chapter]
    if not mine:
        return head + "<p>This chapter sets no exercises.</p>\n</section>\n"
    rows = "".join(f"<tr><td><code>{e.id}</code></td><td>{e.kind}</td><td>{html.escape(e.title)}</td>"
                   f"<td>{e.difficulty} of 3</td><td>{e.minutes}</td></tr>\n" for e in mine)
    build = next((e.id for e in mine if e.kind == "build"), None)
    predict = next((e.id for e in mine if e.kind == "predict"), None)
    how = ["How to check one, from the root of your copy of the course (<code>make student</code> writes one):"]
    if build:
        how.append(f"<code>make check EX={build}</code> checks a build exercise (in the notebook: "
                   f'<code>check("{build}")</code>);')
    if predict:
        how.append(f"<code>make check EX={predict} ANSWER=4</code> checks a prediction, given your number;")
    if any(e.kind == "explain" for e in mine):
        how.append("an explain exercise is answered in writing (the instructor's guide holds model answers).")
    if "course" in docs:
        how.append('More in <a href="docs/course.html">taking the course</a>.')
    return (head + "<table>\n<thead><tr><th>id</th><th>kind</th><th>title</th><th>difficulty</th><th>minutes</th></tr>"
            f"</thead>\n<tbody>\n{rows}</tbody>\n</table>\n<p>{' '.join(how)}</p>\n</section>\n")


def chapter_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first heading of the chapter's first markdown cell ("04 · Continuous batching")."""
    return first_heading(next((c.source for c in nb.cells if c.cell_type == "markdown"), ""), fallback)


def chapter_page(notebook: Path, nb: nbformat.NotebookNode, docs: set[str], prev: tuple[str, str] | None,
                 next_: tuple[str, str] | None) -> str:
    """A chapter's page: its cells with their stored outputs, its exercises, and the ways to its neighbours."""
    page = f"{notebook.stem}.html"
    renderer = ChapterRenderer(f"notebooks/{notebook.name}", page)
    body = "".join(renderer.cell(cell) for cell in nb.cells)
    body += exercises_section(int(notebook.name[:2]), docs)
    nav = "".join(f' <a class="{rel}" href="{link[0]}">{rel}: {html.escape(link[1])}</a>'
                  for rel, link in (("previous", prev), ("next", next_)) if link)
    return page_html(page, chapter_title(nb, notebook.stem), body, nav=nav, plotly_js=renderer.figures > 0)


def index_page(chapters: list[tuple[str, str]], docs: list[tuple[str, str]], readme: Path | None) -> str:
    """The front page: the chapters and docs pages, then the README (its links rewritten to the site's pages)."""
    def count(chapter: str) -> str:
        n = sum(e.chapter == int(chapter[:2]) for e in EXERCISES)
        return f" <span class=\"note\">({n} exercise{'s' * (n != 1)})</span>" if n else ""
    body = (f"<h1>{html.escape(COURSE_TITLE)}</h1>\n<p>Every chapter as its notebook stores it: the text, the code, "
            "and what the code printed and drew when it last ran. To run and change them, open the notebooks: "
            "<code>make lab</code>.</p>\n<h2 id=\"chapters\">Chapters</h2>\n<ul class=\"chapters\">\n")
    body += "".join(f'<li><a href="{page}">{html.escape(title)}</a>{count(page)}</li>\n' for page, title in chapters)
    body += '</ul>\n<h2 id="documentation">Documentation</h2>\n<ul class="docs">\n'
    body += "".join(f'<li><a href="{page}">{html.escape(title)}</a></li>\n' for page, title in docs)
    body += "</ul>\n"
    if readme is not None:
        readme_html = markdown_renderer("README.md", "index.html")(readme.read_text())
        body += f'<hr>\n<div class="readme">\n{readme_html}</div>\n'
    return page_html("index.html", COURSE_TITLE, body)


# ---- the site ------------------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class Site:
    """What build wrote: the folder, its chapter and docs pages (site paths), and its size."""

    out: Path
    chapters: tuple[str, ...]
    docs: tuple[str, ...]
    files: int
    bytes: int


def fresh_folder(out: Path) -> None:
    """Empty ``out`` for a build (a stale page must not survive), but only a folder this script built."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise SystemExit(f"{out} is not empty and holds no earlier book: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("built by scripts/build_book.py; emptied and rebuilt by each build\n")


def write(out: Path, page: str, text: str) -> None:
    path = out / page
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


def build(out: Path, notebooks_dir: Path = ROOT / "notebooks", docs_dir: Path = ROOT / "docs",
          readme: Path | None = ROOT / "README.md") -> Site:
    """Write the site into ``out`` (emptied first) from the stored outputs of ``notebooks_dir``'s chapters, the
    pages of ``docs_dir`` and ``readme`` (None: an index without it). Deterministic: the same files give the same
    bytes (no dates, everything in sorted order)."""
    fresh_folder(out)
    notebooks = {path: nbformat.read(path, as_version=4) for path in chapter_notebooks(notebooks_dir)}
    doc_files = sorted(docs_dir.glob("*.md"))
    docs = {p.stem for p in doc_files}
    titles = [(f"{path.stem}.html", chapter_title(nb, path.stem)) for path, nb in notebooks.items()]
    for i, (path, nb) in enumerate(notebooks.items()):
        prev = titles[i - 1] if i > 0 else None
        next_ = titles[i + 1] if i + 1 < len(titles) else None
        write(out, titles[i][0], chapter_page(path, nb, docs, prev, next_))
    doc_titles = []
    for doc in doc_files:
        page, text = f"docs/{doc.stem}.html", doc.read_text()
        title = first_heading(text, doc.stem)
        doc_titles.append((page, title))
        write(out, page, page_html(page, title, markdown_renderer(f"docs/{doc.name}", page)(text)))
    for folder in COPIED_DOC_FOLDERS:
        if (docs_dir / folder).is_dir():
            shutil.copytree(docs_dir / folder, out / "docs" / folder)
    write(out, "index.html", index_page(titles, doc_titles, readme))
    (out / "assets").mkdir(exist_ok=True)
    write(out, "assets/book.css", CSS.read_text() + "\n/* code highlighting (pygments) */\n"
          + HtmlFormatter().get_style_defs(".highlight") + "\n")
    shutil.copyfile(PLOTLY_JS, out / "assets" / "plotly.min.js")
    files = [p for p in out.rglob("*") if p.is_file()]
    return Site(out, tuple(page for page, _ in titles), tuple(page for page, _ in doc_titles),
                len(files), sum(p.stat().st_size for p in files))


# ---- checking a built site -----------------------------------------------------------------------------------

class Tags(HTMLParser):
    """Every start tag of a page with its attributes (the text inside <script> is not parsed as tags)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(page: Path) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(page.read_text(encoding="utf-8"))
    parser.close()
    return parser.tags


def has_class(attrs: dict[str, str | None], name: str) -> bool:
    return name in (attrs.get("class") or "").split()


def unresolved(page: Path, url: str, out: Path) -> bool:
    """Whether a local ``url`` of ``page`` names no file of the site (external URLs, data: and anchors pass)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return False
    target = (page.parent / unquote(parts.path)).resolve()
    return not (target.is_relative_to(out.resolve()) and target.is_file())


def check_site(out: Path, notebooks_dir: Path = ROOT / "notebooks") -> list[str]:
    """What is wrong with the site in ``out`` (empty: nothing): a chapter of ``notebooks_dir`` without its page, a
    page with more or fewer Plotly figures or output images than its notebook stores, and any local link or
    source (href, src) of any page that names no file of the site."""
    problems = []
    for notebook in chapter_notebooks(notebooks_dir):
        page = out / f"{notebook.stem}.html"
        if not page.is_file():
            problems.append(f"{page.name}: missing (the page of {notebook.name})")
            continue
        found = tags(page)
        expected = stored_figures(notebook)
        divs = sum(t == "div" and has_class(a, "plotly-figure") for t, a in found)
        images = sum(t == "img" and has_class(a, "output") for t, a in found)
        if divs != expected.plotly:
            problems.append(f"{page.name}: {divs} Plotly figures, but {notebook.name} stores {expected.plotly}")
        if images != expected.images:
            problems.append(f"{page.name}: {images} output images, but {notebook.name} stores {expected.images}")
    for page in sorted(out.rglob("*.html")):
        for _, attrs in tags(page):
            for attr in ("href", "src"):
                url = attrs.get(attr)
                if url and unresolved(page, url, out):
                    problems.append(f"{page.relative_to(out)}: {attr}={url} names no file of the site")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="where to write the site")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    start = time.perf_counter()
    site = build(out)
    problems = check_site(out)
    seconds = time.perf_counter() - start
    print(f"The course site: {len(site.chapters)} chapters and {len(site.docs)} docs pages, {site.files} files, "
          f"{site.bytes / 1e6:.1f} MB, built in {seconds:.1f} s from the notebooks' stored outputs, in {out}/")
    print(f"Open {out / 'index.html'} in a browser (file://{out / 'index.html'}): it needs no network and no server.")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
