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
import marshal
import sys
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minfer.exercises.regions import Region, find_regions, replace_bodies, unit_span, units

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository (or student build) root
STUDENT_BUILD = Path(__file__).resolve().parent / "student_build.json"  # written into student builds only
SOLUTIONS = Path(__file__).resolve().parent / "solutions.json"  # the self-study edition: the reference's source
COMPILED = Path(__file__).resolve().parent / "reference.marshal"  # the class handout: compiled, no source

Key = tuple[str, str, str, int]  # (exercise, file, unit, index)
Bodies = dict[tuple[str, str, int], str]  # (exercise, unit, index) -> a region's body
Compiled = dict[tuple[str, str], tuple[str, types.CodeType]]  # (file, unit) -> (exercise, the unit's code)


def is_student_build() -> bool:
    return STUDENT_BUILD.exists()


def reference_bodies() -> dict[Key, str]:
    """The reference body of every region, as source: from ``solutions.json`` in a self-study build, none in a
    class handout, else from the package's own files (the repository is the reference)."""
    if is_student_build():
        if not SOLUTIONS.exists():
            return {}
        data = json.loads(SOLUTIONS.read_text())
        return {(r["exercise"], r["file"], r["unit"], r["index"]): r["body"] for r in data["regions"]}
    return {(r.exercise, r.rel, r.unit, r.index): r.body for r in find_regions(ROOT)}


def compiled_references() -> Compiled:
    """The class handout's stand-ins: each unit holding a region, with the reference bodies, compiled to a code
    object by ``make student`` -- they run like the reference, but the handout holds no reference source to
    read or reveal. (None for a Triton kernel, which Triton compiles from its source; none when this Python is
    not the one that wrote them: compiled code is specific to a Python version.)"""
    if not COMPILED.exists():
        return {}
    data = marshal.loads(COMPILED.read_bytes())
    return data["units"] if tuple(data["python"]) == sys.version_info[:2] else {}


def compile_unit(root: Path, rel: str, unit: str, bodies: Bodies) -> tuple[str, str, types.CodeType]:
    """The function ``unit`` of ``root/rel`` with its regions' bodies replaced by ``bodies``, compiled as it would
    be in its module: (exercise, source, code)."""
    path = root / rel
    text = replace_bodies(path.read_text(), path, rel, bodies)
    node = dict(units(ast.parse(text)))[unit]
    first, last = unit_span(node)
    source = textwrap.dedent("".join(text.splitlines(keepends=True)[first - 1 : last]))
    exercise = next(iter(bodies))[0]
    filename = f"<reference for {exercise}: {rel} {unit}>"
    code = compile(source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    return exercise, source, code


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
        compiled = {} if refs else compiled_references()
        todo: dict[tuple[str, str], list[Region]] = {}
        for r in find_regions(ROOT):
            if r.exercise not in wanted or (r.rel, r.unit) in self.units:
                continue
            if key(r) in refs:
                differs = r.body != refs[key(r)]
            elif (r.rel, r.unit) in compiled:
                differs = True  # no source to compare with: whatever is there is set aside
            else:
                continue
            if always or (r.is_stub if only_stubs else differs):
                todo.setdefault((r.rel, r.unit), []).append(r)
        done = []
        for (rel, unit), regions in todo.items():
            if not importable_now(rel):
                continue
            if refs:
                self._swap_unit(rel, unit, {(r.exercise, r.unit, r.index): refs[key(r)] for r in regions})
            else:
                self._install_code(rel, unit, *compiled[(rel, unit)])
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
        self.install_bodies({key(region): body})

    def install_bodies(self, bodies: dict[Key, str]) -> None:
        """Run the given region bodies (source text, any indentation) in place of this copy's, in this process:
        how a grade runs a student's code inside the instructor's package -- only the regions' bodies are
        taken from the student; every other line is this copy's."""
        by_unit: dict[tuple[str, str], dict[tuple[str, str, int], str]] = {}
        indents = {key(r): r.indent for r in find_regions(ROOT)}
        for (exercise, rel, unit, index), body in bodies.items():
            if (exercise, rel, unit, index) not in indents:
                raise ValueError(f"no region {index} of {exercise} in {rel} {unit}")
            indent = indents[(exercise, rel, unit, index)]
            text = "".join(indent + line if line.strip() else line
                           for line in textwrap.dedent(body).strip("\n").splitlines(keepends=True)) + "\n"
            by_unit.setdefault((rel, unit), {})[(exercise, unit, index)] = text
        for (rel, unit), unit_bodies in by_unit.items():
            self._swap_unit(rel, unit, unit_bodies)
            self.units.add((rel, unit))

    def _swap_unit(self, rel: str, unit: str, bodies: Bodies) -> None:
        exercise, source, code = compile_unit(ROOT, rel, unit, bodies)
        filename = code.co_filename  # tracebacks and Triton read the source from here
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        self._install_code(rel, unit, exercise, code)

    def _install_code(self, rel: str, unit: str, exercise: str, code: types.CodeType) -> None:
        """Define the unit from ``code`` in its module's namespace and put it where the old function was."""
        module = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
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
    return name in sys.modules or "triton" in sys.modules or not is_triton_module(ROOT / rel)


def is_triton_module(path: Path) -> bool:
    """Does this file define Triton kernels (which Triton compiles from their source)?"""
    return "import triton" in path.read_text()


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
    if not reference_bodies() and not compiled_references():  # compiled by another Python: nothing can stand in
        todo = [e for e in ids if e in {r.exercise for r in find_regions(ROOT) if r.is_stub}]
        if todo and not quiet:
            print(f"Not written yet: {', '.join(sorted(todo, key=_order))}. This Python cannot run the copy's "
                  "compiled reference (another version made it), so code that reaches one of them stops at its "
                  "stub, naming it.")
        return []
    done = _notebook_stand_ins.install(ids, only_stubs=True)
    if not quiet:
        for ex_id in done:
            ex = get(ex_id)
            print(f"{ex_id} ({ex.title}) is not written yet: the reference solution stands in for it in this "
                  f"process. Write it in chapter {ex.chapter:02d}, then check({ex_id!r}) and restart the kernel.")
    return done
