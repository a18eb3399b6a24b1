"""Hidden cases of E13.1 (verification): greedy acceptance equals the reference's on many random cases, and
rejection sampling reproduces random target distributions over three guesses (statistically, fixed seeds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import torch

from minfer.exercises.checks.ch13 import close_to, outputs
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_functions
from minfer.spec.verify import accept_greedy


def check_verification(t: Tester) -> None:
    with t.case("300 random greedy cases (0 to 6 guesses, right and wrong): exactly the reference's tokens",
                hint="keep guesses while they equal target[i]; then target[len(kept)]"):
        reference = reference_functions("E13.1")["accept_greedy"]
        gen = torch.Generator().manual_seed(13)
        for case in range(300):
            k = int(torch.randint(0, 7, (1,), generator=gen))
            target = torch.randint(0, 4, (k + 1,), generator=gen).tolist()
            guesses = [g if bool(torch.rand((), generator=gen) < 0.7) else (g + 1) % 4 for g in target[:k]]
            mine, ref = accept_greedy(list(guesses), list(target)), reference(list(guesses), list(target))
            assert mine == ref, f"case {case}: guesses {guesses}, target {target}: got {mine}, the reference {ref}"

    with t.case("random target distributions, three guesses: the first token, and the second after a kept first, "
                "as the target gives them",
                hint="each position i: keep the guess with probability probs[i, guess]; else draw from row i without "
                     "it and stop; all kept: draw from the last row"):
        for seed in range(3):
            gen = torch.Generator().manual_seed(100 + seed)
            probs = torch.rand(4, 5, generator=gen) ** 2
            probs /= probs.sum(dim=-1, keepdim=True)
            guesses = torch.randint(0, 5, (3,), generator=gen).tolist()
            outs = outputs(guesses, probs, seed=seed)
            p0, p1 = probs[0].tolist(), probs[1].tolist()
            pairs = Counter((o[0], o[1] if o[0] == guesses[0] else None) for o in outs)
            expected: dict[Hashable, float] = {(x, None): p0[x] for x in range(5) if x != guesses[0]}
            expected |= {(guesses[0], y): p0[guesses[0]] * p1[y] for y in range(5)}
            close_to(pairs, expected, len(outs), f"random distribution {seed}, guesses {guesses}")
            for o in outs:
                kept = next((i for i, (a, b) in enumerate(zip(o, guesses)) if a != b), min(len(o), len(guesses)))
                assert len(o) == kept + 1, (f"guesses {guesses}: the result {o} goes on after its first token that "
                                            "is not the guess (or stops short of the bonus token)")
