"""Chapter 13: verification of guesses (E13.1) and the tokens a step on the copy task (E13.2).

The greedy cases are exact. The sampled ones are statistical: a correct ``accept_sampled`` may use its random
numbers in any order, so the check does not compare its tokens with the reference's; it draws thousands of times
from one seeded generator and compares the *frequencies* with what rejection sampling must give -- the target's
own distribution -- within a bound of about five standard deviations (fixed seeds: the same verdict every run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from minfer.exercises.checks.common import greedy, tiny_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.spec.verify import accept_greedy, accept_sampled

DRAWS = 4000  # per distribution: a frequency's standard deviation is at most 0.008


def rows(*probs: Sequence[float]) -> torch.Tensor:
    """Target probabilities, one row per position, as the runner passes them: float32 on the CPU."""
    return torch.tensor(probs, dtype=torch.float32)


def outputs(guesses: list[int], probs: torch.Tensor, seed: int = 0, n: int = DRAWS) -> list[list[int]]:
    """``n`` calls of the student's ``accept_sampled`` on one seeded generator; each result checked for its shape."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        got = accept_sampled(list(guesses), probs, gen)
        assert isinstance(got, list) and all(isinstance(t, int) for t in got), (
            f"accept_sampled returned {got!r}: a list of ints (token ids) is expected")
        assert 1 <= len(got) <= len(guesses) + 1, (
            f"accept_sampled({guesses}, ...) returned {len(got)} tokens: a step yields between 1 and "
            f"len(guesses) + 1 = {len(guesses) + 1}")
        out.append(got)
    return out


def close_to(counts: Mapping[Any, int], expected: Mapping[Any, float], n: int, what: str) -> None:
    """Every outcome's frequency within five standard deviations (plus a little) of its expected probability."""
    for key in set(counts) | set(expected):
        p = expected.get(key, 0.0)
        freq = counts.get(key, 0) / n
        bound = 5 * (p * (1 - p) / n) ** 0.5 + 2 / n
        assert abs(freq - p) <= bound, (
            f"{what}: outcome {key!r} came {freq:.3f} of the time over {n} seeded draws, the target gives it "
            f"{p:.3f} (allowed: +-{bound:.3f}). Observed: "
            + ", ".join(f"{k!r}: {c / n:.3f}" for k, c in sorted(counts.items(), key=str)))


def first_tokens(guesses: list[int], probs: torch.Tensor, seed: int = 0) -> Counter[Hashable]:
    return Counter(o[0] for o in outputs(guesses, probs, seed))


def check_verification(t: Tester) -> None:
    with t.case("greedy: every guess right -- all kept, and the last row's token as a bonus",
                hint="target has len(guesses) + 1 entries: after k kept guesses, append target[k]"):
        got = accept_greedy([5, 6, 7], [5, 6, 7, 9])
        assert got == [5, 6, 7, 9], f"accept_greedy([5, 6, 7], target=[5, 6, 7, 9]) = {got}, expected [5, 6, 7, 9]"

    with t.case("greedy: the first guess wrong -- only the target's own token",
                hint="guess i is compared with target[i], the argmax of the row *before* it"):
        got = accept_greedy([5, 6, 7], [4, 6, 7, 9])
        assert got == [4], f"accept_greedy([5, 6, 7], target=[4, 6, 7, 9]) = {got}, expected [4]"

    with t.case("greedy: a wrong guess in the middle -- stop there, even if a later one agrees",
                hint="everything after the first disagreement was computed after a wrong token: throw it away"):
        got = accept_greedy([5, 6, 7, 8], [5, 3, 7, 8, 2])
        assert got == [5, 3], f"accept_greedy([5, 6, 7, 8], target=[5, 3, 7, 8, 2]) = {got}, expected [5, 3]"
        got = accept_greedy([1, 1], [1, 2, 3])
        assert got == [1, 2], f"accept_greedy([1, 1], target=[1, 2, 3]) = {got}, expected [1, 2]"

    with t.case("greedy: no guesses -- one token, as plain decoding gives",
                hint="a request with no guess still gets its step's token: target[0]"):
        got = accept_greedy([], [42])
        assert got == [42], f"accept_greedy([], target=[42]) = {got}, expected [42]"

    with t.case("sampled: a certain guess is always kept, an impossible one never, and a rejected guess is never "
                "the token that replaces it",
                hint="keep guess i when a uniform draw is below probs[i, guess]; on rejection draw from row i with "
                     "the guess's probability set to 0"):
        certain = rows([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0])
        for got in outputs([1], certain, n=200):
            assert got == [1, 3], f"guess 1 has probability 1 and the last row is one-hot at 3: got {got}"
        never = rows([0.3, 0.0, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25])
        for got in outputs([1, 2], never, n=200):
            assert len(got) == 1 and got[0] in (0, 2), (
                f"guess 1 has probability 0 at the first position: it is always rejected, the token comes from "
                f"row 0 (0 or 2) and nothing follows; got {got}")
        half = rows([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])
        for got in outputs([0], half, n=400):
            assert got in ([0, 2], [1]), (f"guess 0 with p = 0.5 beside token 1 (0.5): kept, then the bonus 2, or "
                                          f"rejected and replaced by 1 -- never by the rejected 0 itself; got {got}")

    with t.case("sampled: the first token is distributed as the target's first row, for a likely and an unlikely "
                "guess",
                hint="accept with probability p(guess) -- not 1 - p(guess), not 'if p(guess) > 0.5'; the residual is "
                     "p without the guess, renormalized: then each token x comes with probability p(x)"):
        p = [0.1, 0.3, 0.2, 0.4]
        probs = rows(p, [0.25, 0.25, 0.25, 0.25])
        for guess in (1, 3, 0):
            close_to(first_tokens([guess], probs, seed=guess), dict(enumerate(p)), DRAWS,
                     f"first token, guess {guess}")

    with t.case("sampled: the bonus token after every guess kept is drawn from the last row",
                hint="all k guesses kept: one more token from probs[k] -- not from probs[k - 1], and not omitted"):
        probs = rows([0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4])
        outs = outputs([2, 1], probs, seed=5)
        assert all(o[:2] == [2, 1] for o in outs), "both guesses have probability 1: both are always kept"
        close_to(Counter(o[2] for o in outs if len(o) == 3), {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}, DRAWS,
                 "the bonus token")

    with t.case("sampled: two guesses -- the pair of first tokens is distributed as the target says",
                hint="guess i is compared with row i (the target after the text and the guesses before it); stop at "
                     "the first rejection"):
        p0, p1 = [0.2, 0.5, 0.1, 0.2], [0.4, 0.1, 0.3, 0.2]
        probs = rows(p0, p1, [0.7, 0.1, 0.1, 0.1])
        guesses = [1, 2]
        outs = outputs(guesses, probs, seed=11)
        pairs = Counter((o[0], o[1] if o[0] == guesses[0] else None) for o in outs)
        expected: dict[Hashable, float] = {(x, None): p0[x] for x in range(4) if x != guesses[0]}
        expected |= {(guesses[0], y): p0[guesses[0]] * p1[y] for y in range(4)}
        close_to(pairs, expected, DRAWS, "(first token, second token if the first guess was kept)")
        for o in outs:
            if o[0] != guesses[0]:
                assert len(o) == 1, f"the first guess was rejected (replaced by {o[0]}), yet more followed: {o}"

    with t.case("sampled: the same generator seed gives the same tokens",
                hint="draw every random number from the generator passed in (torch.rand(..., generator=generator))"):
        probs = rows([0.2, 0.3, 0.1, 0.4], [0.3, 0.3, 0.2, 0.2], [0.1, 0.6, 0.2, 0.1])
        a, b = outputs([3, 1], probs, seed=7, n=300), outputs([3, 1], probs, seed=7, n=300)
        assert a == b, "two runs from the same seed gave different tokens: use the generator passed in"
        assert len({tuple(o) for o in a}) > 3, "300 draws gave at most 3 different results: is anything random?"

    with t.case("the engine (tiny model) with ngram speculation: greedy output token for token the plain engine's, "
                "and more than one token in some steps",
                hint="the runner calls verify(), which calls accept_greedy with each row's argmax"):
        prompt = [10 + i % 7 for i in range(40)]  # a repeating prompt: prompt lookup finds guesses
        runs = []
        for spec in (None, {"method": "ngram", "num_speculative_tokens": 4}):
            engine = tiny_engine(speculative_config=spec)
            engine.add_request("a", prompt, greedy(24))
            engine.add_request("b", list(range(30, 60)), greedy(24))
            final = t.run(engine)
            runs.append({rid: o.outputs[0].token_ids for rid, o in final.items()})
        assert runs[1] == runs[0], f"with speculation the greedy tokens changed: {runs[1]} against {runs[0]}"
        from minfer.metrics import SpecDecodeStats

        stats = SpecDecodeStats.of(engine.trace)
        assert stats.num_draft_tokens > 0, "no guess was verified: the check's prompt should give prompt-lookup hits"


def measure_copy_acceptance() -> Measurement:
    from minfer.bench import speculative_copy

    run = speculative_copy(batch_sizes=(1,), rounds=1)[0]
    s = run.stats
    return Measurement(
        s.mean_acceptance_length, "tokens", rel_tol=0.25,
        explain=f"Measured here: {s.num_drafts} speculating steps verified {s.num_draft_tokens} guesses and kept "
                f"{s.num_accepted_tokens} ({s.acceptance_rate:.0%}): {s.mean_acceptance_length:.2f} tokens a step, of "
                "at most 6 (5 guesses and the token every step gives). Copying is prompt lookup's best case: once "
                "the answer has started, its last few tokens occur in the prompt, and what followed them there is "
                "what the model writes next. The misses are where the answer leaves the text -- its first tokens, a "
                "changed word, the end -- and steps where the guesses ran past a rejected one. 1 would mean no "
                "guess ever kept; 6 every guess always kept. The greedy tokens are the plain engine's either way.")
