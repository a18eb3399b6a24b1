"""What the scheduler decided, in words: one line per step, from the ``StepTrace`` alone.

A chart shows *that* r4 turned red at step 37; a lecture needs *why*. Every step the engine records who it
admitted, preempted and finished, and (``StepTrace.reasons``) one short phrase per decision -- "pool full:
r4 is the most recently admitted running request". ``decisions`` lists them, ``narrate`` makes the dashboard's line::

    step 37 · preempted r9 (pool full: r9 is the newest running request) · finished r2 (max_tokens reached)

A trace recorded before the engine kept reasons (loaded from an older file: its ``reasons`` are empty) still
narrates: the phrase is then built from the other fields (the finish reason, the prompt positions computed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from minfer.trace import StepTrace

FINISH_WORDS = {
    "stop": "stop token or stop string",
    "length": "max_tokens reached",
    "abort": "aborted",
    "rejected": "refused: the queue was full",
    "timeout": "waited longer than max_queue_time",
    "error": "failed",
}
QUEUE_ENDINGS = ("rejected", "timeout")  # finished without ever running: refused, not finished


@dataclass(slots=True)
class Decision:
    kind: str  # "admitted" | "preempted" | "finished" | "refused"
    request: str
    why: str


def decisions(t: StepTrace) -> list[Decision]:
    """The step's admissions, preemptions and endings, each with the scheduler's reason."""
    reasons = t.reasons
    out = []
    for rid in t.admitted:
        why = reasons.get(rid)
        if why is None and rid in t.prefill_tokens:
            start, n = t.positions.get(rid, 0), t.prefill_tokens[rid]
            why = f"prompt tokens {start}–{start + n - 1} this step"
        out.append(Decision("admitted", rid, why or "joins the batch"))
    for rid in t.preempted:
        why = reasons.get(rid) or "KV blocks ran out: its blocks go to requests ranked above it; it will recompute"
        out.append(Decision("preempted", rid, why))
    for rid in t.finished:
        finish = t.finish_reasons.get(rid, "")
        why = reasons.get(rid) or FINISH_WORDS.get(finish, finish or "finished")
        out.append(Decision("refused" if finish in QUEUE_ENDINGS else "finished", rid, why))
    return out


def narrate(t: StepTrace) -> str:
    """One line: what the scheduler decided in step ``t`` and why."""
    parts = [f"{d.kind} {d.request} ({d.why})" for d in decisions(t)]
    if not parts:
        parts = [f"no admission, preemption or finish: {t.batch_size} requests computed {t.num_tokens} tokens"
                 if t.num_tokens else "idle: nothing to compute"]
    return f"step {t.step} · " + " · ".join(parts)


def request_info(trace: Iterable[StepTrace]) -> dict[str, str]:
    """Request id → "tenant · priority" (only what was set), from the steps where requests joined."""
    tenants: dict[str, str] = {}
    priorities: dict[str, int] = {}
    for t in trace:
        tenants.update(t.tenants)
        priorities.update(t.priorities)
    out = {}
    for rid in tenants.keys() | priorities.keys():
        bits = [tenants[rid]] if rid in tenants else []
        bits += [f"priority {priorities[rid]}"] if rid in priorities else []
        out[rid] = " · ".join(bits)
    return out


def row_label(request: str, info: Mapping[str, str]) -> str:
    """A timeline row's label: the id, and its tenant and priority when set."""
    return f"{request} · {info[request]}" if info.get(request) else request
