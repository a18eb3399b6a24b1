"""The serving loop: one engine stepped in one worker thread, many HTTP requests waiting on it.

A web server is asynchronous: thousands of connections wait on one event loop, each idle most of the time.
The engine is the opposite: one synchronous ``step()`` after another, each a forward pass that keeps a CPU
(or GPU) busy for tens of milliseconds. Called on the event loop, a step would freeze every connection for
that long -- no request accepted, no token sent, no disconnect noticed. So the two are kept apart:

* **The engine belongs to one worker thread.** Every call into it -- ``add_request``, ``abort_request``,
  ``step`` -- runs there, so it never has two callers at once and needs no lock of its own. (PyTorch
  releases Python's global lock while it computes, so the event loop keeps running meanwhile.)
* **Arrivals join between steps.** The event loop only *queues* operations (add this request, abort that
  one); before each step the worker applies every queued operation, then steps. An abort is applied before
  the next step is scheduled, so the request's blocks are free for that step.
* **Outputs go to per-request queues.** Each step's outputs are handed back to the event loop, which puts
  each into the ``asyncio.Queue`` of its request; the HTTP handler awaiting that queue streams it out.

The engine's clock (``engine.now``) follows the wall clock here: the loop moves it forward to the time
since the loop started before every step, and a request's arrival time is when its HTTP request came in.
So the engine's own TTFT includes the wait for the step boundary, and its ``StepTrace`` times line up
with what the client measures (``engine_time`` converts a ``time.perf_counter()`` reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from minfer.request import RequestOutput, SamplingParams

log = logging.getLogger("minfer.serve")

StepHook = Callable[[Any, list[RequestOutput]], None]  # (engine, this step's outputs), in the worker thread


class ShuttingDown(Exception):
    """The server is stopping: no new requests."""


class EngineFailure(Exception):
    """A step raised: the requests in flight were aborted and are answered with this."""


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: str | list[int] | None
    messages: list[dict[str, str]] | None
    params: SamplingParams
    priority: Any
    tenant: Any
    arrival: float  # engine clock
    fill_max_tokens: bool  # max_tokens: whatever the context and the pool leave after the prompt
    error: BaseException | None = None  # set by the worker: why the engine refused it


@dataclass(slots=True)
class _Abort:
    request_id: str


class EngineLoop:
    """Drives ``engine`` for an asyncio server. ``await start()`` inside the server's event loop, then
    ``generate(...)`` per request; ``await stop()`` at shutdown.

    ``step_hooks`` run in the worker thread after every step with ``(engine, outputs)`` -- the Prometheus
    metrics, and in tests ``check_invariants()``. ``stepper`` is what a step calls (``engine.step``; a
    dashboard's ``Recorder.step`` to record the served run). ``errors`` keeps what a step or a hook raised:
    the loop logs it and goes on.
    """

    def __init__(self, engine: Any, step_hooks: tuple[StepHook, ...] | list[StepHook] = ()) -> None:
        self.engine = engine
        self.step_hooks: list[StepHook] = list(step_hooks)
        self.stepper: Callable[[], list[RequestOutput]] = engine.step
        self.errors: list[BaseException] = []
        self.accepting = True
        self.num_steps = 0
        self._offset = engine.now - time.perf_counter()  # engine clock = perf_counter + offset
        self._ops: deque[_Add | _Abort] = deque()  # appended by the event loop, taken by the worker
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minfer-engine")
        self._lock = threading.Lock()  # held by the worker while it uses the engine; see paused()
        self._busy = False  # the engine had unfinished requests after the last step
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # ---- time ----------------------------------------------------------------------------------------
    def engine_time(self, perf_counter: float | None = None) -> float:
        """A ``time.perf_counter()`` reading (default: now) on the engine's clock."""
        return (time.perf_counter() if perf_counter is None else perf_counter) + self._offset

    # ---- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="minfer-engine-loop")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def num_in_flight(self) -> int:
        """Requests whose answer is not finished yet."""
        return len(self._streams)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; let those in flight finish for up to ``timeout`` seconds, then abort the rest
        (each still gets its final output, finish reason ``"abort"``)."""
        self.accepting = False
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for rid in list(self._streams):
            self.abort(rid)
        deadline = time.monotonic() + 5.0  # aborts are applied at the next step boundary
        while self._streams and time.monotonic() < deadline and self.alive:
            await asyncio.sleep(0.01)

    async def stop(self, timeout: float = 0.0) -> None:
        """``drain(timeout)``, then stop the loop and its worker thread."""
        await self.drain(timeout)
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self._worker.shutdown(wait=True)

    @contextlib.contextmanager
    def paused(self) -> Iterator[Any]:
        """Hold the engine between two steps (from another thread, e.g. a notebook drawing a dashboard):
        blocks until the current step ends; no step runs until the ``with`` block ends. Yields the engine."""
        with self._lock:
            yield self.engine

    # ---- requests ------------------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams, *,
                       messages: list[dict[str, str]] | None = None, priority: Any = 0, tenant: Any = None,
                       fill_max_tokens: bool = False,
                       arrival: float | None = None) -> AsyncGenerator[RequestOutput, None]:
        """Queue a request and yield its outputs as steps produce them, the last with ``finished``.

        The engine's refusal (``ValueError``/``TypeError`` from ``add_request``) is raised from the first
        ``__anext__``. Closing the generator early -- the client went away -- aborts the request."""
        if not self.accepting or self._wake is None:
            raise ShuttingDown("the server is shutting down")
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self._ops.append(_Add(request_id, prompt, messages, params, priority, tenant,
                              self.engine_time(arrival), fill_max_tokens))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # refused, or failed: nothing left to abort
                    raise item
                if item.finished:
                    finished = True
                    self._streams.pop(request_id, None)  # no longer in flight, even before it is read
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer stopped early (disconnect, cancellation): free its blocks
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request at the next step boundary (a no-op if it has finished)."""
        self._ops.append(_Abort(request_id))
        if self._wake is not None:
            self._wake.set()

    # ---- the loop ------------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            if not self._ops and not self._busy:
                if self._stopping:
                    return
                self._wake.clear()
                if not self._ops:
                    await self._wake.wait()
                continue
            ops = [self._ops.popleft() for _ in range(len(self._ops))]
            try:
                outputs, failure, self._busy = await loop.run_in_executor(self._worker, self._work, ops)
            except RuntimeError:  # the worker is gone (interpreter shutting down)
                return
            for op in ops:  # refusals first: a refused request has no outputs
                if isinstance(op, _Add) and op.error is not None and op.request_id in self._streams:
                    self._streams[op.request_id].put_nowait(op.error)
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
            if failure is not None:  # every request still streaming was aborted by the failed step
                for queue in list(self._streams.values()):
                    queue.put_nowait(EngineFailure(f"engine step failed: {failure!r}"))

    def _work(self, ops: list[_Add | _Abort]) -> tuple[list[RequestOutput], BaseException | None, bool]:
        """In the worker thread: apply the queued operations, then one step. Never raises."""
        with self._lock:
            engine = self.engine
            engine.now = max(engine.now, self.engine_time())  # the engine's clock follows the wall clock
            for op in ops:
                if isinstance(op, _Abort):
                    engine.abort_request(op.request_id)
                else:
                    self._add(op)
            outputs: list[RequestOutput] = []
            failure = None
            if engine.has_unfinished_requests():
                try:
                    outputs = self.stepper()
                    self.num_steps += 1
                except Exception as e:  # a bug, not bad input: no request can be trusted to go on
                    log.exception("engine step failed; aborting every request in flight")
                    self.errors.append(e)
                    failure = e
                    for rid in list(self._streams):
                        with contextlib.suppress(Exception):
                            engine.abort_request(rid)
                for hook in self.step_hooks:
                    try:
                        hook(engine, outputs)
                    except Exception as e:
                        log.exception("step hook %r failed", hook)
                        self.errors.append(e)
            return outputs, failure, engine.has_unfinished_requests()

    def _check_context(self, op: _Add, prompt_len: int) -> None:
        """The OpenAI API's rule: prompt + max_tokens must fit the context (the engine alone would stop at the
        context's end). Without max_tokens (chat), as many as the context and the KV pool leave room for."""
        engine, p = self.engine, op.params
        limit = engine.max_model_len
        if prompt_len >= limit:
            return  # add_request refuses the prompt itself, and says so
        if op.fill_max_tokens:
            pool = engine.block_pool
            p.max_tokens = max(1, min(limit, pool.num_blocks * pool.block_size) - prompt_len)
        elif isinstance(p.max_tokens, int) and prompt_len + p.max_tokens > limit:
            raise ValueError(f"max_tokens={p.max_tokens} is too large: the prompt has {prompt_len} tokens and the "
                             f"context (max_model_len) {limit}, so at most {limit - prompt_len} can be generated")

    def _add(self, op: _Add) -> None:
        engine = self.engine
        try:
            prompt: str | list[int] | None = op.prompt
            if op.messages is not None:
                if engine.tokenizer is None:
                    raise ValueError("messages: this engine has no tokenizer (simulator): use /v1/completions "
                                     "with token ids")
                try:
                    prompt = engine.tokenizer.apply_chat_template(op.messages)
                except Exception as e:  # a template may refuse a conversation (roles out of order ...)
                    raise ValueError(f"messages: the chat template refused them: {e}") from None
            if isinstance(prompt, str) and engine.tokenizer is not None:
                prompt = engine.tokenizer.encode(prompt)
            if isinstance(prompt, list):
                self._check_context(op, len(prompt))
            engine.add_request(op.request_id, prompt, op.params, priority=op.priority, tenant=op.tenant,
                               arrival_time=min(op.arrival, engine.now))
        except (ValueError, TypeError) as e:
            op.error = e
        except Exception as e:  # anything else a request causes fails that request only
            log.exception("add_request failed for %s", op.request_id)
            op.error = ValueError(f"the request could not be added: {e!r}")
