"""The OpenAI wire format: request bodies in, response bodies and stream chunks out, errors as OpenAI shapes them.

Only the *shape* of a request is checked here -- is the body a JSON object, is ``messages`` a non-empty list
of ``{"role", "content"}``, is ``n`` 1 -- and the fields that exist only in the OpenAI API. Every sampling
field (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``...) goes to
``SamplingParams`` untouched, and ``priority``/``user`` to ``add_request`` as priority and tenant: the engine
validates them and its ``ValueError`` (which names the field) becomes the 400 answer. One validation, in
one place, for the Python API and the HTTP API alike.

Fields minfer does not implement (``logprobs``, ``echo``, penalties, tools...) are refused when a client
sets them to anything but their neutral value, rather than silently ignored; fields this module does not
know at all are ignored, as vLLM does, so clients that send vendor extensions still work.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minfer.request import RequestOutput, SamplingParams

# sampling fields passed straight to SamplingParams (OpenAI's names, plus vLLM's extensions minfer has)
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos")
# every field the engine validates, for naming the culprit of its error messages (``param`` of the body)
ENGINE_FIELDS = (*SAMPLING_FIELDS, "prompt", "priority", "tenant", "request_id", "arrival_time")
# OpenAI features and vLLM extensions minfer does not have: refused unless the value is neutral (None, false, 0, "",
# [], {}, or the feature's own "off" in NEUTRAL). vLLM's bench client sends repetition_penalty 1.0 with every request
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty",
               "logit_bias", "tools", "tool_choice", "functions", "function_call", "best_of", "audio",
               "prediction", "min_tokens", "repetition_penalty", "min_p")
NEUTRAL = {"best_of": 1, "repetition_penalty": 1}
REFUSED = ("rejected", "timeout")  # finished by the engine before they ran: the queue was full, shed, timed out


class RequestError(Exception):
    """An answer other than 200, with OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
             413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, error_type: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.headers = headers or {}
        self.type = error_type or self.TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def unknown_model(cls, model: str, served: Sequence[str]) -> RequestError:
        """404 as OpenAI answers it: ``invalid_request_error``, code ``model_not_found``."""
        return cls(f"The model `{model}` does not exist: this server serves {', '.join(map(repr, served))}",
                   status=404, param="model", code="model_not_found", error_type="invalid_request_error")

    @classmethod
    def from_engine(cls, err: Exception) -> RequestError:
        """The engine refused a request (``ValueError``/``TypeError``): 400, the field its message names."""
        message = str(err) or type(err).__name__
        m = re.match(r"\W*(\w+)", message)
        return cls(message, param=m[1] if m and m[1] in ENGINE_FIELDS else None)


@dataclass(slots=True)
class Generation:
    """One parsed request: what to generate, and how to answer."""

    kind: str  # "completion" or "chat"
    params: SamplingParams
    prompt: str | list[int] | None = None  # completions
    messages: list[dict[str, str]] | None = None  # chat: turned into a prompt by the chat template
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts
    priority: Any = 0  # validated by the engine
    tenant: Any = None
    fill_max_tokens: bool = False  # max_tokens not given (chat): up to the context length the prompt leaves
    model: str = ""  # the name the answer reports (see ``served_name``)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise RequestError("the request body nests too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _typed(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    """``body[name]`` if it is absent, null or of JSON type ``kind``; else a 400 naming the field."""
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise RequestError(f"{name} must be {what}, got {json.dumps(value)[:80]}", param=name)
    return value


def served_name(body: dict[str, Any], served: str | Sequence[str]) -> str:
    """vLLM's rule for the ``model`` field: it may be left out (or empty), which means the first served name;
    otherwise it must be one of the served names (``--served-model-name`` takes several, aliases of one model),
    and the answer reports the name the client asked for. Anything else is a 404."""
    names = (served,) if isinstance(served, str) else tuple(served)
    model = _typed(body, "model", str, "a string")
    if not model:
        return names[0]
    if model not in names:
        raise RequestError.unknown_model(model, names)
    return model


def _common(body: dict[str, Any], kind: str, served: str | Sequence[str], default_max_tokens: int) -> Generation:
    """The fields completions and chat share."""
    model = served_name(body, served)
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise RequestError(f"n must be 1: minfer generates one sequence per request, got {json.dumps(n)[:40]}",
                           param="n")
    for name in UNSUPPORTED:
        value = body.get(name)
        if value not in (None, False, 0, "", [], {}) and not (name in NEUTRAL and value == NEUTRAL[name]):
            raise RequestError(f"{name} is not supported by minfer (got {json.dumps(value)[:60]})", param=name)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise RequestError("response_format: only {\"type\": \"text\"} is supported", param="response_format")
    stream = bool(_typed(body, "stream", bool, "true or false"))
    options = _typed(body, "stream_options", dict, "an object")
    include_usage = False
    if options is not None:
        if not stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = bool(_typed(options, "include_usage", bool, "true or false"))
    tenant = _typed(body, "user", str, "a string")  # OpenAI's end-user id: minfer's tenant (policy="fair")
    fields = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
    if kind == "chat" and body.get("max_completion_tokens") is not None:  # the newer name of max_tokens
        if "max_tokens" in fields:
            raise RequestError("give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
        fields["max_tokens"] = body["max_completion_tokens"]
    fill = "max_tokens" not in fields  # chat without max_tokens: as long as the context allows (set at add)
    fields.setdefault("max_tokens", default_max_tokens)
    try:
        params = SamplingParams(**fields)  # the engine validates the values at add_request
    except (TypeError, ValueError) as e:
        raise RequestError.from_engine(e) from None
    priority = body.get("priority")
    return Generation(kind, params, model=model, stream=stream, include_usage=include_usage,
                      priority=0 if priority is None else priority, tenant=tenant,
                      fill_max_tokens=fill and kind == "chat")


def parse_completion(body: dict[str, Any], served_model: str | Sequence[str]) -> Generation:
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (or a list of one of either)."""
    gen = _common(body, "completion", served_model, default_max_tokens=16)  # OpenAI's default for completions
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise RequestError(f"prompt: one prompt per request (got a batch of {len(prompt)})", param="prompt")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise RequestError("prompt must be a string or a list of token ids", param="prompt")
    gen.prompt = prompt  # the engine checks the ids (integers within the vocabulary) and the length
    return gen


def parse_chat(body: dict[str, Any], served_model: str | Sequence[str], max_model_len: int) -> Generation:
    """``POST /v1/chat/completions``: ``messages`` is a non-empty list of ``{"role", "content"}``; content is a
    string or a list of text parts. Without ``max_tokens`` a reply may run to the model's context length."""
    gen = _common(body, "chat", served_model, default_max_tokens=max_model_len)  # lowered at add, see fill_max_tokens
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects",
                           param="messages")
    gen.messages = [_message(m, i) for i, m in enumerate(messages)]
    return gen


def _message(m: Any, i: int) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object with role and content", param="messages")
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str) or not role:
        raise RequestError(f"{where}.role must be a non-empty string", param="messages")
    if isinstance(content, list):  # [{"type": "text", "text": "..."}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                               "supported", param="messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or a list of text parts", param="messages")
    return {"role": role, "content": content}


# ---- answers ---------------------------------------------------------------------------------------------
def usage(out: RequestOutput) -> dict[str, int]:
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(out: RequestOutput) -> str | None:
    """OpenAI's ``stop``/``length``; minfer's own reasons (``abort``, ``error``...) as they are."""
    return out.outputs[0].finish_reason if out.finished else None


def refusal(out: RequestOutput, retry_after: int) -> RequestError | None:
    """A request that ended before its first token without being served: 429 if the engine refused it
    (queue full, shed, timed out), 500 if it failed. ``None`` for anything that was served."""
    c = out.outputs[0]
    if not out.finished or c.token_ids or c.finish_reason in ("stop", "length", "abort"):
        return None
    why = str(c.stop_reason) if c.stop_reason is not None else c.finish_reason
    if c.finish_reason in REFUSED:
        return RequestError(f"request {c.finish_reason}: {why}", status=429, code=c.finish_reason,
                            headers={"Retry-After": str(retry_after)})
    return RequestError(f"request failed: {why}", status=500, code=c.finish_reason)


def response(gen: Generation, rid: str, created: int, model: str, text: str, final: RequestOutput) -> dict:
    """The non-streaming answer."""
    c = final.outputs[0]
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason(final),
                              "stop_reason": c.stop_reason}
    if gen.kind == "chat":
        obj = "chat.completion"
        choice["message"] = {"role": "assistant", "content": text}
    else:
        obj = "text_completion"
        choice["text"] = text
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(final)}


def chunk(gen: Generation, rid: str, created: int, model: str, out: RequestOutput, first: bool) -> dict:
    """One streamed event: this step's new text (and the finish reason, on the last)."""
    # BEGIN EXERCISE E12.3
    reason = finish_reason(out)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if reason is not None:
        choice["stop_reason"] = out.outputs[0].stop_reason
    if gen.kind == "chat":
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        delta["content"] = out.new_text
        choice["delta"] = delta
        obj = "chat.completion.chunk"
    else:
        choice["text"] = out.new_text
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if gen.include_usage:
        body["usage"] = None  # every chunk has the key; the last one (after the finish) carries the counts
    return body
    # END EXERCISE


def usage_chunk(gen: Generation, rid: str, created: int, model: str, final: RequestOutput) -> dict:
    obj = "chat.completion.chunk" if gen.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(final)}


def sse(data: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    # BEGIN EXERCISE E12.3
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
    # END EXERCISE


# ---- /tokenize and /detokenize (vLLM's endpoints, its request and response shapes) ------------------------
def tokenize_answer(body: dict[str, Any], served: Sequence[str], tokenizer: Any, max_model_len: int) -> dict:
    """``POST /tokenize``: ``{"prompt": str}`` or ``{"messages": [...]}`` (rendered by the chat template, as a chat
    request would be) → ``{"count", "max_model_len", "tokens", "token_strs"}``. The ids are the ones the engine
    would run for the same text: a client counts its tokens against ``max_model_len`` before it sends."""
    served_name(body, served)
    if tokenizer is None:
        raise RequestError("this engine has no tokenizer (simulator)", param="prompt")
    as_strings = bool(_typed(body, "return_token_strs", bool, "true or false"))
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects",
                               param="messages")
        if _typed(body, "add_generation_prompt", bool, "true or false") is False:
            raise RequestError("add_generation_prompt: minfer's chat template always adds it", param="messages")
        try:
            ids = list(tokenizer.apply_chat_template([_message(m, i) for i, m in enumerate(messages)]))
        except RequestError:
            raise
        except Exception as e:
            raise RequestError(f"messages: the chat template refused them: {e}", param="messages") from None
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError("prompt (a string) or messages is required", param="prompt")
        specials = _typed(body, "add_special_tokens", bool, "true or false")
        hf = getattr(tokenizer, "hf", None)  # only a Hugging Face tokenizer adds special tokens of its own
        ids = list(hf.encode(prompt, add_special_tokens=False)) if specials is False and hf is not None \
            else list(tokenizer.encode(prompt))
    strs = None
    if as_strings:
        hf = getattr(tokenizer, "hf", None)
        strs = list(hf.convert_ids_to_tokens(ids)) if hf is not None else [tokenizer.decode([i]) for i in ids]
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize_answer(body: dict[str, Any], served: Sequence[str], tokenizer: Any) -> dict:
    """``POST /detokenize``: ``{"tokens": [ids]}`` → ``{"prompt": text}``."""
    served_name(body, served)
    if tokenizer is None:
        raise RequestError("this engine has no tokenizer (simulator)", param="tokens")
    ids = body.get("tokens")
    vocab = tokenizer.vocab_size
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab
                                            for i in ids):
        raise RequestError(f"tokens must be a list of token ids in [0, {vocab})", param="tokens")
    return {"prompt": tokenizer.decode(ids)}
