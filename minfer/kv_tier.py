"""What a host tier for the prefix cache buys: hit rate and TTFT against its size, on multi-turn chats.

Each turn of a chat resends the whole conversation, so its prompt is mostly the previous turn's: a prefix cache
should serve it. But between two turns of one chat, the other chats' turns run and fill the device's KV pool;
when the pool is small against the chats in flight, the conversation's blocks are evicted before it comes back,
and the next turn computes its whole history again. A host tier (``EngineConfig.host_cache_blocks``,
``kv/host_cache.py``) keeps those blocks in host memory and copies them back on the hit: TTFT falls as the
tier grows, until it holds every conversation (then more host memory buys nothing).

``sweep`` runs the same seeded chats once per tier size, on any engine config: the real model (the copies are
memcpy within the CPU's memory, priced by the clock) or the simulator (priced over the hardware's host link,
PCIe on a GPU). ``python -m minfer.kv_tier`` prints the table; ``--sim H100-SXM`` for a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from minfer.config import SPEED_UPS, EngineConfig
from minfer.engine import LLMEngine
from minfer.metrics import summarize
from minfer.workload import WorkItem, multi_turn_chat, submit


@dataclass(slots=True, frozen=True)
class TierPoint:
    """One run of the chats with a host tier of ``host_blocks`` blocks (0: none)."""

    host_blocks: int
    prefix_hit_rate: float  # prompt tokens served by either tier / prompt tokens
    host_hit_rate: float  # ... of which by the host tier (blocks copied back)
    ttft_p50: float  # seconds
    ttft_mean: float
    prompt_tokens_computed: int  # prompt tokens the engine computed (the rest came from a cache)
    copied_bytes: int  # KV bytes the tier moved over the host link, both ways
    evictions: int  # cached blocks the device pool evicted
    outputs_digest: str  # of every request's generated tokens: equal digests, equal outputs (the tier is exact)

    def row(self) -> str:
        return (f"{self.host_blocks:>11} {self.prefix_hit_rate:>8.1%} {self.host_hit_rate:>8.1%} "
                f"{self.ttft_p50 * 1e3:>12.1f} {self.ttft_mean * 1e3:>13.1f} {self.prompt_tokens_computed:>15} "
                f"{self.copied_bytes / 2**20:>10.1f}")


TABLE_HEADER = (f"{'host blocks':>11} {'hit rate':>8} {'  of it host':>8} {'TTFT p50 ms':>12} {'TTFT mean ms':>13} "
                f"{'prompt computed':>15} {'copied MiB':>10}")


def chats(num_conversations: int = 12, turns: int = 3, seed: int = 0, **shape: Any) -> list[WorkItem]:
    """The sweep's default traffic: ``multi_turn_chat``, answers of 16 tokens unless ``shape`` says otherwise."""
    return multi_turn_chat(num_conversations, turns, seed=seed, **{"answer_len": 16} | shape)


def run_point(config: EngineConfig, host_blocks: int, items: Sequence[WorkItem], model: Any = None,
              tokenizer: Any = None) -> TierPoint:
    """``items`` on an engine of ``config`` with a host tier of ``host_blocks`` blocks."""
    cfg = replace(config, enable_prefix_caching=True, host_cache_blocks=host_blocks)
    engine = LLMEngine(cfg, model=model, tokenizer=tokenizer)
    submit(engine, items)
    engine.run()
    s = summarize(engine.finished)
    loaded = sum(n for t in engine.trace for n in t.loaded_blocks.values())
    host_hits = loaded * cfg.block_size / s.prompt_tokens if s.prompt_tokens else 0.0
    computed = sum(t.num_prefill_tokens for t in engine.trace)
    outputs = sorted((r.request_id, r.output_token_ids) for r in engine.finished)
    return TierPoint(host_blocks, s.prefix_hit_rate, host_hits, s.ttft.p50, s.ttft.mean, computed,
                     sum(t.swap_bytes for t in engine.trace), engine.block_pool.num_evictions,
                     hashlib.sha256(repr(outputs).encode()).hexdigest()[:16])


def sweep(config: EngineConfig, sizes: Sequence[int], items: Sequence[WorkItem] | None = None, model: Any = None,
          tokenizer: Any = None, on_point: Callable[[TierPoint], None] | None = None) -> list[TierPoint]:
    """One run per host-tier size, the same chats each time (``chats()`` by default)."""
    items = chats() if items is None else items
    points = []
    for size in sizes:
        points.append(run_point(config, size, items, model, tokenizer))
        if on_point is not None:
            on_point(points[-1])
    return points


def format_sweep(points: Sequence[TierPoint]) -> str:
    return "\n".join([TABLE_HEADER, *(p.row() for p in points)])


def on_this_cpu(model: str = "smollm2-135m") -> tuple[EngineConfig, list[WorkItem], list[int]]:
    """The real model's experiment: 8 chats of 4 turns whose every turn arrives together (``rate=None``; a turn waits
    ``think_time`` after the last, far longer than a wave takes, so the schedule does not depend on the clock and the
    hit counts repeat run after run), on a device pool of 160 blocks that 4 running requests mostly fill. The model runs
    as ``LLM()`` runs it (``SPEED_UPS``: the fastest products and pointwise kernels this machine has), so the copies
    are weighed against the layers a server would run, and the sweep is quicker than on the plain model (chapter 15
    runs it)."""
    items = chats(8, 4, user_median=96, answer_len=8, rate=None, think_time=600.0)
    options: dict[str, Any] = {**SPEED_UPS, "model": model, "num_blocks": 160, "max_num_seqs": 4}
    return EngineConfig(**options), items, [0, 32, 128, 512]


def on_a_gpu(hardware: str = "H100-SXM", model: str = "llama-3-8b") -> tuple[EngineConfig, list[WorkItem], list[int]]:
    """The simulated experiment: 64 chats of 4 turns arriving at 4 per second, a 512-token system prompt, on a pool
    of 400 blocks (6,400 tokens); the copies priced over the hardware's host link."""
    items = chats(64, 4, system_len=512, user_median=64, answer_len=64, rate=4.0)
    return EngineConfig(executor="sim", hardware=hardware, model=model, num_blocks=400), items, [0, 250, 1000, 4000]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m minfer.kv_tier", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", metavar="HARDWARE", help="simulate this hardware (e.g. H100-SXM), not the real model")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="host-tier sizes in blocks")
    args = ap.parse_args(argv)
    config, items, sizes = on_a_gpu(args.sim) if args.sim else on_this_cpu()
    if not args.sim:  # the first run of the real model builds and warms its kernels: not part of any point
        run_point(config, 0, items[:2])
    print(TABLE_HEADER, flush=True)
    sweep(config, args.sizes or sizes, items, on_point=lambda p: print(p.row(), flush=True))


if __name__ == "__main__":
    main()
