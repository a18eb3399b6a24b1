"""What the scheduler decided, in words: the one place where its decisions become sentences.

A chart shows *that* r9 turned red at step 34; a lecture needs *why*. The scheduler records every decision as
data (``minfer.plan``: ``Admitted``, ``Chunked``, ``Preempted``, ``NotAdmitted``, ``Ended``, each with the numbers
behind it) and the engine copies them into the step's ``StepTrace.decisions``. This module renders them:
``explain`` says why for one decision, ``sentences`` lists a step's decisions, ``narrate`` makes the dashboard's
line::

    step 34 · preempted r9 (pool full: r7 needed a block; r9 is the most recently admitted running request;
    recomputes: its 55 computed tokens are dropped) · kept waiting r10 (memory ran short: ...)

The words live here, not in the scheduler, so that the scheduler's file is its algorithm, tests assert on numbers
rather than on phrases, and the wording can change in one place. A trace recorded before the engine kept decisions
(an older file: its ``decisions`` are empty) still narrates: the phrase is then built from the other fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from minfer.plan import Admitted, Chunked, Decision, Ended, NotAdmitted, Preempted
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

ORDER = (Admitted, Chunked, Preempted, Ended, NotAdmitted)  # the order a step's sentences are told in


@dataclass(slots=True)
class Sentence:
    kind: str  # admitted, chunked, continued, stalled, preempted, finished, refused or "kept waiting"
    request: str
    why: str


def explain(d: Decision) -> str:
    """Why the scheduler took decision ``d``, in a phrase."""
    if isinstance(d, Admitted):
        return _admitted(d)
    if isinstance(d, Chunked):
        budget = "prompt budget" if d.limit == "prompt_budget" else "token budget"
        return (f"tokens {d.start}–{d.start + d.tokens - 1} of {d.start + d.remaining} this step; the {budget} "
                f"({d.budget} tokens a step) is spent, the rest waits")
    if isinstance(d, Preempted):
        return _preempted(d)
    if isinstance(d, NotAdmitted):
        return _not_admitted(d)
    return _ended(d)


def _admitted(d: Admitted) -> str:
    resume = {"swap_in": f"resumes after preemption, swapping in {d.swapped_blocks} blocks ({d.swapped_tokens} "
                         "tokens): ",
              "recompute": "resumes after preemption, recomputing: ", "": ""}[d.resumed]
    cached = f", {d.cached_tokens} tokens from the prefix cache" if d.cached_tokens else ""
    if d.loaded_blocks:
        cached += f" ({d.loaded_blocks} blocks copied back from its host tier)"
    return f"{resume}{d.tokens} tokens this step, {d.blocks} of {d.free_blocks} free blocks{cached}"


def _preempted(d: Preempted) -> str:
    if d.cause == "priority":
        why = (f"priority: {d.by} (priority {d.by_priority}) outranks it (priority {d.priority}) and could not "
               "start otherwise")
    elif d.by == d.request:
        why = f"pool full: it needed a block, and it is itself {d.victim_rule}"
    else:
        why = f"pool full: {d.by} needed a block; {d.request} is {d.victim_rule}"
    if d.swapped_blocks:
        return f"{why}; swapped out: {d.swapped_blocks} blocks ({d.tokens} tokens) copied to host memory"
    full = f" (host pool full: {d.host_blocks_needed} blocks needed, {d.host_blocks_free} free)" if d.host_full else ""
    return f"{why}; recomputes: its {d.tokens} computed tokens are dropped{full}"


def _not_admitted(d: NotAdmitted) -> str:
    return {
        "step_preempted": "memory ran short: a step that preempts admits nobody, who would only be preempted next",
        "token_budget": f"the token budget ({d.have} tokens a step) is spent",
        "chunk_limit": f"the step has all the prompt chunks it may: max_prefill_chunks_per_step={d.have}",
        "prompt_budget": f"the prompt budget ({d.have} tokens a step) is spent",
        "max_num_seqs": f"every sequence slot is taken: max_num_seqs={d.have}",
        "prompt_too_long": f"unchunked, its {d.need} tokens must run in one step, and {d.have} are left in this one",
        "no_free_blocks": f"too few free KV blocks: it needs {d.need}, {d.have} are free",
    }[d.cause]


def _ended(d: Ended) -> str:
    if d.cause == "eos":
        return f"EOS token {d.detail}"
    if d.cause == "stop_token":
        return f"stop token {d.detail}"
    if d.cause == "stop_string":
        return f"stop string {d.detail!r}"
    if d.cause in ("max_tokens", "max_model_len"):
        return f"{d.cause}={d.detail} reached"
    if d.cause == "abort":
        return "aborted"
    return str(d.detail) if d.detail else d.reason  # refused or timed out: the scheduler's message; error: the error


def ending(t: StepTrace, request: str) -> str:
    """Why ``request`` ended in step ``t``, in a phrase (from a trace without decisions: its finish reason)."""
    ended = next((d for d in t.decisions if isinstance(d, Ended) and d.request == request), None)
    if ended is not None:
        return explain(ended)
    finish = t.finish_reasons.get(request, "")
    return FINISH_WORDS.get(finish, finish or "finished")


def kind_of(d: Decision) -> str:
    """The verb a sentence starts with."""
    if isinstance(d, Ended):
        return "refused" if d.reason in QUEUE_ENDINGS else "finished"
    return "kept waiting" if isinstance(d, NotAdmitted) else d.kind


def sentences(t: StepTrace) -> list[Sentence]:
    """The step's decisions in words: admissions, chunks (a prompt's last chunk too), preemptions, endings, and who
    was kept waiting -- with how many wait behind it, since the queue is served in order."""
    if not t.decisions and (t.admitted or t.preempted or t.finished):  # recorded before decisions were kept
        return _from_older_trace(t)
    ordered = sorted(t.decisions, key=lambda d: ORDER.index(type(d)))
    out = [Sentence(kind_of(d), d.request, explain(d) + (_behind(t) if isinstance(d, NotAdmitted) else ""))
           for d in ordered]
    at = next((i for i, s in enumerate(out) if s.kind in ("preempted", "finished", "refused", "kept waiting")),
              len(out))
    out[at:at] = _last_chunks(t) + _stalled(t)  # told with the other chunks, before preemptions and endings
    return out


def _stalled(t: StepTrace) -> list[Sentence]:
    """Running requests that computed nothing: they hold blocks, but the requests ranked above them spent the
    step's budget (the timeline draws them dotted)."""
    computed = t.prefill_tokens.keys() | t.decode_tokens.keys()
    return [Sentence("stalled", rid, f"holds {n} blocks but got no budget: the requests ranked above it spent it")
            for rid, n in t.blocks.items() if rid not in computed]


def _behind(t: StepTrace) -> str:
    """The rest of the queue: everyone behind the request kept waiting waits too (head-of-line order)."""
    others = t.num_waiting - 1
    if others <= 0:
        return ""
    return f"; {others} more {'waits' if others == 1 else 'wait'} behind it in the policy's order"


def _last_chunks(t: StepTrace) -> list[Sentence]:
    """Prompts (or recomputes) that a step finished without admitting them: their last chunk, which no decision
    records (``Chunked`` is a chunk the budget cut short), yet which a chart shows as a hatched bar."""
    decided = {d.request for d in t.decisions if isinstance(d, Admitted | Chunked)}
    return [Sentence("continued", rid, f"tokens {t.positions.get(rid, 0)}–{t.positions.get(rid, 0) + n - 1}, the "
                                       "last it had to compute: it samples its next token this step")
            for rid, n in t.prefill_tokens.items() if rid not in decided]


def _from_older_trace(t: StepTrace) -> list[Sentence]:
    """A trace without decisions (an older file): what its other fields tell."""
    out = []
    for rid in t.admitted:
        why = "joins the batch"
        if rid in t.prefill_tokens:
            start, n = t.positions.get(rid, 0), t.prefill_tokens[rid]
            why = f"prompt tokens {start}–{start + n - 1} this step"
        out.append(Sentence("admitted", rid, why))
    for rid in t.preempted:
        out.append(Sentence("preempted", rid,
                            "KV blocks ran out: its blocks go to requests ranked above it; it will recompute"))
    for rid in t.finished:
        refused = t.finish_reasons.get(rid, "") in QUEUE_ENDINGS
        out.append(Sentence("refused" if refused else "finished", rid, ending(t, rid)))
    return out


def quiet(t: StepTrace, most: int = 8) -> str:
    """What to say of a step in which nobody joined, left, was cut short or kept waiting: the plan was to decode
    every running request one token, and why nobody else ran (no one waits; some have not arrived)."""
    arriving = f"; {t.num_pending} {'has' if t.num_pending == 1 else 'have'} not arrived yet" if t.num_pending else ""
    if not t.num_tokens:
        return f"idle: nothing to compute{arriving}"
    names = list(t.decode_tokens)
    shown = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
    each = ("the only running request computed its next token" if len(names) == 1 else
            f"each running request computed its next token ({len(names)} tokens)")
    waiting = "nobody waits" if not t.num_waiting else f"{t.num_waiting} waiting"
    return f"decoded {shown}: {each}; {waiting}{arriving}"


def narrate(t: StepTrace) -> str:
    """One line: what the scheduler decided in step ``t`` and why."""
    parts = [f"{s.kind} {s.request} ({s.why})" for s in sentences(t)] or [quiet(t)]
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
