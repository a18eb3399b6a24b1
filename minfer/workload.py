"""Workloads: who arrives when, with how long a prompt, wanting how many tokens.

A serving benchmark is only as meaningful as its traffic. These generators make the shapes that
stress a scheduler in different ways, all seeded (the same seed, the same workload):

* ``fixed_mix``: a set of mixed-length requests, all there at time 0 (offline throughput);
* ``uniform_mix``: the same with lengths drawn uniformly from a range (no long tail: every length equally likely);
* ``poisson``: independent arrivals at a mean rate (an online service under steady load);
* ``bursts``: groups that arrive together, with quiet gaps between (queues build up, then drain);
* ``long_prompt_spike``: a few very long prompts dropped into steady traffic (chunked prefill's case);
* ``shared_prefix``: many requests behind the same long system prompt (prefix caching's case).
* ``multi_turn_chat``: conversations whose every turn resends the whole conversation so far (a host tier's case).

Lengths are long-tailed (log-normal, clipped), the shape of real chat traffic: most requests are
short, a few are very long. ``save_workload``/``load_workload`` keep a workload as JSON lines, and
``submit`` hands one to an ``LLMEngine`` with exactly ``output_len`` tokens per request (EOS ignored).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minfer.jsonl import load_jsonl, save_jsonl


@dataclass(slots=True)
class WorkItem:
    arrival_time: float  # seconds from the start of the run
    prompt_len: int
    output_len: int  # tokens to generate (max_tokens, with EOS ignored)
    prompt: str | list[int] | None = None  # text or token ids; None: prompt_len random ids, drawn at submit
    priority: int = 0
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.prompt is not None and not isinstance(self.prompt, str):
            self.prompt_len = len(self.prompt)
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"prompt_len and output_len must be >= 1: {self.prompt_len}, {self.output_len}")
        if self.arrival_time < 0:
            raise ValueError(f"arrival_time must be >= 0, got {self.arrival_time}")


def lognormal_lengths(rng: random.Random, n: int, median: float, sigma: float, low: int,
                      high: int) -> list[int]:
    """``n`` long-tailed lengths around ``median``, clipped to ``[low, high]``."""
    return [min(high, max(low, round(rng.lognormvariate(0.0, sigma) * median))) for _ in range(n)]


def _items(rng: random.Random, times: Sequence[float], prompt_median: float, output_median: float,
           max_prompt: int, max_output: int, tenants: Sequence[str] | None, sigma: float) -> list[WorkItem]:
    n = len(times)
    prompts = lognormal_lengths(rng, n, prompt_median, sigma, 4, max_prompt)
    outputs = lognormal_lengths(rng, n, output_median, sigma, 2, max_output)
    who = [rng.choice(tenants) for _ in range(n)] if tenants else [None] * n
    return [WorkItem(t, p, o, tenant=w) for t, p, o, w in zip(times, prompts, outputs, who)]


def fixed_mix(n: int = 32, prompt_median: float = 96, output_median: float = 64, max_prompt: int = 512,
              max_output: int = 256, seed: int = 0, sigma: float = 0.8,
              tenants: Sequence[str] | None = None) -> list[WorkItem]:
    """``n`` requests of mixed lengths, all arriving at time 0."""
    rng = random.Random(seed)
    return _items(rng, [0.0] * n, prompt_median, output_median, max_prompt, max_output, tenants, sigma)


def uniform_mix(n: int = 40, prompt_range: tuple[int, int] = (24, 320), output_range: tuple[int, int] = (8, 160),
                seed: int = 0) -> list[WorkItem]:
    """``n`` requests at time 0, prompt and output lengths uniform over the (inclusive) ranges."""
    rng = random.Random(seed)
    return [WorkItem(0.0, rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(n)]


def poisson(n: int, rate: float, prompt_median: float = 256, output_median: float = 128,
            max_prompt: int = 4096, max_output: int = 1024, seed: int = 0, sigma: float = 1.0,
            tenants: Sequence[str] | None = None) -> list[WorkItem]:
    """``n`` requests arriving as a Poisson process of ``rate`` per second (exponential gaps)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests per second, got {rate}")
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return _items(rng, times, prompt_median, output_median, max_prompt, max_output, tenants, sigma)


def bursts(num_bursts: int, burst_size: int, interval: float, prompt_median: float = 128,
           output_median: float = 64, max_prompt: int = 2048, max_output: int = 512, seed: int = 0,
           sigma: float = 0.8, tenants: Sequence[str] | None = None) -> list[WorkItem]:
    """``num_bursts`` groups of ``burst_size`` requests arriving together, ``interval`` seconds apart."""
    rng = random.Random(seed)
    times = [b * interval for b in range(num_bursts) for _ in range(burst_size)]
    return _items(rng, times, prompt_median, output_median, max_prompt, max_output, tenants, sigma)


def long_prompt_spike(base: list[WorkItem], at: float, count: int = 2, prompt_len: int = 2048,
                      output_len: int = 16) -> list[WorkItem]:
    """``base`` plus ``count`` requests with very long prompts arriving at time ``at``."""
    spike = [WorkItem(at, prompt_len, output_len, tenant="spike") for _ in range(count)]
    return sorted(base + spike, key=lambda w: w.arrival_time)


def shared_prefix(n: int, prefix_len: int = 512, suffix_median: float = 32, output_median: float = 32,
                  num_prefixes: int = 1, rate: float | None = None, vocab_size: int = 32000,
                  seed: int = 0) -> list[WorkItem]:
    """``n`` requests whose prompts start with one of ``num_prefixes`` shared system prompts of
    ``prefix_len`` tokens, then a short distinct question. Token ids are fixed here (the sharing is the
    point), drawn from ``[1, vocab_size)``. Arrivals: all at 0, or Poisson at ``rate``."""
    rng, ids = random.Random(seed), token_ids(vocab_size)
    prefixes = [rng.choices(ids, k=prefix_len) for _ in range(num_prefixes)]
    suffixes = lognormal_lengths(rng, n, suffix_median, 0.5, 1, 4 * round(suffix_median) + 1)
    outputs = lognormal_lengths(rng, n, output_median, 0.5, 2, 4 * round(output_median) + 2)
    t, items = 0.0, []
    for i in range(n):
        if rate:
            t += rng.expovariate(rate)
        prompt = prefixes[i % num_prefixes] + rng.choices(ids, k=suffixes[i])
        items.append(WorkItem(t, len(prompt), outputs[i], prompt=prompt, tenant=f"prefix{i % num_prefixes}"))
    return items


def multi_turn_chat(num_conversations: int, turns: int = 4, system_len: int = 128, user_median: float = 32,
                    answer_len: int = 32, think_time: float = 4.0, rate: float | None = 1.0,
                    vocab_size: int = 32000, seed: int = 0) -> list[WorkItem]:
    """``num_conversations`` chats of ``turns`` turns, starting as a Poisson process of ``rate`` per second (None: all
    at time 0, so each turn of every chat arrives together -- waves, when ``think_time`` outlasts a wave). A turn's
    prompt is the conversation so far -- a system prompt all chats share, each earlier user message and answer --
    and a new user message; it asks for ``answer_len`` tokens, and the next turn arrives ``think_time`` seconds
    later (open loop: a fixed gap, whenever the answer ends). The answers resent in later prompts are drawn here,
    not the model's (a benchmark cannot wait for them): so the cached prefix a turn finds is its previous turn's
    whole prompt, the part the previous turn computed as a prompt."""
    if (rate is not None and rate <= 0) or turns < 1 or num_conversations < 1:
        raise ValueError(f"need rate > 0, turns >= 1 and num_conversations >= 1, got {rate}, {turns}, "
                         f"{num_conversations}")
    rng, ids = random.Random(seed), token_ids(vocab_size)
    system = rng.choices(ids, k=system_len)
    items, start = [], 0.0
    for c in range(num_conversations):
        start += rng.expovariate(rate) if rate is not None else 0.0
        history = list(system)
        for turn in range(turns):
            history += rng.choices(ids, k=lognormal_lengths(rng, 1, user_median, 0.5, 1, 4 * round(user_median))[0])
            items.append(WorkItem(start + turn * think_time, len(history), answer_len, prompt=list(history),
                                  tenant=f"chat{c}"))
            history += rng.choices(ids, k=answer_len)
    return sorted(items, key=lambda w: w.arrival_time)


def scale_time(items: list[WorkItem], factor: float) -> list[WorkItem]:
    """The same requests with arrival times multiplied by ``factor`` (< 1: the same traffic, faster)."""
    return [replace(w, arrival_time=w.arrival_time * factor) for w in items]


# ---- keeping and replaying workloads -------------------------------------------------------------
def save_workload(items: Sequence[WorkItem], path: str | Path) -> None:
    """JSON lines, one request per line."""
    save_jsonl(items, path)


def load_workload(path: str | Path) -> list[WorkItem]:
    return load_jsonl(WorkItem, path)


@functools.cache
def token_ids(vocab_size: int) -> tuple[int, ...]:
    """The ids ``1 .. vocab_size - 1`` as one tuple of int objects, for ``random.choices`` to draw prompts from.
    Drawing from ``range(1, vocab_size)`` gives the same ids, but each draw makes a new int object (Python keeps
    only -5 .. 256 as shared ones): 28 bytes a token more, 1.2 GB at the 40 million prompt tokens of a
    100,000-request simulation. From this tuple every draw is a reference to an int made once."""
    return tuple(range(1, vocab_size))


def token_prompts(items: Sequence[WorkItem], vocab_size: int, seed: int = 0) -> list[list[int] | str]:
    """Each item's prompt: its own text or ids, or ``prompt_len`` random ids in ``[1, vocab_size)``
    (seeded, so every system benchmarked on the workload gets the very same prompts)."""
    rng, ids = random.Random(seed), token_ids(vocab_size)
    return [rng.choices(ids, k=w.prompt_len) if w.prompt is None else w.prompt for w in items]


SIM_VOCAB_SIZE = 32000  # ids for simulator prompts (they only matter to prefix-cache hashes)


def submit(engine: Any, items: Sequence[WorkItem], seed: int = 0, prefix: str = "r") -> list[str]:
    """Add every item to ``engine`` (an ``LLMEngine``) as request ``f"{prefix}{i}"``: greedy, exactly
    ``output_len`` new tokens, arriving at ``arrival_time`` on the engine's clock (plus its current time)."""
    from minfer.request import SamplingParams

    vocab = engine.vocab_size or SIM_VOCAB_SIZE
    prompts = token_prompts(items, vocab, seed)
    ids = []
    for i, (w, prompt) in enumerate(zip(items, prompts)):
        rid = f"{prefix}{i}"
        params = SamplingParams(max_tokens=w.output_len, ignore_eos=True, temperature=0.0)
        engine.add_request(rid, prompt, params, priority=w.priority, tenant=w.tenant,
                           arrival_time=engine.now + w.arrival_time)
        ids.append(rid)
    return ids
