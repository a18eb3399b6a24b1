"""Queue timeouts and SLO-aware load shedding: refusing work that can no longer be served in time.

Both act only on requests that have **never been scheduled**. A preempted request waiting to resume has
already cost prefill work and may already be streaming tokens to its client; dropping it would waste that.

* ``max_queue_time``: a request still waiting for its first admission that long is finished with
  ``"timeout"`` -- or, with ``queue_timeout_action="promote"``, raised one priority level and given a
  fresh ``max_queue_time`` at its new level (aging, so low priorities cannot starve forever).
* ``ttft_slo``: a waiting request whose *predicted* time to first token already exceeds the SLO is shed
  now (``"rejected"``) rather than served late. Serving it would spend prefill time that the requests
  behind it need to meet *their* SLO: under overload, serving late turns one miss into many.

The prediction is deliberately simple: the time already waited, plus every prompt token the engine must
compute before this request's first token -- prompts still being prefilled, the requests ahead of it in
the policy's admission order, and its own -- divided by the rate at which the queue drains (``DrainRate``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from minfer.config import EngineConfig
from minfer.request import Request


@dataclass(slots=True)
class DrainRate:
    """Prompt tokens computed per second while requests were left waiting.

    Only *backlogged* steps count. When nothing waits, the prompt tokens a step computes measure demand,
    not capacity; a backlogged step measures what the engine can do -- including a step that computed no
    prompt tokens at all because every sequence slot or block was taken (the queue did not drain).
    Exponentially decayed sums of tokens and seconds (not a mean of per-step rates), so long steps weigh
    as much as they last."""

    decay: float = 0.95  # per step: about the last 20 backlogged steps count
    tokens: float = 0.0
    seconds: float = 0.0

    def observe(self, prefill_tokens: int, duration: float, backlogged: bool) -> None:
        if backlogged and duration > 0:
            self.tokens = self.decay * self.tokens + prefill_tokens
            self.seconds = self.decay * self.seconds + duration

    @property
    def rate(self) -> float | None:
        """Tokens per second, or None before any backlogged step computed a prompt token (no prediction)."""
        return self.tokens / self.seconds if self.tokens > 0 else None


def expired_requests(cfg: EngineConfig, waiting: Iterable[Request], running: Iterable[Request], drain: DrainRate,
                     queued_since: Mapping[str, float], now: float) -> Iterator[tuple[Request, str, str]]:
    """``(request, action, reason)`` for each waiting request to time out, promote or shed at ``now``;
    ``action`` is ``"timeout"``, ``"promote"`` or ``"rejected"``. ``waiting`` is in the order the policy
    would admit them; ``queued_since`` has when a promoted request's queue-time clock restarted."""
    slo = cfg.ttft_slo
    rate = drain.rate if slo is not None else None
    # prompt tokens the engine computes before anything waiting: prompts (or recomputes) still in prefill
    ahead = sum(r.num_tokens - r.num_computed_tokens for r in running
                if r.num_computed_tokens < r.num_tokens - 1)
    for req in list(waiting):
        if req.metrics.first_scheduled_time is not None:  # preempted: it ran before, it is never dropped
            ahead += req.num_tokens
            continue
        waited = now - queued_since.get(req.request_id, req.arrival_time)
        if cfg.max_queue_time is not None and waited > cfg.max_queue_time:
            why = f"waited {waited:.3f}s > max_queue_time={cfg.max_queue_time}s"
            if cfg.queue_timeout_action == "finish":
                yield req, "timeout", why
                continue  # it leaves the queue: it is ahead of nobody
            yield req, "promote", why
        elif rate is not None and slo is not None:
            since_arrival = now - req.arrival_time
            predicted = since_arrival + (ahead + req.num_tokens) / rate  # the prompts before it, then its own
            if predicted > slo:
                yield req, "rejected", (f"shed: predicted TTFT {predicted:.3f}s > ttft_slo={slo}s "
                                        f"({since_arrival:.3f}s waited)")
                continue  # it leaves the queue: it is ahead of nobody
        ahead += req.num_tokens
