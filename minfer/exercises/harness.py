"""What a checker is made of: named cases, invariant-checked engine runs, and one result record.

A *build* checker is a function ``check(t: Tester)``. It runs cases one after another, each under
``with t.case("what it tries", hint="what usually went wrong"):``; the first case that raises ends the
check, and the result names that case, the error, the line of package code it came from, and the hint.
Every case builds its own pool or engine, so nothing one case does leaks into the next; engine runs go
through ``t.run`` (``check_invariants()`` after every step, a bound on the number of steps).

A *predict* checker is a function ``measure() -> Measurement``: the measured value, the tolerance a
prediction must fall within, and a paragraph explaining where the number comes from.

``CheckResult`` is plain data (it crosses a process boundary as JSON) and knows how to print itself.
"""

from __future__ import annotations

import math
import re
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from minfer.exercises.regions import STUB_MESSAGE

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # .../minfer


class Tester:
    """Handed to a build checker: names the case running now and counts those that passed."""

    def __init__(self) -> None:
        self.case_name: str | None = None
        self.hint = ""
        self.passed: list[str] = []
        self.notes: list[str] = []  # what the check measured on the way (a capstone's scores): the report shows them

    def note(self, text: str) -> None:
        self.notes.append(text)

    @contextmanager
    def case(self, name: str, hint: str = "") -> Iterator[None]:
        self.case_name, self.hint = name, hint
        yield  # an exception propagates: the runner reports this case as the failing one
        self.passed.append(name)

    def run(self, engine: Any, max_steps: int = 2000, before_step: Callable[[int], object] | None = None) -> dict:
        """Step ``engine`` until every request has finished, with ``check_invariants()`` after every step.
        Returns the final output of each request by id."""
        final: dict = {}
        for step in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            if before_step is not None:
                before_step(step)
            for out in engine.step():
                if out.finished:
                    assert out.request_id not in final, f"{out.request_id} finished twice"
                    final[out.request_id] = out
            try:
                engine.scheduler.check_invariants()
            except AssertionError as e:
                raise AssertionError(f"after step {step}: invariant broken: {e}") from e
        else:
            raise AssertionError(f"the engine did not finish within {max_steps} steps "
                                 "(a request that is never scheduled, or that preempts itself forever?)")
        pool = engine.block_pool
        assert pool.num_free_blocks == pool.num_blocks, (
            f"blocks leaked: {pool.num_blocks - pool.num_free_blocks} still in use after every request finished")
        return final


@dataclass(slots=True)
class Measurement:
    """What a predict checker measured, and how close a prediction must be."""

    value: float
    unit: str  # "blocks", "x", "ms" ...
    explain: str  # where the number comes from: printed after the comparison
    abs_tol: float = 0.0  # |prediction - value| <= abs_tol ...
    rel_tol: float = 0.0  # ... or <= rel_tol * |value|
    factor: float = 0.0  # ... or within this factor either way (for noisy timings): value/f <= p <= value*f

    def accepts(self, prediction: float) -> bool:
        d = abs(prediction - self.value)
        if d <= self.abs_tol + 1e-12 or d <= self.rel_tol * abs(self.value):
            return True
        if self.factor and prediction > 0 and self.value > 0:
            return max(prediction / self.value, self.value / prediction) <= self.factor
        return False

    def tolerance_text(self) -> str:
        parts = []
        if self.abs_tol or not (self.rel_tol or self.factor):
            parts.append("exactly" if not self.abs_tol else f"within {self.abs_tol:g} {self.unit}")
        if self.rel_tol:
            parts.append(f"within {self.rel_tol:.0%}")
        if self.factor:
            parts.append(f"within a factor of {self.factor:g}")
        return " or ".join(parts)


@dataclass(slots=True)
class CheckResult:
    """The outcome of one check. ``status``: passed | failed | error (the checker itself broke) |
    unanswered (a prediction not given yet) | written (an explain exercise: nothing to run) | timeout."""

    exercise: str
    kind: str
    status: str
    title: str = ""
    case: str | None = None  # the failing case
    message: str = ""
    hint: str = ""
    where: list[str] = field(default_factory=list)  # "minfer/kv/block_pool.py:120 in allocate: <line>"
    stub: str | None = None  # the exercise whose NotImplementedError stub the failure came from
    cases_passed: int = 0
    hidden_cases: bool = False  # the instructor's hidden cases ran too (never in a student build)
    notes: list[str] = field(default_factory=list)  # what the check measured on the way, passed or not
    prediction: float | None = None
    measured: float | None = None
    unit: str = ""
    tolerance: str = ""
    explain: str = ""
    seconds: float = 0.0
    stand_ins: list[str] = field(default_factory=list)  # other exercises not written yet: the reference ran instead
    set_aside: list[str] = field(default_factory=list)  # the student's own other exercises, replaced for this check

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"<{self.exercise}: {self.status}>"

    def _ipython_display_(self) -> None:
        """A notebook shows nothing more: ``check`` has printed the whole report already."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CheckResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def report(self) -> str:
        """The human-readable report ``check`` prints."""
        head = f"{self.exercise} {self.title}".rstrip()
        if self.kind == "predict":
            if self.status == "unanswered":
                return (f"{head}: no prediction yet. Write your number first, then run "
                        f"check({self.exercise!r}, your_number) in a notebook, or in a shell "
                        f"make check EX={self.exercise} ANSWER=your_number "
                        f"(python -m minfer.exercises check {self.exercise} your_number).")
            if self.status in ("passed", "failed"):
                verdict = "close enough" if self.passed else "outside the tolerance"
                lines = [f"{head}: {'PASSED' if self.passed else 'NOT YET'} -- you predicted {self.prediction:g} "
                         f"{self.unit}, measured {_fmt(self.measured)} {self.unit} ({verdict}: {self.tolerance}).",
                         "", _wrap(self.explain)]
                return "\n".join(lines)
        if self.status == "written":
            return (f"{head}: a written exercise -- answer in your notebook. Model answers are in the instructor's "
                    "guide, docs/instructor.md of the course repository (a student build leaves it out; for "
                    "self-study: read them after you have written yours).")
        notes = "".join(f"\n  {n}" for n in self.notes)
        if self.status == "passed":
            return f"{head}: PASSED ({self.cases_passed} cases, {self.seconds:.1f} s){notes}"
        lines = [f"{head}: {'NOT YET' if self.status == 'failed' else self.status.upper()} "
                 f"({self.cases_passed} cases passed, {self.seconds:.1f} s)"]
        if self.case:
            lines.append(f"  failing case: {self.case}")
        if self.stub == self.exercise:
            m = re.search(r"E\d+\.\d+: write (.*?) \(.*\), see (chapter .*?)['\"]?\)?$", self.message, re.M)
            lines.append(f"  not written yet: {m[1] if m else 'the stub'} still raises NotImplementedError. Write your "
                         f"code between its EXERCISE markers ({m[2] if m else 'see the chapter'}).")
            self.where = self.where[-1:]
        elif self.stub:  # another exercise's stub: a class handout has no reference to stand in for it
            lines.append(f"  this check runs your {self.stub} too, and it is not written yet: write {self.stub} first "
                         f"(python -m minfer.exercises show {self.stub})")
            self.where = []
        elif self.message:
            lines.append("  " + self.message.replace("\n", "\n  "))
        for w in self.where:
            lines.append(f"  at {w}")
        if self.hint and not self.stub:
            lines.append(f"  hint: {self.hint}")
        if note := self.stand_in_note():
            lines.append(f"  ({note})")
        return "\n".join(lines) + notes

    def stand_in_note(self) -> str:
        """Which other exercises ran on the reference during this check, and why; "" when none did."""
        parts = []
        if self.stand_ins:
            parts.append(f"{_and(self.stand_ins)}, not written yet")
        if self.set_aside:
            parts.append(f"your own {_and(self.set_aside)}, set aside so that only {self.exercise} is judged")
        return f"during this check the reference stood in for {', and for '.join(parts)}" if parts else ""


def _and(ids: list[str]) -> str:
    return ids[0] if len(ids) == 1 else f"{', '.join(ids[:-1])} and {ids[-1]}"


def _fmt(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "?"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _wrap(text: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.fill(p, width) for p in text.split("\n"))


def stub_in(exc: BaseException) -> str | None:
    """The exercise whose stub raised ``exc`` (anywhere in its chain, or quoted in its message -- a Triton
    compile error quotes the source line), or ``None``."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError) and (m := STUB_MESSAGE.match(str(e))):
            return m["id"]
        if m := re.search(r"NotImplementedError(?:\(['\"]|: )(?P<id>E\d+\.\d+): \S.*see chapter", str(e)):
            return m["id"]
        e = e.__cause__ or e.__context__
    return None


def package_frames(exc: BaseException, limit: int = 3) -> list[str]:
    """The innermost frames of ``exc``'s traceback that are engine code (not the checker's), as
    ``path:line in function: source``."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:  # the innermost cause first: where the error really arose
        chain.append(e)
        e = e.__cause__ or e.__context__
    for cause in reversed(chain):
        if frames := _package_frames(cause, limit):
            return frames
    return []


def _package_frames(exc: BaseException, limit: int) -> list[str]:
    out = []
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename.startswith("<"):  # <frozen importlib...>, <string>, a stand-in's compiled source
            continue
        path = Path(fs.filename)
        try:
            rel = path.resolve().relative_to(PACKAGE_ROOT.parent)
        except ValueError:
            continue
        if rel.parts[:2] == ("minfer", "exercises"):
            continue
        out.append(f"{rel.as_posix()}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()}")
    return out[-limit:]
