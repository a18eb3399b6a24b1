"""One graded check, in a process of its own: ``python -m minfer.exercises.graded_run EX BODIES RESULT TIMEOUT``.

``grade.py`` starts it in the instructor's checkout for each student and exercise. It imports the instructor's
package and every checker (public and hidden) first, swaps the student's region bodies (read from ``BODIES``)
into the package in place of the reference (``StandIns.install_bodies``), runs the exercise's check, and writes
the verdict to ``RESULT``. Nothing is read from standard output, where the student's code may print.

The student's code runs in this process, so before the check it takes a fingerprint of the harness: every
function and class of ``minfer.exercises`` (checkers included), the methods of its classes, and the builtins.
A check after which any of them is no longer the same object is ``tampered``, whatever it claims.
"""

from __future__ import annotations

import builtins
import json
import pkgutil
import sys
from importlib import import_module
from pathlib import Path

Fingerprint = dict[tuple[str, str], int]


def harness_modules() -> list[str]:
    """Every module of ``minfer.exercises``, the checkers and hidden cases included (imported now)."""
    import minfer.exercises as package

    names = []
    for info in pkgutil.walk_packages(package.__path__, "minfer.exercises."):
        if info.name.endswith(("__main__", "graded_run")):
            continue
        import_module(info.name)
        names.append(info.name)
    return names


def fingerprint(modules: list[str]) -> Fingerprint:
    """The identity of everything the verdict depends on besides the code under test."""
    out: Fingerprint = {("builtins", k): id(v) for k, v in vars(builtins).items()}
    for name in modules:
        for attr, value in vars(sys.modules[name]).items():
            if callable(value):
                out[(name, attr)] = id(value)
                if isinstance(value, type) and value.__module__ == name:
                    for member, inner in vars(value).items():
                        out[(f"{name}.{attr}", member)] = id(inner)
    return out


def changed(before: Fingerprint, after: Fingerprint) -> list[str]:
    return sorted(f"{owner}.{name}" for (owner, name), ident in before.items() if after.get((owner, name)) != ident)


def main(argv: list[str]) -> int:
    ex_id, bodies_path, result_path, timeout = argv[0], Path(argv[1]), Path(argv[2]), float(argv[3])
    from minfer.exercises.__main__ import _prepare_triton

    _prepare_triton()
    from minfer.exercises.checking import run_exercise
    from minfer.exercises.harness import CheckResult
    from minfer.exercises.standin import Key, StandIns

    modules = harness_modules()
    bodies: dict[Key, str] = {(k[0], k[1], k[2], k[3]): body for k, body in json.loads(bodies_path.read_text())}
    before = fingerprint(modules)
    with StandIns() as swaps:
        try:
            swaps.install_bodies(bodies)
        except SyntaxError as e:
            result = CheckResult(ex_id, "build", "failed", case="the code compiles", message=f"SyntaxError: {e}")
        else:
            result = run_exercise(ex_id, timeout=timeout)
    if moved := changed(before, fingerprint(modules)):
        result = CheckResult(ex_id, "build", "tampered",
                             message=f"the harness changed while the check ran: {', '.join(moved[:5])}")
    result_path.write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
