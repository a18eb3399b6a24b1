"""Command line: ``python -m minfer.exercises {list,show,status,check,reveal,student,grade} ...`` (the Makefile's
``check``, ``student`` and ``grade`` targets call this).

    python -m minfer.exercises list            every exercise: id, kind, chapter, difficulty, time, title
    python -m minfer.exercises show E4.1       one exercise's task, where its code goes, how to check it
    python -m minfer.exercises check E3.1      check your code (a prediction: check E3.2 4)
    python -m minfer.exercises status          how far you are: the files, and your latest check of each

``check`` exits 0 when the exercise passes (or has nothing to run), 1 when it does not pass yet -- so scripts and
CI can tell -- and 2 on a usage error. Outside ``--json`` (the form ``check()`` in a notebook and grading use),
a student build records every check in its progress file (``progress.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _prepare_triton() -> None:
    """Triton picks interpreted or compiled mode when first imported: without a GPU, the interpreter."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minfer.exercises", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every exercise: id, kind, chapter, difficulty, time, title")
    sh = sub.add_parser("show", help="an exercise's task, where its code goes, how to check it")
    sh.add_argument("exercise")
    sub.add_parser("status", help="every exercise, and where you stand")
    c = sub.add_parser("check", help="check one exercise (or --all build exercises)")
    c.add_argument("exercise", nargs="?")
    c.add_argument("number", nargs="?", type=float, help="your prediction, for a predict exercise: check E3.2 4")
    c.add_argument("--all", action="store_true", help="every build exercise, one after another")
    c.add_argument("--answer", type=float, help="your prediction (the same as the number after the exercise)")
    c.add_argument("--json", action="store_true", help="print the result as one JSON line")
    c.add_argument("--timeout", type=float, default=None, help="seconds before a check is stopped")
    r = sub.add_parser("reveal", help="write an exercise's reference solution into your files")
    r.add_argument("exercise")
    s = sub.add_parser("student", help="write the student build (the class handout, or --self-study)")
    s.add_argument("out", nargs="?", default="build/student")
    s.add_argument("--self-study", action="store_true",
                   help="ship the reference solutions too, for reveal and stand-ins (no one grades)")
    sub.add_parser("grade", add_help=False, help="grade submissions from this (the instructor's) copy: "
                   "python -m minfer.exercises.grade --help")
    args, rest = p.parse_known_args(argv)
    if args.command != "grade" and rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")

    if args.command in ("list", "show"):
        from minfer.exercises.catalog import get
        from minfer.exercises.describe import describe, listing

        try:
            print(listing() if args.command == "list" else describe(get(args.exercise)))
        except ValueError as e:
            p.error(str(e))
        return 0
    if args.command == "status":
        from minfer.exercises.progress import status

        status()
        return 0
    if args.command == "reveal":
        from minfer.exercises.reveal import reveal

        reveal(args.exercise)
        return 0
    if args.command == "student":
        from minfer.exercises.standin import ROOT
        from minfer.exercises.student import build_student_copy

        b = build_student_copy(ROOT, Path(args.out), self_study=args.self_study)
        print(f"student build ({b.edition} edition) in {b.path}: {b.files} files, {b.regions} exercise regions "
              f"stubbed, {b.solution_cells} solution cells removed and {b.cleared_outputs} outputs cleared in "
              f"{b.notebooks} notebooks. There: make lab (the course), make test, make check EX=E3.1, "
              "python -m minfer.exercises list")
        return 0
    if args.command == "grade":
        from minfer.exercises.grade import main as grade_main

        return grade_main(rest)

    from minfer.exercises.catalog import EXERCISES, get

    answer = prediction_of(args, p)
    _prepare_triton()
    import minfer
    from minfer.exercises.checking import CHECK_TIMEOUT, run_exercise
    from minfer.exercises.progress import record

    timeout = args.timeout or CHECK_TIMEOUT
    if args.all or not args.exercise:
        results = [run_exercise(e.id, timeout=timeout) for e in EXERCISES if e.kind == "build"]
        if args.json:
            print(json.dumps({"package": str(Path(minfer.__file__).parent), "results": [x.to_dict() for x in results]}))
        else:
            for x in results:
                print(x.report())
            print(f"{sum(x.passed for x in results)} of {len(results)} build exercises pass")
        return 0 if all(x.passed for x in results) else 1
    result = run_exercise(get(args.exercise).id, answer, timeout)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.report())
        record(result)
    return 0 if result.status in ("passed", "written", "unanswered") else 1


def prediction_of(args: argparse.Namespace, p: argparse.ArgumentParser) -> float | None:
    """The number given after a predict exercise's id (``check E3.2 4``) or with ``--answer``; a usage error for
    an answer to anything else, or two different answers."""
    from minfer.exercises.catalog import get

    if args.all and (args.exercise or args.number is not None or args.answer is not None):
        p.error("check --all checks every build exercise: give it no exercise and no answer")
    if args.exercise is None:
        return None
    try:
        ex = get(args.exercise)
    except ValueError as e:
        p.error(str(e))
    if args.number is not None and args.answer is not None and args.number != args.answer:
        p.error(f"two answers for {ex.id}: {args.number:g} and --answer {args.answer:g}")
    answer = args.answer if args.answer is not None else args.number
    if answer is not None and ex.kind != "predict":
        p.error(f"{ex.id} is a {ex.kind} exercise: it takes no number (only predict exercises do)")
    return answer


if __name__ == "__main__":
    sys.exit(main())
