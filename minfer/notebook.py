"""Helpers the course notebooks share: show the package's real source, and set up plotting.

A chapter never pastes a copy of package code -- it calls ``show_source(BlockPool.append_slots)`` (or,
for a file that is not Python, ``show_source(Path(...))``) so the lesson and the package cannot drift apart.
"""

from __future__ import annotations

import inspect
import os
import platform
import textwrap
from pathlib import Path
from typing import Any

import torch

LANGUAGES = {".py": "python", ".cpp": "cpp", ".h": "cpp"}


def source_of(obj: Any, lines: tuple[int, int] | None = None) -> str:
    """The source of a module, class, function, method or file (optionally only lines ``a..b``, 1-based).
    A decorated function shows its own source, not the decorator's wrapper."""
    src = obj.read_text() if isinstance(obj, Path) else textwrap.dedent(inspect.getsource(_unwrap(obj)))
    if lines:
        src = "\n".join(src.splitlines()[lines[0] - 1 : lines[1]])
    return src


def show_source(obj: Any, lines: tuple[int, int] | None = None) -> None:
    """Display ``obj``'s source as a highlighted code block, titled with where it lives."""
    from IPython.display import Markdown, display

    obj = obj if isinstance(obj, Path) else _unwrap(obj)
    path = str(obj) if isinstance(obj, Path) else inspect.getsourcefile(obj) or "?"
    rel = path[path.rfind("minfer/"):] if "minfer/" in path else os.path.basename(path)
    start = 1 if isinstance(obj, Path) else inspect.getsourcelines(obj)[1]
    if lines:
        start += lines[0] - 1
    language = LANGUAGES.get(Path(path).suffix, "")
    display(Markdown(f"`{rel}` line {start}\n\n```{language}\n{source_of(obj, lines)}\n```"))


def _unwrap(obj: Any) -> Any:
    """The function under its decorators (``@torch.inference_mode()`` wraps a function in one that lives in
    torch's ``_contextlib.py``; ``functools.wraps`` leaves the original in ``__wrapped__``)."""
    return inspect.unwrap(obj) if callable(obj) and not inspect.isclass(obj) else obj


def setup_notebook(threads: int | None = None) -> dict[str, str]:
    """Small, reproducible notebooks: plotly figures as JSON (no 4 MB of embedded JavaScript) in the course
    template, fixed seeds, and (in a student build) the reference standing in for exercises not written yet, so every
    chapter runs; returns a description of the machine (printed by chapter 00)."""
    import plotly.io as pio

    from minfer.exercises import stand_in
    from minfer.viz.style import use_course_template

    pio.renderers.default = "plotly_mimetype"
    use_course_template()  # every chapter's figures in the course template (tests/test_figures_stored.py)
    torch.manual_seed(0)
    if threads:
        torch.set_num_threads(threads)
    stand_in()  # in a student build: the reference runs for exercises not written yet, saying which
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": str(torch.get_num_threads()),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


def course_device() -> str:
    """The one device every chapter runs on: ``$MINFER_DEVICE`` if set (``cpu``, ``cuda``, ``cuda:1``), else
    CUDA when torch sees a GPU, else the CPU. Chapters pass it to ``load_model`` and ``EngineConfig``, so the
    course runs unchanged on a laptop and on a GPU."""
    import re

    wanted = os.environ.get("MINFER_DEVICE", "").strip()
    if not wanted:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", wanted):
        raise ValueError(f"MINFER_DEVICE must be 'cpu', 'cuda' or 'cuda:N', got {wanted!r}")
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"MINFER_DEVICE={wanted} but torch sees no CUDA GPU (is a CUDA build of torch installed?)")
    return wanted
