"""The capstone's arena is reproducible, its pass mark separates designs, and the guide states its true scores."""

from __future__ import annotations

import re

from minfer.capstone import PASS_GAIN, SAMPLE_SEED, arena, capstone_workload, score
from minfer.exercises.standin import ROOT


def test_the_workload_family_is_reproducible_and_its_members_differ():
    assert capstone_workload(SAMPLE_SEED) == capstone_workload(SAMPLE_SEED)
    assert capstone_workload(SAMPLE_SEED) != capstone_workload(SAMPLE_SEED + 1)
    items = capstone_workload(SAMPLE_SEED)
    long_docs = [w for w in items if w.prompt_len >= 2000]
    long_gens = [w for w in items if w.output_len >= 800]
    assert len(items) == 500 and 0.1 < len(long_docs) / 500 < 0.3 and 0.04 < len(long_gens) / 500 < 0.16


def test_the_pass_mark_separates_first_come_first_served_from_the_reference_and_the_guide_says_so():
    fcfs, reference = score("fcfs"), score("capstone")
    assert reference.goodput >= PASS_GAIN * fcfs.goodput, "the reference must pass its own capstone"
    assert fcfs.preemptions > 0 and reference.preemptions > 0, "the arena is meant to preempt"
    engine = arena("capstone")
    assert engine.config.policy == "capstone" and engine.has_unfinished_requests()
    guide = (ROOT / "docs/instructor.md").read_text()
    stated = re.search(r"holds them to what this guide says: about ([\d.]+), ([\d.]+) and ([\d.]+) requests", guide)
    assert stated, "the guide states the sample's scores"
    sjf = score("sjf")
    for said, measured in zip(map(float, stated.groups()), (fcfs, sjf, reference)):
        assert abs(said - measured.goodput) <= 0.05, f"the guide says {said}, the arena gives {measured}"
