"""Lecture scenarios for the dashboard: small workloads that each make one scheduler behaviour visible.

Built from ``minfer.workload`` generators, sized for the real model on a laptop CPU (a step takes about
a tenth of a second there). The simulator's steps are ~20x shorter, so the dashboard compresses the
arrival times by ``time_scale`` to keep the same traffic *shape*. Prompt token ids stay below 300, so
every scenario also runs on the tiny test model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from minfer.workload import WorkItem, bursts, fixed_mix, long_prompt_spike, poisson, scale_time, shared_prefix

SHORT: dict[str, Any] = dict(prompt_median=32, output_median=16, max_prompt=96, max_output=40)


def _mixed_chat(seed: int) -> list[WorkItem]:
    """Continuous batching: six mixed requests at once; short ones leave, the rest keep decoding."""
    return fixed_mix(6, seed=seed, **SHORT)


def _steady(seed: int) -> list[WorkItem]:
    """An online service: arrivals join the running batch at the very next step."""
    return poisson(12, rate=4.0, seed=seed, sigma=0.6, **SHORT)


def _long_prompt(seed: int) -> list[WorkItem]:
    """Chunked prefill: a 256-token prompt arrives among decoding requests and is ingested in chunks."""
    return long_prompt_spike(fixed_mix(5, seed=seed, **SHORT), at=0.6, count=1, prompt_len=256, output_len=8)


def _bursts(seed: int) -> list[WorkItem]:
    """Memory pressure: bursts fill the pool; with few blocks the scheduler preempts and recomputes."""
    return bursts(3, 6, interval=1.5, seed=seed, sigma=0.5, prompt_median=48, output_median=32,
                  max_prompt=120, max_output=64)


def _shared_prefix(seed: int) -> list[WorkItem]:
    """Prefix caching: every prompt starts with the same 64-token system prompt (turn caching on)."""
    return shared_prefix(8, prefix_len=64, suffix_median=12, output_median=16, rate=3.0, vocab_size=300,
                         seed=seed)


def _tenants(seed: int) -> list[WorkItem]:
    """Policies: alice's requests are urgent (priority 0), bob's are not (1); try "priority" and "fair"."""
    items = poisson(14, rate=6.0, seed=seed, sigma=0.6, tenants=["alice", "bob"], **SHORT)
    return [replace(w, priority=0 if w.tenant == "alice" else 1) for w in items]


SCENARIOS: dict[str, Callable[[int], list[WorkItem]]] = {
    "mixed chat (6 at once)": _mixed_chat,
    "steady arrivals": _steady,
    "long prompt spike": _long_prompt,
    "bursts (memory pressure)": _bursts,
    "shared system prompt": _shared_prefix,
    "two tenants, two priorities": _tenants,
}


def scenario(name: str, seed: int = 0, time_scale: float = 1.0) -> list[WorkItem]:
    if name not in SCENARIOS:
        raise ValueError(f"scenario must be one of {list(SCENARIOS)}, got {name!r}")
    items = SCENARIOS[name](seed)
    return scale_time(items, time_scale) if time_scale != 1.0 else items
