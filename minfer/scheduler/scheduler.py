"""The iteration-level scheduler: the batch is formed anew before every forward pass.

One ``schedule()`` decides what the next step computes:

1. **Running requests first**, in policy rank. Each needs ``num_tokens - num_computed_tokens`` tokens:
   one for a decode, the rest of its prompt (in chunks) for a prefill. A request whose next tokens need a
   block the pool cannot give **preempts** the lowest-ranked running request (the last in the list):
   its blocks are freed and it goes back to the front of the queue. Its K/V are either dropped, to be
   recomputed when it returns, or -- with ``preemption_mode="swap"``, while the host pool has room -- copied
   to host memory first and copied back when it returns (the plan lists the copies; the executor makes them).
2. **Then waiting requests**, in queue order, while the step's budgets and the pool allow -- but not in a
   step that had to preempt (memory is short; admitting more would only preempt again). A preempted request
   comes back only when its *whole* recompute or swap-in, plus its next token, fits (``resume_rule="whole"``),
   and it takes those blocks at once: were it let in for just a first chunk, the next step's growth would
   preempt it again, over and over, recomputing the same tokens each time (``resume_rule="first_chunk"``
   keeps that old rule, to show the thrash).

Around these two passes sits the gatekeeping, all off by default: first, waiting requests that waited too
long or can no longer meet their TTFT target are timed out or shed (``shedding.py``), and with
``priority_preemption`` a more important waiting request may take a running one's place; last, the queue is
cut to ``max_waiting`` by refusing the newest arrivals. Queue order and victims come from the policy
(``policy.py``, ``policies.py``).

``update()`` then takes the sampled tokens: it advances each request, appends tokens and says which should
stop (EOS, a stop token, its length). Every request ends through one method, ``finish()``, whatever the
reason -- those stops, a stop string the engine found in the text, an abort, a refusal, a timeout, an error
-- and ``finish()`` frees its blocks at once, so the very next step can use them.

Each decision is also recorded as data (``minfer.plan``): why a request was admitted, chunked or preempted, and
why the head of the queue was kept waiting, on the step's plan (``SchedulerOutput.decisions``); why a request
ended, and who joined the queue, in a short log the engine takes each step. The engine copies both into every
``StepTrace``; the sentences a reader sees are rendered from them in ``minfer.viz.narration``, not here.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import replace

from minfer.config import EngineConfig
from minfer.kv.block_pool import BlockPool, chain_hashes
from minfer.kv.host_cache import HostPrefixCache, TieredBlockPool
from minfer.kv.host_pool import HostBlockPool
from minfer.plan import (
    Admitted,
    Chunked,
    ChunkLimit,
    Ended,
    NotAdmitted,
    PreemptCause,
    Preempted,
    ScheduledChunk,
    SchedulerOutput,
    StepBudget,
    WaitCause,
)
from minfer.request import Request, RequestStatus
from minfer.scheduler.policies import make_policy
from minfer.scheduler.shedding import DrainRate, expired_requests
from minfer.types import FinishReason

# a request that got tokens; why to stop (None: go on), and the stop's detail; how many tokens it got this step
StopCheck = tuple[Request, FinishReason | None, str | int | None, int]


class Scheduler:
    def __init__(self, config: EngineConfig, pool: BlockPool, max_model_len: int,
                 host_pool: HostBlockPool | None = None) -> None:
        self.config, self.pool, self.max_model_len = config, pool, max_model_len
        self.block_size = pool.block_size
        # where swapped-out KV waits (preemption_mode="swap"); without one, every preemption recomputes
        self.host_pool = host_pool if host_pool is not None else HostBlockPool(0, pool.block_size)
        # the prefix cache's host tier, if the pool has one (kv/host_cache.py): evicted prefix blocks wait there
        self.host_cache = pool.host_cache if isinstance(pool, TieredBlockPool) else HostPrefixCache(0)
        self.policy = make_policy(config)
        self.running: list[Request] = []  # kept sorted by policy rank
        self._rank_keys: list = []  # rank of each running request, parallel to self.running
        self.pending: list[tuple[float, int, Request]] = []  # heap of future arrivals
        self.requests: dict[str, Request] = {}  # every unfinished request
        self._seq = itertools.count()
        self.full_budget = StepBudget.from_config(config, max_model_len)  # each step starts with a copy
        self._arrivals: list[Request] = []  # queued since the last schedule(): max_waiting may refuse them
        self.drain = DrainRate()  # how fast the queue drains (SLO shedding predicts waits from it)
        self.queued_since: dict[str, float] = {}  # when a promoted request's queue-time clock restarted
        self.ended: list[Ended] = []  # why each request ended, since the last step record
        self.joined: list[Request] = []  # requests that joined the queue since the last step record

    # ---- the queue -------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> None:
        if req.arrival_time > now:
            req.status = RequestStatus.PENDING
            heapq.heappush(self.pending, (req.arrival_time, next(self._seq), req))
        else:
            self._enqueue(req)
        self.requests[req.request_id] = req  # last: a request the queue refused is not half-added

    def _enqueue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.policy.push(req)
        self.joined.append(req)
        if self.config.max_waiting is not None:
            self._arrivals.append(req)

    def _release_arrivals(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            self._enqueue(heapq.heappop(self.pending)[2])

    def next_arrival_time(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    @property
    def num_pending(self) -> int:
        return len(self.pending)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def blocks_held(self) -> dict[str, int]:
        """KV blocks each running request holds, in rank order."""
        return {r.request_id: len(self.pool.table(r.request_id)) for r in self.running}

    def take_log(self) -> tuple[list[Ended], list[Request]]:
        """The endings and the arrivals since the last call (the engine puts them in each step's trace)."""
        ended, joined = self.ended, self.joined
        self.ended, self.joined = [], []
        return ended, joined

    # ---- one step --------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Plan the next step: gatekeeping, then running requests, then waiting ones, then the queue cap."""
        cfg = self.config
        out = SchedulerOutput()
        self._release_arrivals(now)
        self._drop_expired(now, out)
        if cfg.priority_preemption:
            self._preempt_for_priority(out)
        budget = replace(self.full_budget)
        short_of_memory = self._schedule_running(budget, out)
        if not short_of_memory:
            self._schedule_waiting(budget, now, out)
            if cfg.speculative is not None:
                self._reserve_lookahead(cfg.speculative.num_speculative_tokens, budget, out)
        elif (head := self.policy.peek()) is not None:  # memory is short: admitting more would only preempt again
            out.decisions.append(NotAdmitted(head.request_id, "step_preempted"))
        self._record_chunks(budget, out)
        if cfg.max_waiting is not None:
            self._refuse_overflow(now, out)
        if isinstance(self.pool, TieredBlockPool):  # copy the blocks this step evicted to the host tier
            out.spill = self.pool.take_spills()
            self.host_cache.end_step()
        return out

    def _schedule_running(self, budget: StepBudget, out: SchedulerOutput) -> bool:
        """1. Running requests, most important first: one decode token each, or their next prefill chunk.
        Returns whether memory ran short (someone was preempted to make room)."""
        # BEGIN EXERCISE E4.1
        running, preempted_before = self.running, len(out.preempted)
        i = 0
        while i < len(running) and budget.tokens > 0:
            req = running[i]
            n = req.num_tokens - req.num_computed_tokens
            decode = n == 1 and len(req.output_token_ids) > 0  # the token sampled last step
            if not decode:  # still in prefill (or recomputing): its next chunk, if the step has room
                n = budget.prefill_chunk(n)
                if n <= 0:
                    i += 1
                    continue
            if not self._make_room(req, n, out):
                break  # req preempted itself: everything after it is gone too
            out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, self.pool.table(req.request_id)))
            self.policy.on_scheduled(req, n)
            budget.spend(n, decode)
            i += 1
        return len(out.preempted) > preempted_before
        # END EXERCISE

    def _make_room(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Grow ``req`` by ``n`` token slots, preempting the lowest-ranked running request (the last in the
        list) until the pool can give the blocks. False if ``req`` itself was the one preempted."""
        # BEGIN EXERCISE E6.1
        while self.pool.try_append_slots(req.request_id, n) is None:
            victim = self.running[-1]
            self._preempt(victim, out, by=req)
            if victim is req:
                return False
        return True
        # END EXERCISE

    def _schedule_waiting(self, budget: StepBudget, now: float, out: SchedulerOutput) -> None:
        """2. Waiting requests, in queue order, while the budgets, the sequence slots and the pool allow. The first
        that cannot start ends the pass (head-of-line: no smaller request overtakes it), and the plan says why."""
        cfg = self.config
        while (req := self.policy.peek()) is not None:
            if (full := self._no_room(req, budget)) is not None:
                out.decisions.append(full)
                return
            hits, loaded, n = self._resume_point(req)  # after preemption, n counts its output tokens too
            if cfg.enable_chunked_prefill:
                n = budget.prefill_chunk(n)
            elif n > (left := min(budget.prompt, budget.tokens)) and out.chunks:  # unchunked: whole, alone if it must
                out.decisions.append(NotAdmitted(req.request_id, "prompt_too_long", need=n, have=left))
                return
            total_blocks, need = self._admission_blocks(req, hits, loaded, n)
            if need > self.pool.num_free_blocks:  # wait for memory rather than let smaller requests overtake
                out.decisions.append(NotAdmitted(req.request_id, "no_free_blocks", need, self.pool.num_free_blocks))
                return
            self.policy.pop()
            self._admit(req, hits, loaded, total_blocks, n, now, out)
            self.pool.append_slots(req.request_id, n)  # within the blocks _admit just allocated
            out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, False, self.pool.table(req.request_id)))
            self.policy.on_scheduled(req, n)
            budget.spend(n, decode=False)

    def _reserve_lookahead(self, k: int, budget: StepBudget, out: SchedulerOutput) -> None:
        """Speculative decoding: slots for up to ``k`` guesses after each decode's token, in rank order, from what
        the step's token budget and the pool's free blocks have left -- a guess never preempts anyone and never
        shrinks a prompt's chunk. No guess past the request's ``max_tokens`` or the model's length: a step yields
        at most ``lookahead + 1`` tokens."""
        pool, bs = self.pool, self.block_size
        for c in out.chunks:
            if not c.is_decode:
                continue
            req, rid = c.request, c.request.request_id
            room = (len(pool.table(rid)) + pool.num_free_blocks) * bs - pool.num_tokens[rid]  # slots without preempting
            n = min(k, budget.tokens, room, req.params.max_tokens - req.num_output_tokens - 1,
                    self.max_model_len - req.num_tokens - 1)
            if n > 0:
                pool.append_slots(rid, n)
                c.lookahead = n
                budget.spend(n, decode=True)

    def _no_room(self, req: Request, budget: StepBudget) -> NotAdmitted | None:
        """Why ``req``, next in the queue, cannot start in this step whatever its size -- a budget is spent, or
        every sequence slot is taken -- or None."""
        full, seqs = self.full_budget, self.config.max_num_seqs
        limits: tuple[tuple[bool, WaitCause, int], ...] = (  # (reached?, which, its size per step)
            (budget.tokens <= 0, "token_budget", full.tokens), (budget.chunks <= 0, "chunk_limit", full.chunks),
            (budget.prompt <= 0, "prompt_budget", full.prompt), (len(self.running) >= seqs, "max_num_seqs", seqs))
        return next((NotAdmitted(req.request_id, cause, have=size) for hit, cause, size in limits if hit), None)

    def _record_chunks(self, budget: StepBudget, out: SchedulerOutput) -> None:
        """Record each prompt chunk that stops short of its request's end, and the budget that cut it: the one
        spent to 0 (a chunk is as long as the smaller budget allows, and spends it to the last token)."""
        if budget.prompt == self.full_budget.prompt:  # no prompt chunk in this step: none was cut
            return
        limit: ChunkLimit = "prompt_budget" if budget.prompt <= 0 else "token_budget"
        size = self.full_budget.prompt if limit == "prompt_budget" else self.full_budget.tokens
        for c in out.chunks:
            left = c.request.num_tokens - c.start
            if not c.is_decode and c.num_tokens < left:
                out.decisions.append(Chunked(c.request.request_id, c.start, c.num_tokens, left, limit, size))

    def _resume_point(self, req: Request) -> tuple[list[int], int, int]:
        """Admitting ``req`` now: the cached prefix blocks it can share, how many blocks after them the prefix
        cache's host tier holds (copied back), and how many tokens are left to compute. A swapped-out request's
        K/V come back from host memory (no prefix lookup): only its rest is computed."""
        if req.request_id in self.host_pool:
            return [], 0, req.num_tokens - req.num_computed_tokens
        hits = self._prefix_hits(req)
        loaded = self._host_hits(req, len(hits))
        return hits, loaded, req.num_tokens - (len(hits) + loaded) * self.block_size

    def _prefix_hits(self, req: Request) -> list[int]:
        """Cached blocks of the request's longest cached prefix, leaving at least one token to compute
        (the step must produce the logits of the last token)."""
        # BEGIN EXERCISE E8.1
        if not self.config.enable_prefix_caching:
            return []
        req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)
        return self.pool.lookup(req.block_hashes[: (req.num_tokens - 1) // self.block_size])
        # END EXERCISE

    def _host_hits(self, req: Request, start: int) -> int:
        """Blocks of the request's prefix after its ``start`` cached ones that the host tier holds, leaving at
        least one token to compute (0 without a host tier)."""
        if not self.host_cache.num_blocks:
            return 0
        return len(self.host_cache.lookup(req.block_hashes[start : (req.num_tokens - 1) // self.block_size]))

    def _admission_blocks(self, req: Request, hits: list[int], loaded: int, n: int) -> tuple[int, int]:
        """Admitting ``req`` to compute its first ``n`` tokens after the cached prefix ``hits`` and the ``loaded``
        blocks from the host tier (or after the tokens it swaps in): the blocks its table will hold, and how many
        of them leave the free list (new blocks, and cached ones nobody holds)."""
        ready = (len(hits) + loaded) * self.block_size + req.num_computed_tokens  # cached, or swapped out (not both)
        total = self.pool.blocks_for(ready + n)
        if req.metrics.num_preemptions and self.config.resume_rule == "whole":
            # a victim returns only when all it had, and its next token, fit -- taken now, so that its own
            # recompute cannot run the pool dry halfway (which would preempt it again and waste the work)
            total = max(total, self.pool.blocks_for(min(req.num_tokens + 1, req.max_kv_slots(self.max_model_len))))
        if self.config.admission == "reserve":  # room for every token it may ever hold
            total = max(total, self.pool.blocks_for(req.max_kv_slots(self.max_model_len)))
        fresh_hits = sum(1 for b in hits if self.pool.ref_counts[b] == 0)
        return total, total - len(hits) + fresh_hits

    def _admit(self, req: Request, hits: list[int], loaded: int, total_blocks: int, n: int, now: float,
               out: SchedulerOutput) -> None:
        """Move ``req`` into the running list with its blocks (shared prefix hits, blocks copied back from the host
        tier or from its swap-out, new ones) and record why it could start: ``n`` tokens this step, and the blocks
        it took."""
        rid, free = req.request_id, self.pool.num_free_blocks
        # BEGIN EXERCISE E6.4
        if rid in self.host_pool:  # its K/V come back from host memory, copied before this step's forward pass
            self.pool.allocate(rid, total_blocks)
            self.pool.append_slots(rid, req.num_computed_tokens)  # within the blocks just allocated
            out.swap_in[rid] = list(zip(self.host_pool.free(rid), self.pool.table(rid)))
        # END EXERCISE
        if hits:
            self.pool.share(rid, hits)
        if loaded:  # the prefix's next blocks wait in the host tier: copied back before this step's forward pass
            host_blocks = self.host_cache.read(req.block_hashes[len(hits) : len(hits) + loaded])
            out.load[rid] = list(zip(host_blocks, self.pool.allocate(rid, loaded)))
            self.pool.append_slots(rid, loaded * self.block_size)  # within the blocks just allocated
        if hits or loaded:
            req.num_computed_tokens = (len(hits) + loaded) * self.block_size
            out.num_cached_tokens += req.num_computed_tokens
            if req.metrics.first_scheduled_time is None:
                req.metrics.num_cached_tokens = req.num_computed_tokens
        # every block it needs now (with admission="reserve": every block it may ever need)
        self.pool.allocate(rid, total_blocks - len(self.pool.tables.get(rid, ())))
        req.status = RequestStatus.RUNNING
        req.admitted_seq = next(self._seq)
        if req.metrics.first_scheduled_time is None:
            req.metrics.first_scheduled_time = now
        key = self.policy.rank(req)
        at = bisect.bisect_right(self._rank_keys, key)
        self.running.insert(at, req)
        self._rank_keys.insert(at, key)
        out.admitted.append(req)
        swapped = len(out.swap_in.get(rid, ()))
        out.decisions.append(Admitted(
            rid, n, free - self.pool.num_free_blocks, free, cached_tokens=(len(hits) + loaded) * self.block_size,
            loaded_blocks=loaded,
            resumed="swap_in" if swapped else "recompute" if req.metrics.num_preemptions else "",
            swapped_blocks=swapped, swapped_tokens=req.num_computed_tokens if swapped else 0))

    def _remove_running(self, req: Request) -> None:
        i = self.running.index(req)
        del self.running[i], self._rank_keys[i]

    def _preempt(self, req: Request, out: SchedulerOutput, by: Request, cause: PreemptCause = "pool_full") -> None:
        """Take a running request's KV blocks and queue it at the front; it keeps its tokens. Its K/V are copied
        to host memory first (``preemption_mode="swap"``, while the host pool has room) or dropped, to be
        recomputed when it returns. ``by`` is the request it makes room for (``cause`` says why; maybe itself)."""
        rid, n, host = req.request_id, req.num_computed_tokens, self.host_pool
        self._remove_running(req)
        # BEGIN EXERCISE E6.4
        swap = self.config.preemption_mode == "swap"
        if swap and n > 0 and host.can_hold(n):
            out.swap_out[rid] = list(zip(self.pool.table(rid), host.allocate(rid, n)))
        else:
            req.num_computed_tokens = 0
        # END EXERCISE
        self.pool.free(rid)
        req.status = RequestStatus.WAITING
        req.metrics.num_preemptions += 1
        self.policy.push_front(req)
        out.preempted.append(req)
        swapped = len(out.swap_out.get(rid, ()))
        out.decisions.append(Preempted(
            rid, cause, by.request_id, self.policy.victim_rule, n, swapped, host_full=swap and not swapped,
            host_blocks_needed=host.blocks_for(n), host_blocks_free=host.num_free_blocks, priority=req.priority,
            by_priority=by.priority))

    def _preempt_for_priority(self, out: SchedulerOutput) -> None:
        """policy="priority" with priority_preemption: a waiting request that outranks the lowest running
        one takes its place when it could not otherwise start (no sequence slot or too little memory)."""
        while self.running and (head := self.policy.peek()) is not None:
            victim = self.running[-1]
            if head.priority >= victim.priority:
                return
            if len(self.running) < self.config.max_num_seqs:  # a free slot: does its first chunk fit?
                hits, loaded, n = self._resume_point(head)
                n = min(n, self.full_budget.prompt)  # unchunked: all of it
                if self._admission_blocks(head, hits, loaded, n)[1] <= self.pool.num_free_blocks:
                    return
            self._preempt(victim, out, by=head, cause="priority")

    def _drop_expired(self, now: float, out: SchedulerOutput) -> None:
        """Queue timeouts and SLO shedding (both off by default; see ``shedding.py``)."""
        cfg = self.config
        if cfg.max_queue_time is None and cfg.ttft_slo is None:
            return
        for req, action, why in expired_requests(cfg, self.policy, self.running, self.drain, self.queued_since,
                                                 now):
            if action == "promote":
                self.policy.promote(req)
                self.queued_since[req.request_id] = now  # its timeout clock restarts at the new level
            else:
                self._drop_waiting(req, action, why, now, out)  # type: ignore[arg-type]

    def _refuse_overflow(self, now: float, out: SchedulerOutput) -> None:
        """Admission control: after this round's admissions at most ``max_waiting`` requests wait. The newest
        arrivals beyond that are refused -- never a request accepted earlier, never a preempted one."""
        cap = self.config.max_waiting
        arrivals, self._arrivals = self._arrivals, []
        excess = len(self.policy) - cap  # type: ignore[operator]
        for req in reversed(arrivals):
            if excess <= 0:
                break
            if req.status is RequestStatus.WAITING:  # not admitted, aborted or shed meanwhile
                self._drop_waiting(req, "rejected", f"queue full (max_waiting={cap})", now, out)
                excess -= 1

    def _drop_waiting(self, req: Request, reason: FinishReason, why: str, now: float, out: SchedulerOutput) -> None:
        """End a waiting request without running it; this step's outputs report it."""
        self.finish(req, reason, why, now)
        out.finished.append(req)

    # ---- after the forward pass ------------------------------------------------------------------
    def observe_step(self, out: SchedulerOutput, duration: float) -> None:
        """Learn from a finished step how fast the queue drains (for SLO shedding)."""
        self.drain.observe(out.num_prefill_tokens, duration, backlogged=len(self.policy) > 0)

    def update(self, out: SchedulerOutput, sampled: dict[str, int], now: float,
               accepted: dict[str, list[int]] | None = None) -> list[StopCheck]:
        """Advance every scheduled request and append its new tokens: the guesses the executor accepted (speculative
        decoding), then its sampled token. Returns, for each request that got tokens, why it should stop -- EOS, a
        stop token, its length, checked after each token: the first ends it, and any after it are dropped -- or None,
        and how many tokens it got. Nothing ends here: the engine first looks for stop strings (they need the text),
        then ends requests through ``finish``."""
        changed: list[StopCheck] = []
        caching, accepted = self.config.enable_prefix_caching, accepted or {}
        for chunk in out.chunks:
            req, rid = chunk.request, chunk.request.request_id
            kept = accepted.get(rid, ())
            req.num_computed_tokens += chunk.num_tokens + len(kept)  # an accepted guess's K/V is the target's own
            if chunk.lookahead:  # slots of rejected (or never proposed) guesses: rolled back, before any hashing
                self.pool.rollback_slots(rid, req.num_computed_tokens)
            token = sampled.get(rid)
            if token is not None:
                m = req.metrics
                if m.first_token_time is None:
                    m.first_token_time = now
                reason: FinishReason | None = None
                why: str | int | None = None
                got = 0
                for t in (*kept, token):
                    req.append_token(t)
                    m.token_times.append(now)
                    got += 1
                    reason, why = self.stop_reason(req, t)
                    if reason is not None:
                        break
                changed.append((req, reason, why, got))
            # a block filled with computed K/V joins the prefix cache (once per block_size decode steps)
            if caching and req.num_computed_tokens // self.block_size > self.pool.num_hashed[rid]:
                req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)
                self.pool.cache_blocks(rid, req.block_hashes, req.num_computed_tokens)
        return changed

    def stop_reason(self, req: Request, token: int) -> tuple[FinishReason | None, str | int | None]:
        """Should ``req`` stop after sampling ``token``? (The engine adds stop strings.)"""
        p = req.params
        if not p.ignore_eos and token in req.eos_token_ids:
            return "stop", token
        if p.stop_token_ids and token in p.stop_token_ids:
            return "stop", token
        if len(req.output_token_ids) >= p.max_tokens:
            return "length", None
        if req.num_tokens >= self.max_model_len:
            return "length", f"max_model_len={self.max_model_len}"
        return None, None

    def finish(self, req: Request, reason: FinishReason, why: str | int | None, now: float) -> None:
        """End a request, whatever the reason: it leaves the queue or the running list, and its blocks are
        freed at once. The only way a request ends."""
        if req.status is RequestStatus.FINISHED:
            raise ValueError(f"request {req.request_id!r} has already finished ({req.finish_reason})")
        if req.status is RequestStatus.WAITING:
            self.policy.remove(req)
            if req.request_id in self.host_pool:  # swapped out: its host copy is no longer needed
                self.host_pool.free(req.request_id)
        elif req.status is RequestStatus.PENDING:
            self.pending = [e for e in self.pending if e[2] is not req]
            heapq.heapify(self.pending)
        elif req.status is RequestStatus.RUNNING:
            self._remove_running(req)
            self.pool.free(req.request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason, req.stop_reason = reason, why
        req.metrics.finished_time = now
        self.requests.pop(req.request_id, None)
        self.queued_since.pop(req.request_id, None)
        self.ended.append(Ended.of(req))

    # ---- checks ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if scheduler and pool disagree. Tests call this after every step."""
        run_ids = [r.request_id for r in self.running]
        assert len(set(run_ids)) == len(run_ids), "a request runs twice"
        assert len(self.running) <= self.config.max_num_seqs, "more running than max_num_seqs"
        assert self._rank_keys == sorted(self._rank_keys), "running list out of rank order"
        assert self._rank_keys == [self.policy.rank(r) for r in self.running], "stale rank keys"
        waiting = list(self.policy)
        assert len(waiting) == len(self.policy), "queue length disagrees with its contents"
        for r in self.running:
            assert r.status is RequestStatus.RUNNING, f"{r.request_id} in running list is {r.status}"
            assert r.num_computed_tokens <= r.num_tokens, f"{r.request_id} computed tokens it does not have"
            assert self.pool.num_tokens[r.request_id] == r.num_computed_tokens, (
                f"{r.request_id}: pool holds {self.pool.num_tokens[r.request_id]} slots, "
                f"request computed {r.num_computed_tokens}"
            )
        pending = [e[2] for e in self.pending]  # a request landed from elsewhere (disaggregation) may arrive later
        swapped = [r.request_id for r in (*waiting, *pending) if r.request_id in self.host_pool]
        for r in waiting:
            assert r.status is RequestStatus.WAITING, f"{r.request_id} waits while {r.status}"
            if r.request_id in self.host_pool:  # swapped out: its host blocks hold exactly its computed tokens
                assert 0 < r.num_computed_tokens < r.num_tokens, f"{r.request_id} swapped out with nothing to resume"
                assert self.host_pool.num_tokens[r.request_id] == r.num_computed_tokens, (
                    f"{r.request_id}: host pool holds {self.host_pool.num_tokens[r.request_id]} tokens, "
                    f"request computed {r.num_computed_tokens}")
            else:
                assert r.num_computed_tokens == 0, f"{r.request_id} waits with {r.num_computed_tokens} computed tokens"
        ids = set(run_ids) | {r.request_id for r in waiting} | {e[2].request_id for e in self.pending}
        assert ids == set(self.requests), "a request is lost or counted twice between the queues"
        self.pool.check_invariants(owners=run_ids)
        self.host_pool.check_invariants(owners=swapped)
        self.host_cache.check_invariants()

