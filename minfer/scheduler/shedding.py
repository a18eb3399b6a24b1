"""Queue timeouts and SLO-aware load shedding: refusing work that can no longer be served in time.

A request that waits past ``max_queue_time`` is finished with ``"timeout"`` (or, with
``queue_timeout_action="promote"``, raised one priority level). With a ``ttft_slo``, a waiting request
whose *predicted* first-token time already exceeds the SLO is shed (``"rejected"``) now, rather than
served late: its prefill would cost the machine time that requests which can still meet their SLO need.

The prediction is deliberately simple: time already waited, plus the prompt tokens queued ahead of it
(and its own) divided by the prefill rate measured over recent steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from minfer.request import Request

if TYPE_CHECKING:
    from minfer.scheduler.scheduler import Scheduler


def expired_requests(sched: Scheduler, now: float) -> Iterator[tuple[Request, str, str]]:
    """``(request, action, reason)`` for each waiting request to drop or promote at time ``now``.
    Requests that already ran once (preempted, waiting to resume) are never dropped: work was invested."""
    cfg = sched.config
    rate = sched.prefill_rate
    queued_tokens = 0
    for req in list(sched.policy):
        if req.metrics.first_scheduled_time is not None:
            queued_tokens += req.num_tokens
            continue
        waited = now - sched.queued_since.get(req.request_id, req.arrival_time)
        if cfg.max_queue_time is not None and waited > cfg.max_queue_time:
            if cfg.queue_timeout_action == "promote":
                yield req, "promote", f"waited {waited:.3f}s > max_queue_time"
                continue
            yield req, "timeout", f"waited {waited:.3f}s > max_queue_time={cfg.max_queue_time}s"
            continue
        queued_tokens += req.num_tokens
        if cfg.ttft_slo is not None and rate:
            predicted = now - req.arrival_time + queued_tokens / rate
            if predicted > cfg.ttft_slo:
                queued_tokens -= req.num_tokens  # it leaves the queue: no longer ahead of anyone
                yield req, "rejected", (f"shed: predicted TTFT {predicted:.3f}s > ttft_slo={cfg.ttft_slo}s")
