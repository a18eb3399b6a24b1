"""Bounded memory for a long-running server: the engine keeps a window of recent requests and steps, the server
keeps aggregates (Prometheus counters and histograms), and 20,000 requests leave the process's memory flat."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sys
import time

import pytest
import torch

from conftest import run_checked
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.serve import EngineLoop
from minfer.serve.prometheus import ServerMetrics


def test_windows_keep_the_most_recent_requests_and_steps(tiny):
    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=64, finished_window=3, trace_window=2),
                       model=model, tokenizer=tok)
    for i in range(6):
        engine.add_request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=i + 1, temperature=0, ignore_eos=True))
    final = run_checked(engine)
    assert len(final) == 6  # every request still reported its final output
    assert [r.request_id for r in engine.finished] == ["r3", "r4", "r5"]
    assert len(engine.trace) == 2 and engine.trace[-1].finished == ["r5"]
    with pytest.raises(ValueError, match="finished_window"):
        EngineConfig(finished_window=-1)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.long
@pytest.mark.soak
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_rss_stays_flat_over_20000_served_requests(tiny):
    """20,000 requests through the serving loop (the server minus HTTP), a fifth of them aborted after their
    first token; memory measured after 2,000 (warm-up) and at the end."""
    model, tok = tiny
    engine = LLMEngine(EngineConfig(model="tiny-random", num_blocks=512, max_num_seqs=128,
                                    max_prefill_chunks_per_step=128, finished_window=1000, trace_window=200),
                       model=model, tokenizer=tok)
    loop = EngineLoop(engine)
    metrics = ServerMetrics("tiny-random", engine.max_model_len)
    loop.step_hooks.append(metrics.observe)
    rng = random.Random(0)
    reasons: dict[str, int] = {}
    marks: dict[int, float] = {}

    async def one(i: int) -> None:
        prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(2, 24))]
        params = SamplingParams(max_tokens=rng.randint(1, 6), temperature=rng.choice([0.0, 1.0]), ignore_eos=True)
        leave = rng.random() < 0.2
        async with contextlib.aclosing(loop.generate(f"r{i}", prompt, params)) as outputs:
            async for out in outputs:
                if out.finished:
                    reason = out.outputs[0].finish_reason
                    reasons[reason] = reasons.get(reason, 0) + 1
                elif leave:
                    reasons["left"] = reasons.get("left", 0) + 1
                    break  # closing the stream aborts the request

    async def main(n: int, wave: int) -> None:
        await loop.start()
        for start in range(0, n, wave):
            await asyncio.gather(*(one(i) for i in range(start, start + wave)))
            if start + wave in (2_000, n):
                gc.collect()
                marks[start + wave] = rss_mb()
        await loop.stop()

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        asyncio.run(main(20_000, 500))
    finally:
        torch.set_num_threads(before)
    took = time.perf_counter() - t0
    grew = marks[20_000] - marks[2_000]
    print(f"20,000 requests in {took:.0f} s; RSS {marks[2_000]:.1f} MB after 2,000, {marks[20_000]:.1f} MB after "
          f"20,000 ({grew:+.1f} MB); {reasons}")
    assert reasons["length"] + reasons["left"] == 20_000 and reasons["left"] > 2_000
    assert loop.errors == [] and not engine.has_unfinished_requests()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    assert len(engine.finished) == 1000 and len(engine.trace) == 200 < loop.num_steps
    assert grew < 20, f"RSS grew {grew:.1f} MB over 18,000 requests"
