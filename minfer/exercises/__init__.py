"""Exercises: the course you do, not only read.

Chapters 01-14 set three kinds of exercises, numbered ``E<chapter>.<n>`` (``catalog.py`` lists them all):
*build* a real piece of the engine between ``# BEGIN EXERCISE`` / ``# END EXERCISE`` markers in the package,
*predict* a number before the chapter measures it, *explain* in a few sentences.

    from minfer.exercises import check, reveal, status
    check("E3.1")          # run E3.1's cases against your code (a fresh process); prints the verdict
    check("E3.2", 4)       # a prediction: compared with the measured value, with the reason for the gap
    reveal("E3.1")         # self-study edition: write the reference into your file (your attempt is saved first)
    status()               # every exercise and where you stand

From a shell: ``make check EX=E3.1`` (or ``python -m minfer.exercises check E3.1``; a prediction: ``check E3.2 4``),
and ``python -m minfer.exercises list`` / ``show E3.1`` / ``status``. ``make student`` makes
the copy students work in (``student.py``); ``stand_in()`` lets the reference run for exercises a student
has not written yet, so later chapters still run (``standin.py``). The instructor grades from the full
repository: ``python -m minfer.exercises.grade COPY...`` runs the public and hidden cases (``hidden/``) against the
bodies of each copy's regions (``grade.py``, ``graded_run.py``).
"""

from minfer.exercises.catalog import EXERCISES, Exercise, get
from minfer.exercises.checking import check, run_exercise
from minfer.exercises.harness import CheckResult, Measurement, Tester
from minfer.exercises.progress import status
from minfer.exercises.reveal import reveal
from minfer.exercises.standin import StandIns, stand_in

__all__ = ["EXERCISES", "CheckResult", "Exercise", "Measurement", "StandIns", "Tester", "check", "get", "reveal",
           "run_exercise", "stand_in", "status"]
