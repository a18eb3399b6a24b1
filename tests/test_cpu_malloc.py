"""``keep_freed_memory``: a step's activations reuse freed memory instead of faulting in fresh pages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minfer.cpu_malloc import keep_freed_memory

# a prefill-sized layer, over and over: a matmul's output, an activation, a product -- blocks of several MB
# freed and allocated again in a different order each time, as a forward pass does
SCRIPT = """
import resource, sys, torch
from minfer.cpu_malloc import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
x, w = torch.randn(512, 576), torch.randn(576, 3072)
with torch.inference_mode():
    for _ in range(3):
        h = x @ w
        y = torch.nn.functional.silu(h) * h
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        h = x @ w
        y = torch.nn.functional.silu(h) * h
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def page_faults_per_layer(mode: str) -> float:
    run = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return float(run.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tunes glibc's malloc; other systems keep theirs")
def test_tuned_malloc_stops_the_page_faults_of_every_step():
    default, tuned = page_faults_per_layer("default"), page_faults_per_layer("tuned")
    assert default > 200, f"expected fresh pages on every step with glibc's defaults, got {default} faults"
    assert tuned < default / 4, f"tuned malloc still faults {tuned} pages per layer (default {default})"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tunes glibc's malloc; other systems keep theirs")
def test_glibc_accepts_every_setting():
    assert keep_freed_memory(), "mallopt refused a setting (a threshold above glibc's maximum?)"
