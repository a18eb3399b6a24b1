"""Tokenizers behind one small interface, so the engine never cares which one it has.

``HFTokenizer`` wraps a Hugging Face tokenizer (the real models). ``ByteTokenizer`` is a dependency-free
stand-in for the tiny random test model: one token per UTF-8 byte plus three special tokens, with the
same ChatML template as SmolLM2, so string prompts and ``LLM.chat`` work in fast unit tests too.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

Message = dict[str, str]


class Tokenizer(Protocol):
    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def apply_chat_template(self, messages: list[Message]) -> list[int]: ...


class HFTokenizer:
    """A Hugging Face tokenizer seen through minfer's interface."""

    def __init__(self, tok: Any) -> None:
        self.hf = tok
        self.eos_token_id = int(tok.eos_token_id)
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[Message]) -> list[int]:
        """Render with the model's chat template (a string), then tokenize it without extra specials."""
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.hf.encode(text, add_special_tokens=False))


class ByteTokenizer:
    """UTF-8 bytes as tokens: id = byte + 3; 0 = <unk>, 1 = <|im_start|>, 2 = <|im_end|> (also EOS)."""

    SPECIALS = ("<unk>", "<|im_start|>", "<|im_end|>")
    _split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS[1:]) + ")")

    def __init__(self, vocab_size: int = 320) -> None:
        if vocab_size < 259:
            raise ValueError(f"ByteTokenizer needs vocab_size >= 259, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id = 2

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self.SPECIALS:
                ids.append(self.SPECIALS.index(part))
            else:
                ids.extend(b + 3 for b in part.encode("utf-8"))
        return ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[Message]) -> list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return self.encode(text + "<|im_start|>assistant\n")
