"""A failing step fails one request, not the batch: how the engine finds whom a failure belongs to.

A step runs many requests in one forward pass, so one request's bad input -- or a kernel bug only its shape
triggers -- would fail everyone's step. ``execute_isolating_faults`` runs the step; if the executor raises, it runs
halves of the step until each failing part is a single request, and returns the others' tokens with, per failed
request, what went wrong (the engine ends those with finish reason ``"error"``). Re-running a chunk rewrites the
same K/V slots with the same values, so a retry is safe.

Two failures are nobody's fault, and go on up: a step that only copied KV blocks (no request to blame, and the
engine's state is unsure), and code not written yet -- an exercise's stub raises ``NotImplementedError`` in
every step, and the student must see its message rather than every request ending with ``"error"``.
"""

from __future__ import annotations

import logging

from minfer.executor import Executor, ModelOutput
from minfer.plan import ScheduledChunk, SchedulerOutput
from minfer.request import Request

logger = logging.getLogger(__name__)


def unwritten(error: BaseException) -> bool:
    """Did ``error`` come from a ``NotImplementedError`` -- code not written yet, such as an exercise's stub (a
    Triton kernel's arrives wrapped in the interpreter's error)? That fails every step, not one request."""
    e: BaseException | None = error
    for _ in range(20):  # a chain of causes, never a long one
        if e is None:
            return False
        if isinstance(e, NotImplementedError):
            return True
        e = e.__cause__ or e.__context__
    return False


def failure(req: Request, error: Exception) -> str:
    """The message a failed request ends with (its ``stop_reason``); logged with the traceback."""
    message = f"{type(error).__name__}: {error}"
    logger.error("request %r failed in a step and ends with finish reason 'error' (the others go on): %s",
                 req.request_id, message, exc_info=error)
    return message


def execute_isolating_faults(executor: Executor, out: SchedulerOutput) -> tuple[ModelOutput, dict[Request, str]]:
    """Run the step. If it fails, find the requests it fails for -- halves of the step are run until each failing
    part is one request -- and serve the rest. Their chunks leave ``out`` (they computed nothing); returns the
    result and, per failed request, what went wrong. K/V a failed attempt wrote is written again, identically,
    by the attempt that succeeds."""
    try:
        return executor.execute(out), {}
    except Exception as first:
        if not out.chunks:  # only block copies failed: no request to blame, the engine's state is unsure
            raise
        if unwritten(first):
            raise  # code not written yet (an exercise's stub): no request is to blame
        if len(out.chunks) == 1:  # nothing to halve: it is this request's step
            req = out.chunks.pop().request
            return ModelOutput(), {req: failure(req, first)}
    merged, failed = ModelOutput(), {}
    durations: list[float | None] = []

    def run(chunks: list[ScheduledChunk]) -> None:
        try:
            r = executor.execute(SchedulerOutput(chunks=chunks))
        except Exception as e:
            if len(chunks) == 1:
                failed[chunks[0].request] = failure(chunks[0].request, e)
                return
            run(chunks[: len(chunks) // 2])
            run(chunks[len(chunks) // 2 :])
            return
        merged.sampled.update(r.sampled)
        merged.accepted.update(r.accepted)
        merged.proposed.update(r.proposed)
        durations.append(r.duration)

    # the halves carry no KV block copies: the first attempt made them before its forward pass failed
    run(out.chunks[: len(out.chunks) // 2])
    run(out.chunks[len(out.chunks) // 2 :])
    out.chunks = [c for c in out.chunks if c.request not in failed]
    if durations and all(d is not None for d in durations):
        merged.duration = sum(durations)  # type: ignore[arg-type]
    return merged, failed
