"""Incremental detokenization: the text a client may be shown after each token, and stop strings.

Tokens are not characters. A token's text can depend on its neighbours (a leading space, half of a
multi-byte character), so the simplest detokenizer that is always right decodes the request's whole output
again after every token and streams what is new. Two things must wait until they are *settled*:

* a trailing "\\ufffd": the first bytes of a character whose other bytes come with the next token;
* while stop strings are set, the last ``len(stop) - 1`` characters: they may be the start of a stop string,
  and a client must never receive text that the stop string then removes.

So the streamed pieces always add up to the final text. Finding a stop string is this module's job (it is the
one that has the text); ending the request is the scheduler's (``Scheduler.finish``), as for every finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.model.tokenizer import Tokenizer
from minfer.request import Request
from minfer.types import FinishReason


@dataclass(slots=True)
class TextUpdate:
    """What one token added: the newly settled text, and the stop string it completed, if any."""

    new_text: str
    stop: str | None = None


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.streamed: dict[str, str] = {}  # request id → the text sent so far (the whole text, once ended)

    def update(self, req: Request, ending: FinishReason | None) -> TextUpdate:
        """Decode ``req``'s output after its newest token. ``ending``: why the request ends now, if it does --
        then all of its text is settled. Stop strings are sought in the new text unless it ends for another
        reason than its length (an EOS or a stop token already stopped it; an abort or a refusal added no
        token). A stop string found cuts the text there, and the request ends with it."""
        # BEGIN EXERCISE E12.2
        streamed = self.streamed.get(req.request_id, "")
        text = self.tokenizer.decode(req.output_token_ids)
        stops = req.params.stop
        hit = None
        if stops and ending in (None, "length"):
            for s in stops:  # only the new text can complete a stop string
                at = text.find(s, max(0, len(streamed) - len(s)))
                if at >= 0:
                    text, hit, ending = text[:at], s, "stop"
                    break
        settled = text
        if not ending:
            if stops:
                settled = settled[: max(0, len(settled) - max(map(len, stops)) + 1)]
            settled = settled.rstrip("\ufffd")
        new = settled[len(streamed):] if settled.startswith(streamed) else ""
        self.streamed[req.request_id] = text if ending else streamed + new
        return TextUpdate(new, hit)
        # END EXERCISE

    def text(self, request_id: str) -> str:
        """The text streamed so far."""
        return self.streamed.get(request_id, "")

    def pop(self, request_id: str) -> str:
        """The request's final text; forgets it."""
        return self.streamed.pop(request_id, "")
