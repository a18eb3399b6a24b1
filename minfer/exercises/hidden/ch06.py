"""Chapter 06, hidden: the swap path decides exactly as the reference, step by step (E6.4)."""

from __future__ import annotations

from minfer.exercises.checks.ch06 import swap_storm
from minfer.exercises.checks.common import same_schedule_as_reference
from minfer.exercises.harness import Tester


def check_swap(t: Tester) -> None:
    with t.case("the same decisions as the reference, step by step: swaps, and host pools that fill up",
                hint="print engine.trace[i].describe() and viz.narrate(engine.trace[i]) around the step named above"):
        for blocks, host in ((12, None), (10, 4), (14, 6)):
            same_schedule_as_reference(t, "E6.4", lambda blocks=blocks, host=host: swap_storm(blocks, host))
