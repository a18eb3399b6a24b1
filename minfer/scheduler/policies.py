"""Priority and weighted-fair queue policies, refinements of FCFS (``policy.Policy``)."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

from minfer.request import Request
from minfer.scheduler.policy import Policy


class PriorityPolicy(Policy):
    """Lower ``priority`` value first; ties by arrival. A preempted request goes ahead of its equals
    that never ran. A heap with lazy deletion keeps push/pop O(log n) for long simulated queues."""

    name = "priority"

    def __init__(self) -> None:
        self.heap: list[tuple[Any, ...]] = []
        self.live: dict[str, int] = {}  # request id → sequence number of its current heap entry
        self.counter = itertools.count()

    def _push(self, req: Request, front: bool) -> None:
        seq = next(self.counter)
        heapq.heappush(self.heap, (req.priority, 0 if front else 1, req.arrival_time, seq, req))
        self.live[req.request_id] = seq

    def push(self, req: Request) -> None:
        self._push(req, front=False)

    def push_front(self, req: Request) -> None:
        self._push(req, front=True)

    def _is_live(self, entry: tuple[Any, ...]) -> bool:
        return self.live.get(entry[-1].request_id) == entry[3]

    def _clean(self) -> None:
        while self.heap and not self._is_live(self.heap[0]):
            heapq.heappop(self.heap)

    def peek(self) -> Request | None:
        self._clean()
        return self.heap[0][-1] if self.heap else None

    def pop(self) -> Request:
        self._clean()
        req = heapq.heappop(self.heap)[-1]
        del self.live[req.request_id]
        return req

    def remove(self, req: Request) -> None:
        del self.live[req.request_id]  # the stale heap entry is dropped when it reaches the top

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self.heap, key=lambda e: e[:4]) if self._is_live(e))

    def rank(self, req: Request) -> Any:
        return (req.priority, req.admitted_seq)


class FairPolicy(Policy):
    """Weighted fair queuing between tenants by tokens served: the next request comes from the
    tenant with the least ``served / weight``, so a tenant that floods the queue only delays itself.
    Within a tenant, first come first served."""

    name = "fair"

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights
        self.queues: dict[str | None, deque[Request]] = defaultdict(deque)
        self.served: dict[str | None, float] = defaultdict(float)  # tokens computed, per tenant
        self.size = 0

    def weight(self, tenant: str | None) -> float:
        return self.weights.get(tenant, 1.0) if tenant is not None else 1.0

    def _tenant(self) -> str | None:
        candidates = [t for t, q in self.queues.items() if q]
        return min(candidates, key=lambda t: (self.served[t] / self.weight(t), self.queues[t][0].arrival_time))

    def push(self, req: Request) -> None:
        if not self.queues[req.tenant] and self.served:
            # a tenant returning from idle starts at the least service among active tenants: no banked credit
            active = [self.served[t] / self.weight(t) for t, q in self.queues.items() if q]
            if active:
                self.served[req.tenant] = max(self.served[req.tenant], min(active) * self.weight(req.tenant))
        self.queues[req.tenant].append(req)
        self.size += 1

    def push_front(self, req: Request) -> None:
        self.queues[req.tenant].appendleft(req)
        self.size += 1

    def peek(self) -> Request | None:
        return self.queues[self._tenant()][0] if self.size else None

    def pop(self) -> Request:
        self.size -= 1
        return self.queues[self._tenant()].popleft()

    def remove(self, req: Request) -> None:
        self.queues[req.tenant].remove(req)
        self.size -= 1

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Request]:
        return (r for q in list(self.queues.values()) for r in q)

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        self.served[req.tenant] += num_tokens
