"""Chapter 12: temperature, top-k and top-p (E12.1, E12.4), the incremental detokenizer (E12.2) and a streamed
event of the server (E12.3)."""

from __future__ import annotations

import json
import math

import torch

from minfer.detokenizer import Detokenizer
from minfer.exercises.checks.common import tiny_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.model.tokenizer import ByteTokenizer
from minfer.request import CompletionOutput, Request, RequestMetrics, RequestOutput, SamplingParams
from minfer.sampler import filter_logits
from minfer.serve.protocol import Generation, chunk, sse
from minfer.types import FinishReason

INF = float("-inf")


# ---- E12.1: temperature, top-k and top-p ---------------------------------------------------------------------
def kept(logits: list[float], temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0) -> list[int]:
    """The tokens one row keeps (not -inf), by index."""
    row = torch.tensor([logits])
    out = filter_logits(row, torch.tensor([temperature]), torch.tensor([top_k or len(logits)]), torch.tensor([top_p]))
    return [i for i, x in enumerate(out[0].tolist()) if x != INF]


def check_filter_logits(t: Tester) -> None:
    probs = [0.1, 0.3, 0.05, 0.3, 0.25]  # sorted: tokens 1 and 3 (0.3 each), 4 (0.25), 0 (0.1), 2 (0.05)
    logits = [math.log(p) for p in probs]

    with t.case("temperature divides the logits; no filter keeps every token, in the vocabulary's order",
                hint="logits / temperature[:, None]: one temperature per row"):
        row = torch.tensor([[2.0, -1.0, 0.5, 4.0]])
        out = filter_logits(row, torch.tensor([0.5]), torch.tensor([4]), torch.tensor([1.0]))
        assert torch.allclose(out, row / 0.5), f"temperature 0.5: {out.tolist()}, expected {(row / 0.5).tolist()}"

    with t.case("top-k keeps the k highest logits, wherever they sit in the vocabulary",
                hint="sort each row descending, mask ranks >= k, and scatter back to the original positions"):
        assert kept(logits, top_k=2) == [1, 3], f"top_k=2 kept {kept(logits, top_k=2)}, expected tokens [1, 3]"
        assert kept(logits, top_k=3) == [1, 3, 4], f"top_k=3 kept {kept(logits, top_k=3)}"
        assert kept(logits, top_k=1)[0] in (1, 3) and len(kept(logits, top_k=1)) == 1

    with t.case("top-p keeps the most likely tokens while the mass before each is below p: the favourite always stays",
                hint="a token stays if cumsum - its own probability < top_p (not cumsum <= top_p, which can drop all)"):
        for p, want in ((0.5, [1, 3]), (0.55, [1, 3]), (0.65, [1, 3, 4]), (0.2, [1]), (0.9, [0, 1, 3, 4]),
                        (1.0, [0, 1, 2, 3, 4])):
            got = kept(logits, top_p=p)
            if p == 0.2:
                assert len(got) == 1 and got[0] in (1, 3), f"top_p=0.2 kept {got}: only the favourite should stay"
            else:
                assert got == want, f"top_p={p} kept {got}, expected {want}"

    with t.case("top-p applies to what top-k kept, renormalized",
                hint="softmax over the top-k survivors (the others at -inf) before the cumulative sum"):
        got = kept(logits, top_k=3, top_p=0.7)  # 0.3, 0.3, 0.25 renormalized: 0.353, 0.353, 0.294
        assert got == [1, 3], f"top_k=3, top_p=0.7 kept {got}, expected [1, 3] (0.353 + 0.353 >= 0.7)"

    with t.case("the temperature comes before top-p: a colder distribution keeps fewer tokens",
                hint="scale by the temperature first, then compute the probabilities that top-p reads"):
        assert kept(logits, temperature=2.0, top_p=0.8) == [0, 1, 3, 4], kept(logits, temperature=2.0, top_p=0.8)
        assert kept(logits, temperature=0.25, top_p=0.8) == [1, 3], kept(logits, temperature=0.25, top_p=0.8)

    with t.case("a batch: every row with its own temperature, top-k and top-p",
                hint="index every per-row knob with [:, None] so that it broadcasts over that row only"):
        rows = torch.tensor([logits, logits[::-1], logits])
        out = filter_logits(rows, torch.tensor([1.0, 1.0, 0.5]), torch.tensor([2, 5, 5]), torch.tensor([1.0, 0.6, 1.0]))
        masks = [[i for i, x in enumerate(r) if x != INF] for r in out.tolist()]
        assert masks == [[1, 3], [0, 1, 3], [0, 1, 2, 3, 4]], f"tokens kept per row: {masks}"
        assert torch.allclose(out[2], rows[2] / 0.5), "row 3 (no filter, temperature 0.5): the scaled logits"


def measure_top_p_kept() -> Measurement:
    logits = [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]
    n = len(kept(logits, temperature=0.5, top_p=0.9))
    cold = (torch.tensor(logits) / 0.5).softmax(-1)
    return Measurement(
        n, "tokens", abs_tol=0,
        explain=f"{n} tokens. Temperature 0.5 doubles the gaps: logits 6, 4, 2, ... so each token is e^2 = 7.4 times "
                f"less likely than the one before. The probabilities are {cold[0]:.3f}, {cold[1]:.3f}, {cold[2]:.3f}, "
                f"...: the favourite alone has {cold[0]:.3f}, below 0.9, so the second stays; with it the mass is "
                f"{cold[0] + cold[1]:.3f}, past 0.9, so the third goes. At temperature 1 the same top_p keeps 3 "
                "tokens: a cold distribution concentrates the mass, and top-p then keeps fewer.")


# ---- E12.2: the incremental detokenizer ------------------------------------------------------------------------
def feed(text: str, stop: list[str] | None = None, ending_at: int | None = None,
         ending: FinishReason = "length") -> tuple[list[str], str | None, str]:
    """Feed ``text``'s bytes, one token each, to a Detokenizer (ByteTokenizer: id = byte + 3). The request ends
    after token ``ending_at`` (1-based), with ``ending``. Returns the pieces sent, the stop string found (if any)
    and the final text."""
    tok = ByteTokenizer()
    detok = Detokenizer(tok)
    req = Request("q", [5], SamplingParams(max_tokens=100, stop=stop), arrival_time=0.0)
    ids = tok.encode(text)
    pieces, hit = [], None
    for i, token in enumerate(ids, 1):
        req.append_token(token)
        update = detok.update(req, ending if i == ending_at else None)
        pieces.append(update.new_text)
        if update.stop is not None:
            hit = update.stop
            break
        if i == ending_at:
            break
    return pieces, hit, detok.pop("q")


def check_detokenizer(t: Tester) -> None:
    with t.case("plain ASCII: each token's text is sent at once, and the pieces add up to the text",
                hint="decode the whole output and send what it adds to what was streamed"):
        pieces, hit, final = feed("Hi there", ending_at=8)
        assert pieces == list("Hi there") and hit is None, f"pieces {pieces}"
        assert final == "Hi there", f"final text {final!r}"

    with t.case("half a character is held back until its last byte arrives",
                hint="strip a trailing '\\ufffd' from the settled text while the request goes on"):
        pieces, _, final = feed("a\u00e9b\U0001f642", ending_at=None)
        assert "\ufffd" not in "".join(pieces), f"pieces {pieces}: a replacement character was sent"
        assert pieces == ["a", "", "\u00e9", "b", "", "", "", "\U0001f642"], f"pieces {pieces}"

    with t.case("a stop string is never sent: the pieces stop before it, the text is cut there, the update names it",
                hint="look for the stop string in the new text; hold back len(stop) - 1 characters until settled"):
        pieces, hit, final = feed("one two STOP three", stop=["STOP"])
        assert hit == "STOP", f"the stop string found: {hit!r}, expected 'STOP'"
        assert final == "one two ", f"final text {final!r}, expected 'one two '"
        assert "".join(pieces) == "one two ", f"pieces {pieces} add up to {''.join(pieces)!r}, expected 'one two '"
        assert "S" not in "".join(pieces), "part of the stop string was sent"

    with t.case("held-back text that turns out not to be a stop string is sent later, and all of it at the end",
                hint="settled = text[: len(text) - (max stop length - 1)]; when the request ends, all is settled"):
        pieces, hit, final = feed("a STOR b STO", stop=["STOP"], ending_at=12)
        assert hit is None and final == "a STOR b STO", f"final text {final!r}"
        assert "".join(pieces) == "a STOR b STO", f"pieces {pieces}: the held-back text must come out at the end"
        assert pieces[:4] == ["", "", "", "a"], f"pieces {pieces[:4]}: with a 4-character stop string, 3 wait"

    with t.case("several stop strings: the longest sets how much waits; the first one found in the list ends it",
                hint="hold back max(len(s) for s in stop) - 1 characters; try the stop strings in order"):
        pieces, hit, final = feed("xx END yy", stop=["##", "END"])
        assert hit == "END" and final == "xx ", f"stop {hit!r}, text {final!r}"
        assert "".join(pieces) == "xx "

    with t.case("a request that ends for another reason (EOS, abort) is not cut by a stop string",
                hint="look for stop strings only when ending is None or 'length'"):
        _, hit, final = feed("ab STOP", stop=["STOP"], ending_at=7, ending="stop")
        assert hit is None and final == "ab STOP", f"ended by EOS: text {final!r}, stop {hit!r}"
        _, hit, final = feed("ab STOP", stop=["STOP"], ending_at=7, ending="length")
        assert hit == "STOP" and final == "ab ", f"ended by its length: text {final!r}, stop {hit!r}"

    with t.case("the engine: the streamed pieces add up to the final text, with stop strings, on the tiny model",
                hint="what update returns is what the engine streams: out.new_text"):
        engine = tiny_engine(num_blocks=64)
        for i, stop in enumerate((None, ["e"], ["ab", "q"])):
            engine.add_request(f"r{i}", [10 + i] * 5, SamplingParams(max_tokens=40, temperature=1.0, seed=i,
                                                                       stop=stop))
        streamed: dict[str, str] = {}
        texts: dict[str, str] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                streamed[out.request_id] = streamed.get(out.request_id, "") + out.new_text
                if out.finished:
                    texts[out.request_id] = out.outputs[0].text
        assert streamed == texts, f"streamed {streamed}, final {texts}"


# ---- E12.3: a streamed event ------------------------------------------------------------------------------------
def output(new_text: str, reason: FinishReason | None = None, stop_reason: str | None = None) -> RequestOutput:
    done = CompletionOutput(0, "so far" + new_text, [4, 5], reason, stop_reason)
    return RequestOutput("cmpl-1", None, [1, 2], [done], finished=reason is not None,
                         metrics=RequestMetrics(arrival_time=0.0), new_text=new_text)


def check_stream_chunk(t: Tester) -> None:
    chat = Generation("chat", SamplingParams(), stream=True)
    completion = Generation("completion", SamplingParams(), stream=True)

    with t.case("sse: 'data: ' and the JSON, then a blank line; a string goes as it is",
                hint="f'data: {...}\\n\\n'.encode(): two newlines end an event"):
        assert sse("[DONE]") == b"data: [DONE]\n\n", f"sse('[DONE]') is {sse('[DONE]')!r}"
        event = {"a": [1, None], "b": "x"}
        assert sse(event) == b"data: " + json.dumps(event).encode() + b"\n\n", f"sse(dict) is {sse(event)!r}"

    with t.case("a completion chunk: text_completion, the new text, no finish reason while it runs",
                hint="choices: [{index: 0, logprobs: None, finish_reason: None, text: out.new_text}]"):
        got = chunk(completion, "cmpl-1", 1700, "m", output(" Paris"), first=True)
        head = {k: got.get(k) for k in ("id", "object", "created", "model")}
        assert head == {"id": "cmpl-1", "object": "text_completion", "created": 1700, "model": "m"}, f"chunk {got}"
        assert len(got.get("choices", ())) == 1, f"one choice, got {got.get('choices')}"
        choice = {k: got["choices"][0].get(k, "(missing)") for k in ("index", "logprobs", "finish_reason", "text")}
        assert choice == {"index": 0, "logprobs": None, "finish_reason": None, "text": " Paris"}, f"choice {choice}"

    with t.case("a chat chunk: chat.completion.chunk with a delta; the role only in the first",
                hint="delta = {'role': 'assistant', 'content': ...} if first else {'content': ...}"):
        first = chunk(chat, "c-1", 5, "m", output("Hel"), first=True)
        later = chunk(chat, "c-1", 5, "m", output("lo"), first=False)
        assert first["object"] == "chat.completion.chunk", f"object {first['object']!r}"
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}, first["choices"][0]
        assert later["choices"][0]["delta"] == {"content": "lo"}, later["choices"][0]
        assert "text" not in later["choices"][0], "a chat chunk carries a delta, not text"

    with t.case("the last chunk: its finish reason, and the stop reason only there",
                hint="add stop_reason to the choice only when finish_reason is not None"):
        running = chunk(completion, "cmpl-1", 5, "m", output("a"), first=False)["choices"][0]
        assert "stop_reason" not in running, f"a running chunk has a stop_reason: {running}"
        last = chunk(completion, "cmpl-1", 5, "m", output("", "stop", "###"), first=False)["choices"][0]
        assert last["finish_reason"] == "stop" and last["stop_reason"] == "###", f"last choice {last}"
        length = chunk(chat, "c", 5, "m", output("!", "length"), first=False)["choices"][0]
        assert length["finish_reason"] == "length" and length["stop_reason"] is None, f"last choice {length}"

    with t.case("include_usage: every chunk has usage None (the counts come in a chunk of their own)",
                hint="body['usage'] = None when gen.include_usage; no usage key otherwise"):
        with_usage = Generation("chat", SamplingParams(), stream=True, include_usage=True)
        assert chunk(with_usage, "c", 5, "m", output("x"), first=True)["usage"] is None
        assert "usage" not in chunk(chat, "c", 5, "m", output("x"), first=True), "usage without include_usage"

    with t.case("the server: a streamed completion from the tiny model parses as events, ending in [DONE], and its "
                "pieces add up to the answer",
                hint="each event is one sse() of one chunk(); the first is the request's first output"):
        import httpx

        from minfer.serve import ServerThread

        server = ServerThread(tiny_engine(num_blocks=64)).start()
        try:
            body = {"prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=30) as r:
                raw = b"".join(r.iter_bytes())
            plain = httpx.post(f"{server.url}/completions", json={**body, "stream": False}, timeout=30).json()
        finally:
            server.stop()
        events = raw.split(b"\n\n")
        assert events[-1] == b"" and events[-2] == b"data: [DONE]", f"the stream ends {raw[-40:]!r}"
        chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert text == plain["choices"][0]["text"], f"streamed {text!r}, answered {plain['choices'][0]['text']!r}"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
