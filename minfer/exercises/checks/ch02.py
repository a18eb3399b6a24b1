"""Chapter 02: static batching's slot accounting (E2.1) and the share of decode rows that do useful work (E2.2)."""

from __future__ import annotations

import random

from minfer.baselines import slot_accounting, static_batching
from minfer.exercises.checks.common import tiny_model
from minfer.exercises.harness import Measurement, Tester
from minfer.workload import fixed_mix

KEYS = ("batch_slots", "useful", "padding", "idle_slots", "bubbles")


def step(useful: int, padding: int = 0, idle: int = 0, bubbles: int = 0, slots: int = 4) -> dict[str, int]:
    return {"batch_slots": slots, "useful": useful, "padding": padding, "idle_slots": idle, "bubbles": bubbles}


def same(got: list[dict[str, int]], want: list[dict[str, int]], what: str) -> None:
    assert isinstance(got, list) and all(isinstance(s, dict) for s in got), "slot_accounting returns a list of dicts"
    assert len(got) == len(want), f"{what}: {len(got)} forward passes, expected {len(want)}"
    for i, (step, w) in enumerate(zip(got, want)):
        g = {k: step.get(k) for k in KEYS}
        assert g == w, f"{what}, forward pass {i}: {g}, expected {w}"


def check_slot_accounting(t: Tester) -> None:
    with t.case("one batch of 3 in 4 slots: prompts 5, 3, 8 and answers 4, 1, 2",
                hint="the prefill pads every prompt to the longest and samples each row's first token; then one "
                     "decode pass per further token of the longest answer (3 here), finished rows still computing"):
        same(slot_accounting([5, 3, 8], [4, 1, 2], 4),
             [step(16, padding=8, idle=1), step(2, idle=1, bubbles=1), step(1, idle=1, bubbles=2),
              step(1, idle=1, bubbles=2)], "prompts 5, 3, 8")

    with t.case("answers of one token: the prefill samples it, no decode pass follows",
                hint="the first output token comes out of the prefill pass"):
        same(slot_accounting([4, 4], [1, 1], 2), [step(8, slots=2)], "two one-token answers")

    with t.case("two full batches, then a third with one request (idle slots)",
                hint="a batch runs until its own longest answer is done; the last batch may be smaller"):
        got = slot_accounting([2, 2, 3, 3, 6], [2, 3, 1, 2, 2], 2)
        same(got, [step(4, slots=2), step(2, slots=2), step(1, bubbles=1, slots=2),
                   step(6, slots=2), step(1, bubbles=1, slots=2),
                   step(6, idle=1, slots=2), step(1, idle=1, slots=2)], "5 requests in batches of 2")

    with t.case("300 random workloads: the totals every accounting must satisfy",
                hint="useful = all prompt tokens + all answer tokens but the first of each; a decode pass's "
                     "useful + bubbles + idle slots = the batch size"):
        rng = random.Random(2)
        for _ in range(300):
            n, size = rng.randint(1, 12), rng.randint(1, 5)
            prompts = [rng.randint(1, 20) for _ in range(n)]
            outs = [rng.randint(1, 9) for _ in range(n)]
            steps = slot_accounting(prompts, outs, size)
            batches = [range(i, min(i + size, n)) for i in range(0, n, size)]
            assert len(steps) == sum(max(outs[i] for i in b) for b in batches), (
                f"{len(steps)} passes for prompts {prompts}, answers {outs}, batches of {size}")
            assert sum(s["useful"] for s in steps) == sum(prompts) + sum(outs) - n, (
                f"useful token computations for prompts {prompts}, answers {outs}, batches of {size}")
            at = 0
            for b in batches:  # a prefill pass, then decode passes
                prefill, decodes = steps[at], steps[at + 1 : at + max(outs[i] for i in b)]
                at += 1 + len(decodes)
                assert prefill["useful"] + prefill["padding"] == len(b) * max(prompts[i] for i in b), (
                    f"prefill of prompts {[prompts[i] for i in b]}: {prefill}")
                for d in decodes:
                    assert d["useful"] + d["bubbles"] + d["idle_slots"] == size and min(d.values()) >= 0, (
                        f"a decode pass of answers {[outs[i] for i in b]} in batches of {size}: {d}")

    with t.case("static_batching on the tiny model reports your accounting for the passes it ran",
                hint="static_batching calls slot_accounting; its result.steps are yours"):
        token_prompts = [[5 + i] * length for i, length in enumerate([12, 3, 30, 7, 19])]
        answers = [6, 15, 2, 9, 11]
        result = static_batching(tiny_model(), token_prompts, answers, batch_size=2)
        same(result.steps, slot_accounting([len(p) for p in token_prompts], answers, 2), "static_batching's steps")
        assert [len(o) for o in result.outputs] == answers


def measure_decode_share() -> Measurement:
    work = fixed_mix(n=24, prompt_median=64, output_median=40, max_prompt=256, max_output=96, seed=2)
    steps = slot_accounting([w.prompt_len for w in work], [w.output_len for w in work], 8)
    decode = [s for s in steps if s["padding"] == 0 and s["useful"] + s["bubbles"] > 0]
    useful, rows = sum(s["useful"] for s in decode), sum(s["useful"] + s["bubbles"] for s in decode)
    share = useful / rows
    longest = [max(w.output_len for w in work[i : i + 8]) for i in range(0, 24, 8)]
    return Measurement(
        round(100 * share, 1), "%", abs_tol=10,
        explain=f"{useful} of {rows} decode rows did useful work: {share:.0%}. Each batch of 8 decodes until its "
                f"longest answer is done ({', '.join(map(str, longest))} tokens in the three batches), while the "
                "median answer is about 40 tokens: with long-tailed lengths, most rows finish early and keep "
                "computing. Guesses near 90% picture similar lengths; the lesson is that one long answer holds "
                "the whole batch.")
