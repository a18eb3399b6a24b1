"""Decisions as data: the scheduler records why it admitted, chunked, preempted, kept waiting or ended a request
(``minfer.plan``), the engine copies the records into ``StepTrace.decisions``, and ``viz.narration`` alone turns
them into words. Each kind is produced here by a situation that must produce it, on the tiny random model, with
the scheduler's and the pool's invariants checked after every step."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict

import pytest

from conftest import decision, decisions, run_checked, tiny_engine
from minfer import SamplingParams
from minfer.plan import (
    Admitted,
    Chunked,
    EndCause,
    Ended,
    NotAdmitted,
    Preempted,
    WaitCause,
    decision_from_dict,
)
from minfer.trace import load_trace
from minfer.viz.narration import explain, narrate, sentences


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def prompt(n: int, start: int = 3) -> list[int]:
    return [start + i % 200 for i in range(n)]


def first_step(tiny, requests: dict[str, int], **config):
    """Add requests (id → prompt length), run one step, return the engine and that step's trace."""
    e = tiny_engine(tiny, block_size=8, **config)
    for rid, n in requests.items():
        e.add_request(rid, prompt(n), greedy(4))
    e.step()
    e.scheduler.check_invariants()
    return e, e.trace[0]


# ---- admitted and chunked ---------------------------------------------------------------------------------------
def test_admission_and_prompt_chunks_carry_their_numbers(tiny):
    e = tiny_engine(tiny, num_blocks=32, block_size=8, chunked_prefill_size=16)
    e.add_request("long", prompt(40), greedy(3))  # 40 prompt tokens: chunks of 16, 16 and 8
    run_checked(e)
    first = e.trace[0]
    a = decision(first, "long", Admitted)
    assert (a.tokens, a.free_blocks, a.cached_tokens, a.resumed) == (16, 32, 0, "")
    assert a.blocks == first.blocks["long"] == 2, "the blocks it took are the blocks it holds"
    chunks = [(t.step, d.start, d.tokens, d.remaining, d.limit, d.budget)
              for t in e.trace for d in decisions(t, Chunked)]
    assert chunks == [(0, 0, 16, 40, "prompt_budget", 16), (1, 16, 16, 24, "prompt_budget", 16)], \
        "the last chunk reaches the prompt's end: it is not cut"
    assert [d.request for t in e.trace for d in decisions(t, Admitted)] == ["long"]


def test_a_token_budget_smaller_than_the_prompt_budget_cuts_the_chunk(tiny):
    _, t = first_step(tiny, {"a": 40, "b": 5}, num_blocks=32, chunked_prefill_size=16, max_num_batched_tokens=10,
                      max_prefill_chunks_per_step=2)
    c = decision(t, "a", Chunked)
    assert (c.tokens, c.limit, c.budget) == (10, "token_budget", 10)
    assert decision(t, "b", NotAdmitted) == NotAdmitted("b", "token_budget", have=10)


# ---- kept waiting: why the head of the queue did not start ----------------------------------------------------------
@pytest.mark.parametrize("config, requests, expected", [
    (dict(num_blocks=32, chunked_prefill_size=16), {"a": 40, "b": 5}, NotAdmitted("b", "chunk_limit", have=1)),
    (dict(num_blocks=32, chunked_prefill_size=16, max_prefill_chunks_per_step=2), {"a": 40, "b": 5},
     NotAdmitted("b", "prompt_budget", have=16)),
    (dict(num_blocks=32, max_num_seqs=1, max_prefill_chunks_per_step=2), {"a": 5, "b": 5},
     NotAdmitted("b", "max_num_seqs", have=1)),
    (dict(num_blocks=6, max_prefill_chunks_per_step=2), {"a": 30, "b": 20},  # a holds 4 of 6 blocks, b needs 3
     NotAdmitted("b", "no_free_blocks", need=3, have=2)),
    (dict(num_blocks=32, enable_chunked_prefill=False, max_num_batched_tokens=40, max_prefill_chunks_per_step=2),
     {"a": 30, "b": 20}, NotAdmitted("b", "prompt_too_long", need=20, have=10)),
])
def test_the_head_of_the_queue_says_why_it_waits(tiny, config, requests, expected):
    _, t = first_step(tiny, requests, **config)
    assert t.admitted == ["a"]
    assert decisions(t, NotAdmitted) == [expected]
    assert f"kept waiting b ({explain(expected)})" in narrate(t)


def test_nobody_is_admitted_in_a_step_that_preempted(tiny):
    e = tiny_engine(tiny, num_blocks=6, block_size=8, chunked_prefill_size=64)
    e.add_request("a", prompt(20), greedy(20))  # 3 blocks, growing to 5
    e.add_request("b", prompt(15), greedy(20))  # 2 blocks, growing to 5: the pool runs dry
    e.add_request("c", prompt(4), greedy(2))  # queued behind them
    run_checked(e)
    preempting = [t for t in e.trace if t.preempted]
    assert preempting, "the case needs a preemption"
    for t in preempting:
        assert not t.admitted
        (held,) = decisions(t, NotAdmitted)
        assert held.cause == "step_preempted"


# ---- preempted --------------------------------------------------------------------------------------------------
def test_a_preemption_names_who_needed_the_room_and_what_the_victim_loses(tiny):
    e = tiny_engine(tiny, num_blocks=6, block_size=8, chunked_prefill_size=64)
    e.add_request("a", prompt(20), greedy(20))
    e.add_request("b", prompt(15), greedy(20))
    run_checked(e)
    t = next(t for t in e.trace if t.preempted)
    (p,) = decisions(t, Preempted)
    assert (p.request, p.cause, p.by) == ("b", "pool_full", "a"), "b, admitted last, makes room for a"
    assert p.victim_rule == e.scheduler.policy.victim_rule and p.tokens > 0 and not p.swapped_blocks
    assert explain(p).startswith("pool full: a needed a block; b is the most recently admitted running request")
    back = next(d for s in e.trace[t.step + 1:] for d in decisions(s, Admitted) if d.request == "b")
    assert back.resumed == "recompute"


def test_a_priority_preemption_names_the_request_that_outranks_the_victim(tiny):
    e = tiny_engine(tiny, num_blocks=8, block_size=8, policy="priority", priority_preemption=True, max_num_seqs=1)
    e.add_request("low", prompt(10), greedy(12), priority=5)
    e.step()
    e.add_request("urgent", prompt(6), greedy(3), priority=0)
    run_checked(e)
    (p,) = [d for t in e.trace for d in decisions(t, Preempted)]
    assert (p.request, p.cause, p.by, p.priority, p.by_priority) == ("low", "priority", "urgent", 5, 0)
    assert explain(p).startswith("priority: urgent (priority 0) outranks it (priority 5)")


# ---- ended: finished, aborted, refused -----------------------------------------------------------------------
def test_every_ending_is_recorded_once_with_its_cause(tiny):
    e = tiny_engine(tiny, num_blocks=32, block_size=8, max_num_seqs=1, max_waiting=1)
    e.add_request("long", prompt(5), greedy(6))
    e.add_request("kept", prompt(5), greedy(2))
    e.add_request("refused", prompt(5), greedy(2))  # the queue holds one: the newest arrival is refused
    e.step()
    e.abort_request("kept")
    run_checked(e)
    ended = {d.request: d for t in e.trace for d in decisions(t, Ended)}
    assert ended == {"long": Ended("long", "length", "max_tokens", 6), "kept": Ended("kept", "abort", "abort"),
                     "refused": Ended("refused", "rejected", "rejected", "queue full (max_waiting=1)")}
    for t in e.trace:
        assert sorted(d.request for d in decisions(t, Ended)) == sorted(t.finished), f"step {t.step}"
    words = {s.request: (s.kind, s.why) for t in e.trace for s in sentences(t) if s.kind in ("finished", "refused")}
    assert words == {"long": ("finished", "max_tokens=6 reached"), "kept": ("finished", "aborted"),
                     "refused": ("refused", "queue full (max_waiting=1)")}


def test_a_stop_token_ending_keeps_the_token(tiny):
    free = run_checked(_one(tiny, greedy(8)))["r"].outputs[0].token_ids
    e = _one(tiny, greedy(8, stop_token_ids=[free[2]]))
    run_checked(e)
    (d,) = [d for t in e.trace for d in decisions(t, Ended)]
    assert d == Ended("r", "stop", "stop_token", free[2]) and explain(d) == f"stop token {free[2]}"


def _one(tiny, params: SamplingParams):
    e = tiny_engine(tiny, num_blocks=16, block_size=8)
    e.add_request("r", prompt(6), params)
    return e


# ---- words, and records on disk --------------------------------------------------------------------------------
@pytest.mark.parametrize("cause", typing.get_args(WaitCause))
def test_every_wait_cause_has_words(cause):
    said = explain(NotAdmitted("r", cause, need=3, have=2))
    assert said and "{" not in said


@pytest.mark.parametrize("cause, detail, words", [
    ("eos", 2, "EOS token 2"), ("stop_token", 7, "stop token 7"), ("stop_string", "\n\n", "stop string '\\n\\n'"),
    ("max_tokens", 16, "max_tokens=16 reached"), ("max_model_len", 2048, "max_model_len=2048 reached"),
    ("abort", None, "aborted"), ("rejected", "queue full (max_waiting=3)", "queue full (max_waiting=3)"),
    ("timeout", "waited 0.612s > max_queue_time=0.5s", "waited 0.612s > max_queue_time=0.5s"),
    ("error", "RuntimeError: boom", "RuntimeError: boom"),
])
def test_every_end_cause_has_words(cause, detail, words):
    assert {c for c in typing.get_args(EndCause)} >= {cause}
    reason = {"eos": "stop", "stop_token": "stop", "stop_string": "stop", "max_tokens": "length",
              "max_model_len": "length"}.get(cause, cause)
    assert explain(Ended("r", reason, cause, detail)) == words


def test_swap_words_name_the_copies():
    swap = Preempted("r2", "pool_full", "r1", "the most recently admitted running request", 57, swapped_blocks=4)
    assert explain(swap).endswith("; swapped out: 4 blocks (57 tokens) copied to host memory")
    full = Preempted("r2", "pool_full", "r2", "the most recently admitted running request", 57, host_full=True,
                     host_blocks_needed=4, host_blocks_free=1)
    assert explain(full) == ("pool full: it needed a block, and it is itself the most recently admitted running "
                             "request; recomputes: its 57 computed tokens are dropped (host pool full: 4 blocks "
                             "needed, 1 free)")
    back = Admitted("r2", 1, 4, 9, resumed="swap_in", swapped_blocks=4, swapped_tokens=57)
    assert explain(back) == ("resumes after preemption, swapping in 4 blocks (57 tokens): 1 tokens this step, 4 of 9 "
                             "free blocks")
    cached = Admitted("r3", 20, 2, 9, cached_tokens=32)
    assert explain(cached) == "20 tokens this step, 2 of 9 free blocks, 32 tokens from the prefix cache"


def test_decisions_survive_json_and_an_older_trace_still_narrates(tiny, tmp_path):
    e = tiny_engine(tiny, num_blocks=6, block_size=8, chunked_prefill_size=16)
    e.add_request("a", prompt(20), greedy(20))
    e.add_request("b", prompt(15), greedy(20))
    run_checked(e)
    kinds = {d.kind for t in e.trace for d in t.decisions}
    assert kinds == {"admitted", "chunked", "preempted", "not_admitted", "ended"}
    for t in e.trace:
        for d in t.decisions:
            assert decision_from_dict(json.loads(json.dumps(asdict(d)))) == d
    old = asdict(e.trace[0]) | {"reasons": {"a": "a phrase from an older minfer"}}
    del old["decisions"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (back,) = load_trace(path)
    assert back.decisions == [] and narrate(back).startswith("step 0 · admitted a (prompt tokens 0–15 this step)")
