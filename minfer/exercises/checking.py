"""Running a check: in a fresh process from a notebook, in this one from the command line.

``check("E3.1")`` in a notebook starts ``python -m minfer.exercises check E3.1 --json`` in the repository
root. A fresh interpreter imports the package from the files as they are now -- the student's latest
edit, even if the notebook imported an older version -- and nothing the check does can touch the
notebook's engine. ``run_exercise`` is what that process runs: the reference stands in for every *other*
exercise (each check grades one exercise only: for those not written yet, and for the student's own, set
aside so that a bug there cannot fail this check), the checker runs under a time limit, and every swap is
undone afterwards, so ``check --all`` can run every exercise in one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path

from minfer.exercises.catalog import EXERCISES, Exercise, get
from minfer.exercises.harness import CheckResult, Tester, package_frames, stub_in
from minfer.exercises.progress import build_states, record
from minfer.exercises.standin import ROOT, StandIns

CHECK_TIMEOUT = 120.0  # seconds; every check takes well under 30 on a 2-core CPU -- more means a loop that never ends


class CheckTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``CheckTimeout`` in the code below after ``seconds`` (main thread of a Unix process only)."""
    if not hasattr(signal, "SIGALRM") or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise CheckTimeout(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def checker_of(ex: Exercise):
    if ex.checker is None:
        raise ValueError(f"{ex.id} is a {ex.kind} exercise: nothing to run")
    module, function = ex.checker.split(":")
    return getattr(import_module(f"minfer.exercises.checks.{module}"), function)


def hidden_checker_of(ex: Exercise):
    """The instructor's further cases for a build exercise: the function of the same name in
    ``minfer.exercises.hidden.<module>``, or ``None`` where there is none -- a student build ships no
    ``hidden`` package, so a student's own check runs the public cases only and the grade runs both."""
    if ex.kind != "build" or ex.checker is None:
        return None
    module, function = ex.checker.split(":")
    name = f"minfer.exercises.hidden.{module}"
    try:
        found = import_module(name)
    except ModuleNotFoundError as e:
        if e.name in ("minfer.exercises.hidden", name):
            return None
        raise
    return getattr(found, function, None)


def run_exercise(exercise_id: str, answer: float | None = None, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Check one exercise in this process and return the result (never raises for a failing check)."""
    ex = get(exercise_id)
    result = CheckResult(ex.id, ex.kind, "passed", title=ex.title)
    if ex.kind == "explain":
        result.status = "written"
        return result
    if ex.kind == "predict" and answer is None:
        result.status = "unanswered"
        return result
    others = [e.id for e in EXERCISES if e.kind == "build" and e.id != ex.id]
    t = Tester()
    start = time.perf_counter()
    with StandIns() as swaps:
        swaps.install(others, only_stubs=False)  # the reference for everything but ex
        try:
            with time_limit(timeout):
                if ex.kind == "build":
                    checker_of(ex)(t)
                    if (hidden := hidden_checker_of(ex)) is not None:
                        result.hidden_cases = True
                        hidden(t)
                elif answer is not None:
                    m = checker_of(ex)()
                    result.prediction, result.measured, result.unit = float(answer), m.value, m.unit
                    result.tolerance, result.explain = m.tolerance_text(), m.explain
                    result.status = "passed" if m.accepts(float(answer)) else "failed"
        except CheckTimeout as e:
            result.status, result.message = "timeout", f"{e}: an endless loop?"
            result.where = package_frames(e)
        except Exception as e:  # the student's code failed a case (or raised); a measurement that fails is an error
            result.status = "failed" if ex.kind == "build" else "error"
            result.stub = stub_in(e)
            result.message = failure_message(e)
            result.where = package_frames(e)
        ran = [e for e in swaps.exercises if e in swaps.ran]  # the stand-ins this check called
    states = build_states()  # not started: the stub; else the student's own code, set aside for this check
    result.stand_ins = [e for e in ran if states.get(e) == "not started"]
    result.set_aside = [e for e in ran if states.get(e) != "not started"]
    result.case, result.hint = (t.case_name, t.hint) if result.status != "passed" else (None, "")
    result.cases_passed = len(t.passed)
    result.notes = list(t.notes)
    result.seconds = time.perf_counter() - start
    return result


def failure_message(e: BaseException) -> str:
    """An assertion's own message; a bare ``assert``: its line in the checker; anything else: type and text."""
    if isinstance(e, AssertionError):
        if str(e):
            return str(e)
        lines = [fs.line for fs in traceback.extract_tb(e.__traceback__) if "exercises" in fs.filename]
        return f"failed: {lines[-1].strip()}" if lines and lines[-1] else "an assertion failed"
    return f"{type(e).__name__}: {e}"


def check(exercise: str, prediction: float | None = None, *, timeout: float = CHECK_TIMEOUT,
          quiet: bool = False) -> CheckResult:
    """Check an exercise against the package's files as they are now, in a fresh Python process, and print
    what happened: a pass, or the first failing case with a hint. For a *predict* exercise pass your number:
    ``check("E3.2", 4)``. Returns the result (true if it passed); a student build also records it in its
    progress file, which ``status()`` reads."""
    ex = get(exercise)
    stale = stale_modules(ex)  # before the check's own import rewrites the bytecode cache
    if ex.kind == "explain":
        result = run_exercise(ex.id)
    else:
        cmd = [sys.executable, "-m", "minfer.exercises", "check", ex.id, "--json", "--timeout", str(timeout)]
        if prediction is not None:
            cmd += ["--answer", repr(float(prediction))]
        result = run_subprocess(cmd, ROOT, timeout + 60, ex)
        record(result)
    if not quiet:
        print(result.report())
        if stale:
            print(f"(you edited {', '.join(stale)} after this notebook imported it: restart the kernel to run "
                  "your new code here too)")
    return result


def subprocess_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_subprocess(cmd: list[str], root: Path, timeout: float, ex: Exercise | None = None) -> CheckResult:
    """Run a ``--json`` check command in ``root`` and read its result back."""
    ex_id, kind, title = (ex.id, ex.kind, ex.title) if ex else ("", "", "")
    try:
        proc = subprocess.run(cmd, cwd=root, env=subprocess_env(root), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return CheckResult(ex_id, kind, "timeout", title, message=f"no answer after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return CheckResult.from_dict(json.loads(line))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
    return CheckResult(ex_id, kind, "error", title,
                       message="the package did not import or the check crashed:\n" + "\n".join(tail))


def stale_modules(ex: Exercise) -> list[str]:
    """Files of ``ex``'s regions that changed after this process imported them (their module's bytecode
    cache is older than the source: Python rewrites it on every import of a changed file)."""
    from minfer.exercises.regions import find_regions

    out = []
    for rel in sorted({r.rel for r in find_regions(ROOT) if r.exercise == ex.id}):
        name = rel.removesuffix(".py").replace("/", ".")
        mod = sys.modules.get(name)
        cached = getattr(mod, "__cached__", None)
        if mod is not None and cached and os.path.exists(cached):
            if os.path.getmtime(ROOT / rel) > os.path.getmtime(cached):
                out.append(rel)
    return out
