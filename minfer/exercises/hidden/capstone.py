"""The capstone's graded workloads: members of the sample's family the student never sees."""

from __future__ import annotations

from minfer.exercises.checks.capstone import goodput_on
from minfer.exercises.harness import Tester

GRADED_SEEDS = (1009, 2027)


def check_capstone(t: Tester) -> None:
    for i, seed in enumerate(GRADED_SEEDS, 1):
        goodput_on(t, seed, f"graded workload {i} of {len(GRADED_SEEDS)}", check_every_step=False)
