"""Prompt lookup (vLLM's ``method="ngram"``): guess that the text goes on as it did the last time it said this.

Take the text's last ``n`` tokens; find where those same ``n`` tokens occurred before, in the prompt or in the
output so far; guess that the next tokens are the ones that followed there. It costs no model at all -- a
search over the request's own tokens -- and it is right surprisingly often on the tasks that copy from their
input: editing a document, extracting fields, answering with quotes, re-writing code. On free-flowing text it
is mostly wrong, and a wrong guess costs only the slot it took in the verification pass.

Longer matches predict better, so ``n`` starts at ``max_n`` and shrinks to ``min_n``. Among the earlier
occurrences the latest one wins: nearby text predicts what comes next better than text far back.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` guessed next tokens for ``token_ids`` (prompt + output so far): what followed the latest earlier
    occurrence of its last ``n`` tokens, for the largest ``n`` in ``max_n .. min_n`` that occurs; [] if none does."""
    tokens = list(token_ids)
    end = len(tokens)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        tail = tokens[end - n:]
        # the latest start i < end - n with tokens[i:i+n] == tail (the tail itself, at end - n, does not count)
        for i in range(end - n - 1, -1, -1):
            if tokens[i:i + n] == tail:
                return tokens[i + n:i + n + k]
    return []
