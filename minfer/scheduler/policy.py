"""Queue policies: who waits in front, and who is preempted first.

A policy owns the waiting queue and ranks running requests. The scheduler asks it:

* ``peek``/``pop``: the next request to admit; ``push``: a new arrival; ``push_front``: a preempted
  request (it goes back ahead of requests that never ran: its client is already waiting on it);
* ``rank``: the sort key of the running list. Running requests are served in rank order and
  preemption takes the *last* one -- the least important, and among equals the most recently admitted
  (it has the least work to redo). A rank must not change while the request runs;
* ``on_scheduled``: every chunk a step computes (fair sharing counts service here);
* iterating the policy yields the waiting requests **in the order it would admit them** (load shedding
  predicts each request's wait from the work queued ahead of it in that order).

``Policy`` itself is first come, first served; ``policies.py`` refines it and registers every policy by
name (``POLICIES``), which is how ``EngineConfig(policy=...)`` finds one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from minfer.config import EngineConfig
from minfer.request import Request


class Policy:
    """First come, first served: the base every policy refines."""

    name = "fcfs"
    victim_rule = "the most recently admitted running request"  # who ``rank`` makes the preemption victim

    def __init__(self) -> None:
        self.queue: deque[Request] = deque()

    @classmethod
    def from_config(cls, config: EngineConfig) -> Policy:
        """Build the policy for an engine (a policy with settings reads them from the config)."""
        return cls()

    def push(self, req: Request) -> None:
        self.queue.append(req)

    def push_front(self, req: Request) -> None:
        self.queue.appendleft(req)

    def peek(self) -> Request | None:
        return self.queue[0] if self.queue else None

    def pop(self) -> Request:
        return self.queue.popleft()

    def remove(self, req: Request) -> None:
        self.queue.remove(req)

    def __len__(self) -> int:
        return len(self.queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.queue)

    def rank(self, req: Request) -> Any:
        """Sort key of the running list: smaller is more important; the largest is the preemption victim."""
        return req.admitted_seq

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        """Called for every chunk a step runs (fair sharing counts service here)."""

    def promote(self, req: Request) -> None:
        """Raise a waiting request one level (``queue_timeout_action="promote"``). FCFS has no levels: the
        request that waited longest is already at the front."""
        raise NotImplementedError(f"policy {self.name!r} has no levels to promote through; use 'priority'")
