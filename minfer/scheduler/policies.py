"""Priority, shortest-job-first and weighted-fair queue policies, refinements of FCFS (``policy.Policy``), the
capstone's policy of the student's own design, and the registry ``POLICIES`` that maps each ``EngineConfig.policy``
name to its class. A new policy is a class here (or in a module of its own) plus one entry in ``POLICIES`` and its
name in ``minfer.types.PolicyName``."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

from minfer.config import EngineConfig
from minfer.request import Request
from minfer.scheduler.policy import Policy


class HeapPolicy(Policy):
    """A waiting queue kept in a heap, ordered by ``order(req, front)``: the base of every policy that sorts
    its queue by a key (priority, job size, deadline...). A preempted request is pushed with ``front=True``.

    A heap with lazy deletion keeps push/pop O(log n) for long simulated queues: ``remove`` only forgets a
    request, and its stale heap entry is dropped when it reaches the top. Stale entries that never reach the top
    (a request promoted again and again leaves one behind each time) are swept out whenever they outnumber the
    live ones, so the heap stays within about twice the queue."""

    def __init__(self) -> None:
        self.heap: list[tuple[Any, ...]] = []
        self.live: dict[str, int] = {}  # request id → sequence number of its current heap entry
        self.counter = itertools.count()

    def order(self, req: Request, front: bool) -> tuple:
        """The queue's sort key: smallest first."""
        raise NotImplementedError

    def _push(self, req: Request, front: bool) -> None:
        seq = next(self.counter)
        heapq.heappush(self.heap, (self.order(req, front), seq, req))
        self.live[req.request_id] = seq  # a newer entry for the same request makes the old one stale
        if len(self.heap) > 2 * len(self.live) + 16:  # mostly stale: keep the live entries only
            self.heap = [e for e in self.heap if self._is_live(e)]
            heapq.heapify(self.heap)

    def push(self, req: Request) -> None:
        self._push(req, front=False)

    def push_front(self, req: Request) -> None:
        self._push(req, front=True)

    def _is_live(self, entry: tuple[Any, ...]) -> bool:
        return self.live.get(entry[-1].request_id) == entry[1]

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
        del self.live[req.request_id]

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted((e for e in self.heap if self._is_live(e)), key=lambda e: e[:2]))


class PriorityPolicy(HeapPolicy):
    """Lower ``priority`` value first; ties by arrival. A preempted request goes ahead of its equals that
    never ran. Running requests rank by ``(priority, admitted_seq)``, so the preemption victim is the lowest
    priority and, among those, the most recently admitted."""

    name = "priority"
    victim_rule = "the lowest-priority running request (of those, the most recently admitted)"

    def order(self, req: Request, front: bool) -> tuple:
        return (req.priority, 0 if front else 1, req.arrival_time)

    def rank(self, req: Request) -> Any:
        return (req.priority, req.admitted_seq)

    def promote(self, req: Request) -> None:
        """One level up (aging): a request passed over by a stream of more important ones still gets its
        turn. Its ``priority`` field keeps the level it reached."""
        req.priority -= 1
        self._push(req, front=False)


class ShortestJobFirstPolicy(HeapPolicy):
    """The request with the least work first: its prompt plus the tokens it may generate (``max_tokens``).

    Short jobs no longer wait behind long ones, so the mean time to finish falls and more requests meet a
    latency target -- goodput rises -- at the price of long jobs, which wait while short ones keep arriving
    (chapter 09, exercise E9.2). The work is what the server knows when the request arrives; with recompute
    preemption it stays the same after a preemption (the prompt and the tokens so far are computed again)."""

    name = "sjf"
    victim_rule = "the running request with the most work (of equals, the most recently admitted)"

    def order(self, req: Request, front: bool) -> tuple:
        # BEGIN EXERCISE E9.1
        work = req.num_prompt_tokens + req.params.max_tokens  # tokens to compute, known at arrival
        return (work, 0 if front else 1, req.arrival_time)  # among equals: a preempted request first
        # END EXERCISE

    def rank(self, req: Request) -> Any:
        # BEGIN EXERCISE E9.1
        return (req.num_prompt_tokens + req.params.max_tokens, req.admitted_seq)  # fixed while it runs
        # END EXERCISE


class FairPolicy(Policy):
    """Weighted fair queuing between tenants, by tokens served.

    Each tenant has a *level*: the tokens computed for it (prompt chunks and decodes) divided by its weight.
    The next request comes from the waiting tenant with the lowest level, so service evens out: a tenant that
    floods the queue only delays itself, and while both wait, a tenant of weight 2 gets twice the tokens of a
    tenant of weight 1. Within a tenant: first come, first served.

    An idle tenant must not bank credit: back after a long pause, its level would be far below the others' and
    it would monopolise admissions until it caught up. So a tenant whose queue was empty re-enters at no less
    than the *virtual time* ``vtime``: the level of the tenant picked last, i.e. the current fair level. (This
    is start-time fair queuing; ``vtime`` never decreases.)
    """

    name = "fair"

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights
        self.queues: dict[str | None, deque[Request]] = {}  # only tenants with waiting requests
        self.served: defaultdict[str | None, float] = defaultdict(float)  # tokens computed, per tenant
        self.vtime = 0.0
        self.size = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> FairPolicy:
        return cls(config.tenant_weights)

    def weight(self, tenant: str | None) -> float:
        return self.weights.get(tenant, 1.0) if tenant is not None else 1.0

    def level(self, tenant: str | None) -> float:
        """Tokens served per unit of weight: what fair queuing evens out."""
        # BEGIN EXERCISE E9.3
        return self.served[tenant] / self.weight(tenant)
        # END EXERCISE

    def _queue(self, tenant: str | None) -> deque[Request]:
        """The tenant's queue; a tenant that had none is (re)activated at the virtual time."""
        # BEGIN EXERCISE E9.3
        q = self.queues.get(tenant)
        if q is None:
            q = self.queues[tenant] = deque()
            # no banked credit: an idle tenant comes back at the current fair level, not below it
            self.served[tenant] = max(self.served[tenant], self.vtime * self.weight(tenant))
        return q
        # END EXERCISE

    def _next_tenant(self) -> str | None:
        """The waiting tenant with the lowest level; of equals, the one whose next request arrived first."""
        # BEGIN EXERCISE E9.3
        return min(self.queues, key=lambda t: (self.level(t), self.queues[t][0].arrival_time))
        # END EXERCISE

    def push(self, req: Request) -> None:
        self._queue(req.tenant).append(req)
        self.size += 1

    def push_front(self, req: Request) -> None:
        self._queue(req.tenant).appendleft(req)
        self.size += 1

    def peek(self) -> Request | None:
        return self.queues[self._next_tenant()][0] if self.size else None

    def pop(self) -> Request:
        # BEGIN EXERCISE E9.3
        tenant = self._next_tenant()
        self.vtime = max(self.vtime, self.level(tenant))  # the virtual time: the level served last, never lower
        return self._take(tenant, self.queues[tenant].popleft())
        # END EXERCISE

    def remove(self, req: Request) -> None:
        self.queues[req.tenant].remove(req)
        self._take(req.tenant, req)

    def _take(self, tenant: str | None, req: Request) -> Request:
        self.size -= 1
        if not self.queues[tenant]:
            del self.queues[tenant]  # idle now: it re-enters at the virtual time
        return req

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Request]:
        """The admission order if nothing else changed: tenants interleaved by level, each admitted request
        raising its tenant's level by its own tokens (an estimate: decodes add more later)."""
        heap = [(self.level(t), q[0].arrival_time, i, t) for i, (t, q) in enumerate(self.queues.items())]
        heapq.heapify(heap)
        pos = dict.fromkeys(self.queues, 0)
        while heap:
            level, _, i, t = heapq.heappop(heap)
            q = self.queues[t]
            req = q[pos[t]]
            yield req
            pos[t] += 1
            if pos[t] < len(q):
                heapq.heappush(heap, (level + req.num_tokens / self.weight(t), q[pos[t]].arrival_time, i, t))

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        self.served[req.tenant] += num_tokens


class CapstonePolicy(HeapPolicy):
    """The capstone: a policy of your own design, graded by goodput under TTFT and TPOT targets on a simulated
    GPU (``minfer.capstone`` holds the workload family, the targets and the scorer; chapter 09 sets it).

    Your design is two keys. ``order`` sorts the waiting queue (smallest first); ``rank`` sorts the running list,
    whose last request is the preemption victim (a rank must not change while the request runs). What you may
    know of a request is what a server knows when it arrives: its prompt length, ``params.max_tokens``, arrival
    time, priority and tenant, and ``front`` (it was preempted and goes back to the queue).

    The reference weighs the prompt fully and the answer by a quarter: time to first token waits on the prompt's
    prefill, while the answer's length only holds memory for longer -- so a short question with a long answer
    goes before a long document with a short one. The victim is the request with the most work."""

    name = "capstone"
    victim_rule = "yours to choose (the reference: the running request with the most work)"

    def order(self, req: Request, front: bool) -> tuple:
        # BEGIN EXERCISE E9.4
        first_token_work = req.num_prompt_tokens + req.params.max_tokens / 4  # the prefill decides TTFT
        return (first_token_work, 0 if front else 1, req.arrival_time)
        # END EXERCISE

    def rank(self, req: Request) -> Any:
        # BEGIN EXERCISE E9.4
        return (req.num_prompt_tokens + req.params.max_tokens, req.admitted_seq)
        # END EXERCISE


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Policy, PriorityPolicy, ShortestJobFirstPolicy, FairPolicy,
                                                         CapstonePolicy)}


def make_policy(config: EngineConfig) -> Policy:
    """The queue policy ``config.policy`` names."""
    if config.policy not in POLICIES:
        raise ValueError(f"policy must be one of {tuple(POLICIES)}, got {config.policy!r}")
    return POLICIES[config.policy].from_config(config)
