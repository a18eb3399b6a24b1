"""StepTrace: one plain record per engine step -- the single source for metrics, widgets and tests.

It says who ran and how (prefill or decode tokens per request), who holds how many KV blocks, how long
the queues were, who was admitted, preempted or finished -- and why, as the scheduler recorded each decision
(``decisions``: records of ``minfer.plan`` with the numbers behind them, such as ``Preempted(request="r7",
cause="pool_full", by="r2", tokens=57, swapped_blocks=4, ...)``; the dashboard's narration, ``viz.narration``,
turns them into a sentence per step) -- which KV blocks moved to or from host memory (swap preemption, the prefix
cache's host tier), and how
long the step took. Widgets only render these records; tests assert on them; a trace saved as JSON lines replays
anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from minfer.jsonl import read_jsonl, save_jsonl
from minfer.plan import Decision, Preempted, decision_from_dict


@dataclass(slots=True)
class StepTrace:
    step: int
    start_time: float  # engine clock (seconds) when the step began
    duration: float  # seconds: measured (real model) or modelled (simulator)
    prefill_tokens: dict[str, int]  # request id → prompt (or recompute) tokens computed this step
    decode_tokens: dict[str, int]  # request id → 1 for each decoding request
    positions: dict[str, int]  # request id → position of the first token it computed this step
    blocks: dict[str, int]  # request id → KV blocks held after the step (running requests)
    num_running: int
    num_waiting: int
    num_pending: int  # not yet arrived
    num_free_blocks: int
    num_blocks: int
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission this step
    num_cached_blocks: int = 0  # blocks in the prefix-hash index after the step
    scheduler_time: float = 0.0  # seconds of CPU spent scheduling and updating (not the forward)
    decisions: list[Decision] = field(default_factory=list)  # why each was admitted, chunked, preempted, kept
    # waiting or ended (a request may have several: admitted and chunked, say)
    tenants: dict[str, str] = field(default_factory=dict)  # requests that joined the queue: their tenant, if set
    priorities: dict[str, int] = field(default_factory=dict)  # ... and their priority, if not 0
    swapped_out: dict[str, int] = field(default_factory=dict)  # request id → KV blocks copied to host memory
    swapped_in: dict[str, int] = field(default_factory=dict)  # request id → KV blocks copied back from host memory
    # the prefix cache's host tier (host_cache_blocks): evicted cached blocks copied to host memory this step, and
    # request id → blocks of its prefix copied back from there at admission
    spilled_blocks: int = 0
    loaded_blocks: dict[str, int] = field(default_factory=dict)
    swap_bytes: int = 0  # bytes all those copies moved over the host link, both directions together
    num_swapped_blocks: int = 0  # host blocks holding swapped-out K/V after the step
    num_host_cached_blocks: int = 0  # blocks the host tier holds after the step
    # speculative decoding: request id → guessed tokens it verified this step, and how many of them it kept
    draft_tokens: dict[str, int] = field(default_factory=dict)
    accepted_tokens: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepTrace:
        """A step read back from JSON: the fields it knows (a file from another minfer version still loads), its
        decisions as records again."""
        known = {k: v for k, v in d.items() if k in _FIELDS}
        known["decisions"] = [decision_from_dict(x) for x in d.get("decisions", [])]
        return cls(**known)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_tokens.values())

    @property
    def num_decode_tokens(self) -> int:
        return sum(self.decode_tokens.values())

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def batch_size(self) -> int:
        """Requests that computed something in this step."""
        return len(self.prefill_tokens.keys() | self.decode_tokens.keys())

    @property
    def end_time(self) -> float:
        return self.start_time + self.duration

    def describe(self) -> str:
        """One line, as the chapters print it: ``Step 3: [A: token 41] [C: prefill 0-512]``."""
        pos = self.positions
        parts = [f"[{r}: token {pos[r]}]" for r in self.decode_tokens]
        parts += [f"[{r}: prefill {pos[r]}-{pos[r] + n}]" for r, n in self.prefill_tokens.items()]
        extra = ("".join(f" preempt:{r}" for r in self.preempted) + "".join(f" swap-out:{r}" for r in self.swapped_out)
                 + "".join(f" swap-in:{r}" for r in self.swapped_in) + "".join(f" done:{r}" for r in self.finished))
        return f"Step {self.step}: " + (" ".join(parts) or "(idle)") + extra


@dataclass(slots=True)
class Preemption:
    """One preemption read back from a trace: who lost its KV blocks, when, for whom, and when it came back."""

    request: str  # the victim
    step: int  # the step that preempted it
    by: str  # the request it made room for (the victim itself, when it was the one that needed a block)
    tokens: int  # computed tokens it held then
    swapped: bool  # its K/V were copied to host memory; otherwise they are dropped
    resumed: int | None = None  # the step that admitted it again; None if the trace ends first

    @property
    def recomputed(self) -> int:
        """Tokens computed a second time because of this preemption: all it held, unless they were swapped."""
        return 0 if self.swapped else self.tokens


def preemptions(trace: list[StepTrace]) -> list[Preemption]:
    """Every preemption in ``trace``, in order, each paired with the step that re-admitted its victim. Within a
    step the scheduler preempts before it admits, so a victim may come back in the very step that preempted it."""
    # BEGIN EXERCISE E11.1
    found: list[Preemption] = []
    away: dict[str, Preemption] = {}  # victims not admitted again yet
    for t in trace:
        for d in t.decisions:
            if isinstance(d, Preempted):
                p = Preemption(d.request, t.step, d.by, d.tokens, swapped=d.swapped_blocks > 0)
                found.append(p)
                away[d.request] = p
        for rid in t.admitted:
            if rid in away:
                away.pop(rid).resumed = t.step
    return found
    # END EXERCISE


def save_trace(trace: list[StepTrace], path: str | Path) -> None:
    """JSON lines, one step per line."""
    save_jsonl(trace, path)


def load_trace(path: str | Path) -> list[StepTrace]:
    return [StepTrace.from_dict(row) for row in read_jsonl(path)]


_FIELDS = {f.name for f in fields(StepTrace)}
