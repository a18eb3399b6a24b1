"""The checkers of the newer exercises catch the wrong answers of ``exercise_mutants_more`` and pass its other right
answers. Each runs in place of the reference in this process (``StandIns.try_body``: no file is edited)."""

from __future__ import annotations

import pytest
from exercise_mutants_more import ALTERNATIVES, MUTANTS, Alternative, Mutant

from minfer.exercises import StandIns, run_exercise
from minfer.exercises.regions import find_regions
from minfer.exercises.standin import ROOT, is_student_build

pytestmark = pytest.mark.skipif(is_student_build(), reason="needs the reference bodies")


def reference_body(exercise: str, unit: str, index: int) -> str:
    (region,) = [r for r in find_regions(ROOT) if (r.exercise, r.unit, r.index) == (exercise, unit, index)]
    return region.body


def mutated(m: Mutant) -> str:
    body = reference_body(m.exercise, m.unit, m.index)
    for old, new in m.edits:
        assert body.count(old) == 1, f"{m.name}: {old!r} occurs {body.count(old)} times in the reference body"
        body = body.replace(old, new)
    return body


def test_every_new_build_exercise_has_three_mutants_and_an_alternative():
    for exercise in ("E6.4", "E8.4", "E9.3", "E10.4", "E11.1", "E12.1", "E12.2", "E12.3"):
        assert sum(m.exercise == exercise for m in MUTANTS) >= 3, exercise
        assert any(a.exercise == exercise for a in ALTERNATIVES), exercise


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: f"{m.exercise} {m.name}")
def test_checker_catches_wrong_solution(m: Mutant):
    body = mutated(m)
    with StandIns() as swap:
        swap.try_body(m.exercise, m.unit, body, m.index)
        result = run_exercise(m.exercise, timeout=60)
    assert result.status == "failed", f"{m.name}: the check did not fail ({result.status})\n{result.report()}"
    assert result.stub is None, f"{m.name}: failed on a stub, not on the wrong code\n{result.report()}"
    assert m.case in (result.case or ""), f"{m.name}: caught at the wrong case\n{result.report()}"


@pytest.mark.parametrize("a", ALTERNATIVES, ids=lambda a: f"{a.exercise} {a.name}")
def test_checker_passes_another_right_solution(a: Alternative):
    with StandIns() as swap:
        swap.try_body(a.exercise, a.unit, a.body, a.index)
        result = run_exercise(a.exercise, timeout=60)
    assert result.passed, f"{a.name}: a correct answer failed\n{result.report()}"
