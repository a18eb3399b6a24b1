"""Command line: ``python -m minfer.exercises {status,check,reveal,student,grade} ...`` (the Makefile's
``check``, ``student`` and ``grade`` targets call this)."""

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
    sub.add_parser("status", help="every exercise, and where you stand")
    c = sub.add_parser("check", help="check one exercise (or --all build exercises)")
    c.add_argument("exercise", nargs="?")
    c.add_argument("--all", action="store_true", help="every build exercise, one after another")
    c.add_argument("--answer", type=float, help="your prediction, for a predict exercise")
    c.add_argument("--json", action="store_true", help="print the result as one JSON line")
    c.add_argument("--timeout", type=float, default=None, help="seconds before a check is stopped")
    r = sub.add_parser("reveal", help="write an exercise's reference solution into your files")
    r.add_argument("exercise")
    s = sub.add_parser("student", help="write the student build")
    s.add_argument("out", nargs="?", default="build/student")
    g = sub.add_parser("grade", help="run every build check on each submission and print a table")
    g.add_argument("submissions", nargs="+", type=Path)
    g.add_argument("--csv", type=Path)
    args = p.parse_args(argv)

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

        b = build_student_copy(ROOT, Path(args.out))
        print(f"student build in {b.path}: {b.files} files, {b.regions} exercise regions stubbed, "
              f"{b.solution_cells} solution cells removed and {b.cleared_outputs} outputs cleared in "
              f"{b.notebooks} notebooks. There: make lab (the course), make test, make check EX=E3.1")
        return 0
    if args.command == "grade":
        from minfer.exercises.grade import grade

        grade([p for p in args.submissions if p.is_dir()], args.csv)
        return 0

    _prepare_triton()
    import minfer
    from minfer.exercises.catalog import EXERCISES
    from minfer.exercises.checking import CHECK_TIMEOUT, run_exercise

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
    result = run_exercise(args.exercise, args.answer, timeout)
    print(json.dumps(result.to_dict()) if args.json else result.report())
    return 0 if result.status in ("passed", "written", "unanswered") else 1


if __name__ == "__main__":
    sys.exit(main())
