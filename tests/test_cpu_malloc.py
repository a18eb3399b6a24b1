"""``keep_freed_memory``: an engine's steps reuse freed memory instead of faulting in fresh pages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minfer.cpu_malloc import keep_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="tunes glibc's malloc; other systems keep their own allocator")

# An engine on a random model of SmolLM2's widths (4 layers), serving rounds of 8 prompts of 200 tokens:
# a step's activations are several MB, freed and allocated again every layer. Page faults are counted
# over the rounds after the first, so building the engine (its KV cache is touched once) is not counted.
# "default" holds glibc's initial thresholds fixed: left alone, glibc sometimes raises its mmap threshold
# by itself after freeing a large block, sometimes not (two runs of the very same script measured 109 and
# 16,723 faults per round), which would make the comparison a coin toss.
SCRIPT = """
import resource, sys
import minfer.cpu_malloc
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.model.loader import tiny_random_config, tiny_random_model
from minfer.model.tokenizer import ByteTokenizer
if sys.argv[1] == "default":
    minfer.cpu_malloc.keep_freed_memory.__wrapped__(128 << 10, 128 << 10, 0)  # glibc's initial thresholds, fixed
    minfer.cpu_malloc.keep_freed_memory = lambda *args, **kwargs: False  # the engine then leaves malloc alone
cfg = tiny_random_config(hidden_size=576, intermediate_size=1536, num_layers=4, num_heads=9, num_kv_heads=3,
                         head_dim=64)
engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=256, max_num_seqs=8, max_prefill_chunks_per_step=8),
                   model=tiny_random_model(cfg), tokenizer=ByteTokenizer())
def serve(round):
    for i in range(8):
        engine.add_request(f"{round}-{i}", [3 + (7 * i + j) % 300 for j in range(200)],
                           SamplingParams(max_tokens=4, ignore_eos=True))
    engine.run()
serve(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for round in range(1, 4):
    serve(round)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3)
"""


def page_faults_per_round(mode: str) -> float:
    run = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return float(run.stdout.split()[-1])


@pytest.mark.long  # two engines in processes of their own
def test_an_engine_stops_faulting_in_fresh_pages_every_step():
    default, tuned = page_faults_per_round("default"), page_faults_per_round("tuned")
    assert default > 5_000, f"expected fresh pages on every step with glibc's defaults, got {default:.0f} faults"
    assert tuned < default / 10, f"tuned malloc still faults {tuned:.0f} pages per round (default {default:.0f})"


def test_glibc_accepts_every_setting():
    assert keep_freed_memory(), "mallopt refused a setting (a threshold above glibc's maximum?)"
