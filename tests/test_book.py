"""The course site (``make book``, scripts/build_book.py): built once from the notebooks' stored outputs, it has a
page per chapter with every figure its notebook stores, the chapter's exercises, the docs pages and an index that
links them all, nothing that needs the network, and check_site catches a page that loses any of that."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from minfer.exercises.catalog import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from build_book import build, check_site, rewrite_url  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = sorted((ROOT / "docs").glob("*.md"))
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def stored(notebook: Path, mime: str) -> int:
    """How many outputs of the notebook hold ``mime`` (counted here, apart from the builder's own count)."""
    return sum(mime in out.get("data", {}) for cell in nbformat.read(notebook, as_version=4).cells
               for out in cell.get("outputs", []))


def figure_divs(html: str) -> list[str]:
    return re.findall(r'<div class="plotly-figure" id="([^"]+)"></div>', html)


def output_images(html: str) -> int:
    return len(re.findall(r'<img class="output"', html))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build(tmp_path_factory.mktemp("book") / "site")


def test_every_chapter_has_a_page_and_the_site_checks_clean(site):
    assert [f"{nb.stem}.html" for nb in NOTEBOOKS] == list(site.chapters)
    assert all((site.out / page).is_file() for page in site.chapters)
    assert check_site(site.out) == []


def test_each_chapter_page_draws_every_figure_its_notebook_stores(site):
    drawn = 0
    for notebook in NOTEBOOKS:
        html = (site.out / f"{notebook.stem}.html").read_text()
        divs = figure_divs(html)
        assert len(divs) == stored(notebook, PLOTLY), notebook.name
        assert output_images(html) == stored(notebook, "image/png") + stored(notebook, "image/jpeg"), notebook.name
        for div in divs:  # each div is drawn by a script of its own, with the plotly.js the site carries
            assert html.count(f'Plotly.newPlot("{div}",') == 1, f"{notebook.name}: {div}"
        if divs:
            assert '<script src="assets/plotly.min.js"></script>' in html
        drawn += len(divs)
    assert drawn > 0, "no chapter stores a Plotly figure: the check above checked nothing"
    assert (site.out / "assets" / "plotly.min.js").stat().st_size > 1_000_000


def test_a_chapter_page_lists_its_exercises_from_the_catalog(site):
    for notebook in NOTEBOOKS:
        html = (site.out / f"{notebook.stem}.html").read_text()
        section = html[html.index('<section class="exercises"'):]
        ids = [e.id for e in EXERCISES if e.chapter == int(notebook.name[:2])]
        assert re.findall(r"<tr><td><code>(E[\d.]+)</code></td>", section) == ids, notebook.name
        if ids:
            assert "make check EX=" in section
        else:
            assert "sets no exercises" in section


def test_the_index_links_every_chapter_and_docs_page(site):
    hrefs = set(re.findall(r'href="([^"#]+)', (site.out / "index.html").read_text()))
    assert {f"{nb.stem}.html" for nb in NOTEBOOKS} <= hrefs
    assert {f"docs/{doc.stem}.html" for doc in DOCS} <= hrefs
    assert list(site.docs) == [f"docs/{doc.stem}.html" for doc in DOCS]


def test_the_site_needs_no_network(site):
    """Every script, stylesheet and image a page loads is a file of the site (or inline data)."""
    for page in site.out.rglob("*.html"):
        loaded = re.findall(r'<(?:script|img)\b[^>]*\ssrc="([^"]+)"|<link\b[^>]*\shref="([^"]+)"', page.read_text())
        remote = [url for pair in loaded for url in pair if url and re.match(r"[a-z]+:", url)
                  and not url.startswith("data:")]
        assert not remote, f"{page.name} loads {remote}"


def test_the_build_is_deterministic(site, tmp_path):
    again = build(tmp_path / "again")
    first = sorted(p.relative_to(site.out) for p in site.out.rglob("*") if p.is_file())
    assert first == sorted(p.relative_to(again.out) for p in again.out.rglob("*") if p.is_file())
    changed = [str(p) for p in first if (site.out / p).read_bytes() != (again.out / p).read_bytes()]
    assert not changed, f"two builds of the same files differ in {changed}"


def test_links_are_rewritten_to_the_sites_pages():
    assert rewrite_url("../notebooks/03_paged.ipynb#blocks", "docs/course.md", "docs/course.html") == \
        "../03_paged.html#blocks"
    assert rewrite_url("../README.md", "docs/gpu.md", "docs/gpu.html") == "../index.html"
    assert rewrite_url("engine.md#policies", "docs/course.md", "docs/course.html") == "engine.html#policies"
    assert rewrite_url("notebooks/00_tour.ipynb", "README.md", "index.html") == "00_tour.html"
    assert rewrite_url("../docs/images/x.png", "notebooks/11_v.ipynb", "11_v.html") == "docs/images/x.png"
    assert rewrite_url("https://example.org/a.md", "README.md", "index.html") == "https://example.org/a.md"
    assert rewrite_url("../minfer/engine.py", "docs/a.md", "docs/a.html") == "../minfer/engine.py"  # check_site's


# ---- check_site finds what is wrong -----------------------------------------------------------------------

def small_site(tmp_path: Path, notebook: Path) -> tuple[Path, Path]:
    """A site of one chapter (``notebook``), with no docs and no README."""
    notebooks, docs = tmp_path / "notebooks", tmp_path / "docs"
    notebooks.mkdir()
    docs.mkdir()
    shutil.copy(notebook, notebooks / notebook.name)
    return build(tmp_path / "site", notebooks, docs, readme=None).out, notebooks


def test_check_site_reports_a_lost_figure_and_a_lost_page(tmp_path):
    notebook = next(nb for nb in NOTEBOOKS if stored(nb, PLOTLY))
    out, notebooks = small_site(tmp_path, notebook)
    before = set(check_site(out, notebooks))  # links to chapters and docs this small site lacks
    page = out / f"{notebook.stem}.html"
    html = page.read_text()
    first = figure_divs(html)[0]
    page.write_text(html.replace(f'<div class="plotly-figure" id="{first}"></div>', "", 1))
    new = set(check_site(out, notebooks)) - before
    assert len(new) == 1 and "Plotly figures" in new.pop()
    page.unlink()
    assert f"{page.name}: missing (the page of {notebook.name})" in check_site(out, notebooks)


def widget_chapter(path: Path, static_view: bool) -> Path:
    """A chapter whose one cell shows a widget (and its static view, if asked), a Plotly figure, a picture and a
    line of text."""
    outputs = [nbformat.v4.new_output("display_data", {WIDGET: {"model_id": "m1", "version_major": 2},
                                                       "text/plain": "VBox(...)"})]
    if static_view:
        outputs.append(nbformat.v4.new_output("display_data", {"image/png": PNG_1PX, "text/plain": "step 7 of 9"},
                                              metadata={"minfer": {"static_view": "m2"}}))
    outputs += [nbformat.v4.new_output("display_data", {PLOTLY: {"data": [{"y": [1, 3]}], "layout": {}}}),
                nbformat.v4.new_output("display_data", {"image/png": PNG_1PX, "text/plain": "<Figure>"}),
                nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    cell = nbformat.v4.new_code_cell("display(dash)", outputs=outputs)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · A test chapter"), cell])
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("static_view", [True, False], ids=["with-static-view", "without"])
def test_a_widget_shows_its_static_view_or_says_it_has_none(tmp_path, static_view):
    out, notebooks = small_site(tmp_path, widget_chapter(tmp_path / "99_test.ipynb", static_view))
    html = (out / "99_test.html").read_text()
    assert check_site(out, notebooks) == []
    assert output_images(html) == 1 + static_view and len(figure_divs(html)) == 1
    if static_view:
        assert "its static view follows" in html and "<figcaption>step 7 of 9</figcaption>" in html
    else:
        assert "no static view of it is stored" in html
    assert "VBox(...)" not in html  # a widget's text stands for a kernel object: not shown


def test_check_site_reports_a_lost_image_and_a_broken_link(tmp_path):
    out, notebooks = small_site(tmp_path, widget_chapter(tmp_path / "99_test.ipynb", static_view=True))
    page = out / "99_test.html"
    html = page.read_text()
    page.write_text(re.sub(r'<img class="output"[^>]*>', "", html, count=1))
    assert check_site(out, notebooks) == ["99_test.html: 1 output images, but 99_test.ipynb stores 2"]
    page.write_text(html.replace("</main>", '<a href="docs/no-such-page.html">x</a></main>'))
    assert check_site(out, notebooks) == ["99_test.html: href=docs/no-such-page.html names no file of the site"]


def test_a_build_never_empties_a_folder_it_did_not_build(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds no earlier book"):
        build(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"
