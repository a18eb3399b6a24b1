"""Chapter 12, hidden: filter_logits (E12.1) and the detokenizer (E12.2) against the reference on random inputs."""

from __future__ import annotations

import random

import torch

from minfer.detokenizer import Detokenizer
from minfer.exercises.harness import Tester
from minfer.exercises.standin import StandIns
from minfer.model.tokenizer import ByteTokenizer
from minfer.request import Request, SamplingParams
from minfer.sampler import filter_logits


def with_reference(exercise: str, run, seed: int):
    """``run(seed)`` with the reference of ``exercise`` standing in."""
    with StandIns() as swaps:
        swaps.install([exercise], always=True)
        return run(seed)


def random_batches(seed: int) -> list[torch.Tensor]:
    """Which tokens each row of 40 random batches keeps: mixed knobs per row, ties and a large vocabulary too."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    out = []
    for _ in range(40):
        rows, vocab = rng.randrange(1, 6), rng.choice([2, 7, 50, 1000])
        logits = torch.randn(rows, vocab, generator=gen) * rng.choice([0.1, 1.0, 5.0])
        if rng.random() < 0.3:
            logits = logits.round()  # ties
        temperature = torch.tensor([rng.choice([0.3, 0.7, 1.0, 1.8]) for _ in range(rows)])
        top_k = torch.tensor([rng.choice([1, 2, 5, vocab]) if rng.random() < 0.7 else vocab for _ in range(rows)])
        top_p = torch.tensor([rng.choice([0.1, 0.5, 0.9, 0.99, 1.0]) for _ in range(rows)])
        out.append(filter_logits(logits, temperature, top_k.clamp(max=vocab), top_p) > float("-inf"))
    return out


def random_streams(seed: int) -> list[tuple[list[str], str | None, str]]:
    """Random texts with multi-byte characters and stop strings, fed byte by byte: (pieces, stop, final text)."""
    rng = random.Random(seed)
    tok = ByteTokenizer()
    alphabet = ["a", "b", "S", "T", " ", "\u00e9", "\u65e5", "\U0001f642"]
    out = []
    for i in range(60):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 25)))
        stop = rng.choice([None, ["ST"], ["b\u00e9", "TT"], ["\U0001f642a"]])
        ids = tok.encode(text)
        end = rng.randrange(1, len(ids) + 1) if rng.random() < 0.5 else None
        detok, req = Detokenizer(tok), Request(f"q{i}", [5], SamplingParams(max_tokens=200, stop=stop), 0.0)
        pieces, hit = [], None
        for n, token in enumerate(ids, 1):
            req.append_token(token)
            update = detok.update(req, rng.choice(["length", "stop"]) if n == end else None)
            pieces.append(update.new_text)
            if update.stop is not None or n == end:
                hit = update.stop
                break
        out.append((pieces, hit, detok.pop(f"q{i}")))
    return out


def check_filter_logits(t: Tester) -> None:
    with t.case("40 random batches (ties, large vocabularies, every knob mixed per row): the tokens the reference "
                "keeps",
                hint="compare the kept tokens row by row for the batch named above"):
        for seed in (0, 1):
            mine, ref = random_batches(seed), with_reference("E12.1", random_batches, seed)
            for i, (a, b) in enumerate(zip(mine, ref)):
                assert torch.equal(a, b), f"seed {seed}, batch {i}: kept {a.sum(-1).tolist()} tokens per row, the " \
                                          f"reference {b.sum(-1).tolist()}"


def check_detokenizer(t: Tester) -> None:
    with t.case("60 random byte streams with multi-byte characters and stop strings: the reference's pieces",
                hint="compare the pieces sent after each token for the stream named above"):
        for seed in (0, 1):
            mine, ref = random_streams(seed), with_reference("E12.2", random_streams, seed)
            for i, (a, b) in enumerate(zip(mine, ref)):
                assert a == b, f"seed {seed}, stream {i}: sent {a[0]}, stop {a[1]!r}; the reference sent {b[0]}, " \
                               f"stop {b[1]!r}"
