"""Queue policies: who waits in front, and who is preempted first.

A policy owns the waiting queue and ranks running requests. The scheduler asks it three things:
``peek``/``pop`` the next request to admit, ``push_front`` a preempted one (it goes back ahead of
requests that never ran), and ``rank`` -- the order the running list is kept in. Running requests
are served in rank order and preemption takes the *last* one: the lowest priority, and among equals
the most recently admitted (it has the least work to redo).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from minfer.request import Request


class Policy:
    """First come, first served: the base every policy refines."""

    name = "fcfs"

    def __init__(self) -> None:
        self.queue: deque[Request] = deque()

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


def make_policy(name: str, tenant_weights: dict[str, float] | None = None) -> Policy:
    if name == "fcfs":
        return Policy()
    from minfer.scheduler.policies import FairPolicy, PriorityPolicy

    if name == "priority":
        return PriorityPolicy()
    if name == "fair":
        return FairPolicy(tenant_weights or {})
    raise ValueError(f"unknown policy {name!r}")
