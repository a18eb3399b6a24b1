"""The HTTP front end: an OpenAI-compatible FastAPI app over one ``EngineLoop``.

    POST /v1/completions        POST /v1/chat/completions      (streaming with ``"stream": true``)
    GET  /v1/models             GET  /v1/models/{id}           GET  /health    GET /version
    POST /tokenize              POST /detokenize               GET  /metrics   (Prometheus text, vLLM's names)

A request's life here: read the body (at most ``max_body_bytes``), parse it (``protocol.py``: shape only),
hand it to the loop, and wait for its **first output** before answering anything. Only then is the answer
known: the engine may refuse the request (a ``ValueError`` → 400 naming the field), turn it away because the
queue is full or it waited too long (→ 429 with ``Retry-After``), or start generating (→ 200, streamed as
server-sent events or returned whole). While it waits, the handler also watches the connection: a client
that goes away aborts its request, and the engine frees its KV blocks before its next step.

Streaming sends one event per engine step that gave the request a token (the text that token settled, see
``LLMEngine._detokenize``), the finish reason in the last, an optional usage event, and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import minfer
from minfer.request import RequestOutput
from minfer.serve.loop import EngineFailure, EngineLoop, ShuttingDown
from minfer.serve.prometheus import ServerMetrics
from minfer.serve.protocol import (
    Generation,
    RequestError,
    chunk,
    detokenize_answer,
    parse_chat,
    parse_completion,
    parse_json,
    refusal,
    response,
    sse,
    tokenize_answer,
    usage_chunk,
)

log = logging.getLogger("minfer.serve")
T = TypeVar("T")
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a prompt of a few hundred thousand characters


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


def create_app(loop: EngineLoop, served_model: str | Sequence[str] | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES, retry_after: int = 1) -> FastAPI:
    """The app serving ``loop.engine`` as ``served_model`` (default: the engine's model); several names are
    aliases, the first the main one (see ``protocol.served_name``). The app's lifespan starts and stops the
    loop. ``retry_after``: seconds a 429 answer asks the client to wait."""
    engine = loop.engine
    names = (served_model,) if isinstance(served_model, str) else tuple(served_model or ())
    names = names or (engine.config.model,)
    model = names[0]
    metrics = ServerMetrics(model, engine.max_model_len)
    loop.step_hooks.append(metrics.observe)
    ids = itertools.count()
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await loop.start()
        yield
        await loop.stop()

    app = FastAPI(title="minfer", summary="an OpenAI-compatible server over minfer's engine", lifespan=lifespan)
    app.state.loop, app.state.metrics = loop, metrics

    def error(e: RequestError) -> JSONResponse:
        metrics.error(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:  # 404, 405 ...
        # a wrong method keeps Starlette's Allow header (the methods the path takes): 405 invalid_request_error
        return error(RequestError(f"{exc.detail}: {request.method} {request.url.path}", status=exc.status_code,
                                  headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        return error(RequestError(f"internal error: {exc!r}", status=500))

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = loop.alive and loop.accepting
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": minfer.__version__}

    def card(name: str) -> dict[str, Any]:
        vocab = engine.model.config.vocab_size if engine.model is not None else None
        return {"id": name, "object": "model", "created": started, "owned_by": "minfer", "root": engine.config.model,
                "parent": None, "max_model_len": engine.max_model_len, "vocab_size": vocab}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card(name) for name in names]}

    @app.get("/v1/models/{model_id:path}")  # ids may hold slashes (org/model)
    async def one_model(model_id: str) -> Response:
        if model_id not in names:
            return error(RequestError.unknown_model(model_id, names))
        return JSONResponse(card(model_id))

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            body = parse_json(await read_body(request, max_body_bytes))
            return JSONResponse(tokenize_answer(body, names, engine.tokenizer, engine.max_model_len))
        except RequestError as e:
            return error(e)
        except ClientGone:
            return Response(status_code=499)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        try:
            body = parse_json(await read_body(request, max_body_bytes))
            return JSONResponse(detokenize_answer(body, names, engine.tokenizer))
        except RequestError as e:
            return error(e)
        except ClientGone:
            return Response(status_code=499)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def generate(request: Request, kind: str) -> Response:
        arrival = time.perf_counter()
        created = int(time.time())
        try:
            body = parse_json(await read_body(request, max_body_bytes))
            gen = parse_completion(body, names) if kind == "completion" else \
                parse_chat(body, names, engine.max_model_len)
            rid = f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{next(ids)}"
            outputs = loop.generate(rid, gen.prompt, gen.params, messages=gen.messages, priority=gen.priority,
                                    tenant=gen.tenant, fill_max_tokens=gen.fill_max_tokens, arrival=arrival)
            first = await until_disconnect(request, outputs.__anext__())
            if (refused := refusal(first, retry_after)) is not None:
                await outputs.aclose()
                return error(refused)
            if gen.stream:
                return StreamingResponse(stream(gen, rid, created, first, outputs), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
            final = await until_disconnect(request, last(first, outputs))
            return JSONResponse(response(gen, rid, created, gen.model, final.outputs[0].text, final),
                                headers={"X-Request-Id": rid})
        except RequestError as e:
            return error(e)
        except (ValueError, TypeError) as e:  # the engine refused the request: its message names the field
            return error(RequestError.from_engine(e))
        except ShuttingDown as e:
            return error(RequestError(str(e), status=503, code="shutting_down"))
        except EngineFailure as e:
            return error(RequestError(str(e), status=500, code="error"))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: nginx's "client closed request"

    async def stream(gen: Generation, rid: str, created: int, first: RequestOutput,
                     outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        # a client that disconnects cancels this generator (Starlette listens for it): closing `outputs`
        # then aborts the request
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            final = first
            yield sse(chunk(gen, rid, created, gen.model, first, first=True))
            try:
                async for out in outputs:
                    final = out
                    yield sse(chunk(gen, rid, created, gen.model, out, first=False))
            except EngineFailure as e:
                yield sse(RequestError(str(e), status=500, code="error").body())
            else:
                if gen.include_usage:
                    yield sse(usage_chunk(gen, rid, created, gen.model, final))
            yield sse("[DONE]")

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    too_big = RequestError(f"the request body exceeds the limit of {limit} bytes", status=413,
                           code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise too_big
            parts.append(part)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(parts)


async def last(first: RequestOutput, outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = first
    async for out in outputs:
        final = out
    return final


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` unless the client disconnects first: then cancel it (closing the request's output
    stream, which aborts it) and raise ``ClientGone``."""
    task = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read: what comes next is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
