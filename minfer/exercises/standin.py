"""Stand-ins: the reference solution runs in place of an exercise, in this process only.

Two situations need the reference code although the student's file holds something else:

* a student skipped an exercise, and a later chapter runs the engine that needs it. ``stand_in()``
  (which ``setup_notebook()`` calls) finds every region that is still the untouched stub and swaps in the
  reference, saying so in one line per exercise. The student's files are never written; a region the
  student has started is left alone, so their own code runs -- and fails visibly if it is wrong;
* a check isolates its exercise: while ``check("E4.1")`` runs, the reference stands in for every *other*
  exercise, so a bug in E3.1 cannot fail E4.1 and every check fails only because of its own code.

The swap works on whole *units* (the method or function holding a region): the unit's source is taken from
the student's file, its regions' bodies are replaced by the reference's, and the result is compiled into
the module's namespace and put where the old function was (the class attribute, or every module global
that held it). The new function's ``__wrapped__`` points to the student's, so ``show_source`` and
``inspect.getsource`` still show the student's code. ``StandIns`` remembers each swap and ``restore()``
puts every original back: a check leaves the engine exactly as it found it. It also notes which stand-ins
were called (``ran``), so that a check names only the exercises whose reference it really used.

In the repository itself every region *is* the reference, so nothing is ever swapped there.
"""

from __future__ import annotations
import __future__

import ast
import functools
import importlib
import json
import linecache
import sys
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minfer.exercises.regions import Region, find_regions, replace_bodies, unit_span, units

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository (or student build) root
SOLUTIONS = Path(__file__).resolve().parent / "solutions.json"  # written into student builds only

Key = tuple[str, str, str, int]  # (exercise, file, unit, index)


def is_student_build() -> bool:
    return SOLUTIONS.exists()


def reference_bodies() -> dict[Key, str]:
    """The reference body of every region: from ``solutions.json`` in a student build, else from the
    package's own files (the repository is the reference)."""
    if is_student_build():
        data = json.loads(SOLUTIONS.read_text())
        return {(r["exercise"], r["file"], r["unit"], r["index"]): r["body"] for r in data["regions"]}
    return {(r.exercise, r.rel, r.unit, r.index): r.body for r in find_regions(ROOT)}


def key(r: Region) -> Key:
    return (r.exercise, r.rel, r.unit, r.index)


@dataclass(slots=True)
class Swap:
    owner: Any  # a class or a module
    name: str
    old: Any
    new: Any


@dataclass(slots=True)
class StandIns:
    """The swaps made so far; ``restore()`` (or leaving the ``with`` block) undoes them all."""

    swaps: list[Swap] = field(default_factory=list)
    exercises: list[str] = field(default_factory=list)
    units: set[tuple[str, str]] = field(default_factory=set)  # (file, unit) swapped: never twice
    ran: set[str] = field(default_factory=set)  # exercises whose stand-in was called (a Triton kernel's: swapped)

    def __enter__(self) -> StandIns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        for s in reversed(self.swaps):
            setattr(s.owner, s.name, s.old)
        # a module first imported while a module-level function stood in took the stand-in by name (a checker
        # imported during another exercise's check): it gets the original back too
        originals = {id(s.new): s.old for s in self.swaps if isinstance(s.owner, types.ModuleType)}
        if originals:
            for mod in list(sys.modules.values()):
                for n, v in list(getattr(mod, "__dict__", {}).items()):
                    if id(v) in originals:
                        setattr(mod, n, originals[id(v)])
        self.swaps.clear()
        self.exercises.clear()
        self.units.clear()
        self.ran.clear()

    def install(self, exercises: Iterable[str], only_stubs: bool = True, always: bool = False) -> list[str]:
        """Swap in the reference for each of ``exercises`` whose regions are still stubs (``only_stubs``), or
        differ from the reference at all, or -- ``always`` -- whatever they hold now (a checker that compares a
        student's schedule with the reference's uses that). Returns the exercises swapped."""
        wanted = set(exercises)
        refs = reference_bodies()
        todo: dict[tuple[str, str], list[Region]] = {}
        for r in find_regions(ROOT):
            if r.exercise not in wanted or key(r) not in refs or (r.rel, r.unit) in self.units:
                continue
            if always or (r.is_stub if only_stubs else r.body != refs[key(r)]):
                todo.setdefault((r.rel, r.unit), []).append(r)
        done = []
        for (rel, unit), regions in todo.items():
            if not importable_now(rel):
                continue
            self._swap_unit(rel, unit, {(r.exercise, r.unit, r.index): refs[key(r)] for r in regions})
            self.units.add((rel, unit))
            done.append(regions[0].exercise)
        done = sorted(set(done), key=_order)
        self.exercises += [e for e in done if e not in self.exercises]
        return done

    def try_body(self, exercise: str, unit: str, body: str, index: int = 0) -> None:
        """Run ``body`` (source text, any indentation) as region ``index`` of ``exercise`` in ``unit``, in this
        process: how the tests prove that a checker catches a wrong solution, without editing any file."""
        region = next((r for r in find_regions(ROOT) if (r.exercise, r.unit, r.index) == (exercise, unit, index)),
                      None)
        if region is None:
            raise ValueError(f"no region {index} of {exercise} in {unit}")
        text = "".join(region.indent + line if line.strip() else line
                       for line in textwrap.dedent(body).strip("\n").splitlines(keepends=True)) + "\n"
        self._swap_unit(region.rel, unit, {(exercise, unit, index): text})
        self.units.add((region.rel, unit))

    def _swap_unit(self, rel: str, unit: str, bodies: dict[tuple[str, str, int], str]) -> None:
        path = ROOT / rel
        text = replace_bodies(path.read_text(), path, rel, bodies)
        node = dict(units(ast.parse(text)))[unit]
        first, last = unit_span(node)
        source = textwrap.dedent("".join(text.splitlines(keepends=True)[first - 1 : last]))
        exercise = next(iter(bodies))[0]
        filename = f"<reference for {exercise}: {rel} {unit}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        module = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        code = compile(source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
        namespace: dict[str, Any] = {}
        exec(code, module.__dict__, namespace)  # globals: the module's own, as if defined there
        *outer, name = unit.split(".")
        owner: Any = module
        for part in outer:
            owner = getattr(owner, part)
        old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        new = namespace[name]
        plain = isinstance(new, types.FunctionType)
        if plain:
            new = self._watched(new, exercise, old)
        else:  # a Triton kernel: launched by Triton, not called, so it cannot be watched -- count it as run.
            # (Triton reads its kernel's source through inspect too, and would run the student's again: no
            # __wrapped__. Its stand-in replaces only the module's global, which the launching wrapper reads;
            # a notebook's own name for the kernel keeps showing the student's code.)
            self.ran.add(exercise)
        getattr(new, "fn", new).__minfer_stand_in__ = exercise
        self.swaps.append(Swap(owner, name, old, new))
        setattr(owner, name, new)
        if owner is module and plain:  # a module-level function: every module that imported it by name, too
            for mod in list(sys.modules.values()):
                names = [n for n, v in list(getattr(mod, "__dict__", {}).items()) if v is old]
                for n in names:
                    self.swaps.append(Swap(mod, n, old, new))
                    setattr(mod, n, new)


    def _watched(self, reference: Any, exercise: str, student: Any) -> Any:
        """``reference``, noting in ``ran`` when it is called; its ``__wrapped__`` is the student's function,
        which ``inspect.getsource`` (so ``show_source``) follows: the notebook keeps showing the student's code."""
        ran = self.ran

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            ran.add(exercise)
            return reference(*args, **kwargs)

        functools.update_wrapper(stand_in, reference)
        stand_in.__wrapped__ = student  # type: ignore[attr-defined]
        return stand_in


def importable_now(rel: str) -> bool:
    """May a stand-in import this file's module now? Not a Triton module before ``triton`` itself is imported:
    Triton decides between compiled and interpreted kernels on its first import (chapter 07 sets that up before
    it imports anything), and a stand-in must not decide it for the process. Until then nothing can have launched
    the kernel; a later launch of a kernel still unwritten raises its stub's message, naming the exercise."""
    name = rel.removesuffix(".py").replace("/", ".")
    return name in sys.modules or "triton" in sys.modules or "import triton" not in (ROOT / rel).read_text()


def _order(exercise: str) -> tuple[int, int]:
    chapter, n = exercise[1:].split(".")
    return int(chapter), int(n)


_notebook_stand_ins = StandIns()  # what stand_in() swapped in this process (kept for the process's life)


def stand_in(exercises: Iterable[str] | None = None, quiet: bool = False) -> list[str]:
    """Let the reference stand in for every build exercise that is still an untouched stub, in this process
    only (nothing is written to your files), and say so. Chapters call it through ``setup_notebook()``, so a
    student who skipped an exercise can still run every later chapter. Returns the exercises stood in for."""
    from minfer.exercises.catalog import EXERCISES, get

    if not is_student_build():
        return []  # the repository: every region is the reference
    ids = [e.id for e in EXERCISES if e.kind == "build"] if exercises is None else list(exercises)
    done = _notebook_stand_ins.install(ids, only_stubs=True)
    if not quiet:
        for ex_id in done:
            ex = get(ex_id)
            print(f"{ex_id} ({ex.title}) is not written yet: the reference solution stands in for it in this "
                  f"process. Write it in chapter {ex.chapter:02d}, then check({ex_id!r}) and restart the kernel.")
    return done
