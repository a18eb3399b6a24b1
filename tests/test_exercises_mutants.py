"""Every checker catches realistic wrong solutions and accepts other correct ones.

A *mutant* is the reference solution with one small mistake a student makes: an off-by-one block count, a free
list in the wrong order, a softmax without the running maximum, a lookup that does not stop at a miss, an SLO
test that counts refused requests. It is written as a diff -- text of the reference region replaced by other
text -- so it stays one mistake, and a change to the reference that removes the text fails here loudly instead
of quietly testing something else. The test runs the mutant in place of the reference (in this process,
through ``StandIns.try_body``: no file is edited) and asserts that the exercise's check, public and hidden
cases together, fails on the mutant's own code -- not on a stub, not on an error of the checker -- and, where
given, at the case meant to catch it.

An *alternative* is a genuinely different correct solution; the check must pass it. A checker that compares a
student's code line by line with the reference, or that depends on one way of writing it, fails here.

Every build exercise needs at least three mutants and one alternative (``test_every_build_exercise_is_covered``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest

from minfer.exercises import StandIns, run_exercise
from minfer.exercises.catalog import EXERCISES
from minfer.exercises.regions import find_regions
from minfer.exercises.standin import ROOT


@dataclass(frozen=True, slots=True)
class Mutant:
    """The reference body of region ``index`` of ``exercise`` in ``unit``, with ``old`` replaced by ``new`` (and
    each further ``(old, new)`` pair in ``more``). Texts are matched in the body dedented to its first level;
    each ``old`` must occur exactly once. ``case``: part of the name of the case that must catch it."""

    name: str
    exercise: str
    unit: str
    old: str
    new: str
    case: str | None = None
    more: tuple[tuple[str, str], ...] = ()
    index: int = 0

    def body(self) -> str:
        text = reference_body(self.exercise, self.unit, self.index)
        for old, new in ((self.old, self.new), *self.more):
            assert text.count(old) == 1, f"{self.name}: {old!r} occurs {text.count(old)} times in the reference"
            text = text.replace(old, new)
        return text


@dataclass(frozen=True, slots=True)
class Alternative:
    """A different correct solution: a whole body for each unit of the exercise it rewrites."""

    name: str
    exercise: str
    bodies: dict[str, str]


def reference_body(exercise: str, unit: str, index: int = 0) -> str:
    region = next(r for r in find_regions(ROOT) if (r.exercise, r.unit, r.index) == (exercise, unit, index))
    return textwrap.dedent(region.body)


MUTANTS = [
    # ---- E1.1: the KV-cache step ------------------------------------------------------------------------
    Mutant("E1.1 attends without the position mask", "E1.1", "ContiguousKVCache.attention",
           "attn_mask=visible[:, None],", "", "one sequence"),
    Mutant("E1.1 uses is_causal instead of positions", "E1.1", "ContiguousKVCache.attention",
           "attn_mask=visible[:, None],", "is_causal=True,", "one sequence"),
    Mutant("E1.1 reads strip b instead of slots[b]", "E1.1", "ContiguousKVCache.attention",
           "kc[slots, :length]", "kc[:b, :length]", "two rows", more=(("vc[slots, :length]", "vc[:b, :length]"),)),
    Mutant("E1.1 stores each token one position late", "E1.1", "ContiguousKVCache.attention",
           "kc[rows, positions]", "kc[rows, positions + 1]", "one sequence",
           more=(("vc[rows, positions]", "vc[rows, positions + 1]"),)),
    Mutant("E1.1 masks every row like the first", "E1.1", "ContiguousKVCache.attention",
           "attn_mask=visible[:, None]", "attn_mask=visible[:1, None]", "two rows"),
    Mutant("E1.1 scales the scores by 1/d, not 1/sqrt(d)", "E1.1", "ContiguousKVCache.attention",
           "enable_gqa=True)", "enable_gqa=True, scale=1 / q.shape[-1])", "one sequence"),
    Mutant("E1.1 computes in float32 whatever the cache holds", "E1.1", "ContiguousKVCache.attention",
           "out = F.scaled_dot_product_attention(queries, keys, values,",
           "out = F.scaled_dot_product_attention(queries.float(), keys.float(), values.float(),", "float16"),
    Mutant("E1.1 exponentiates raw scores (no maximum subtracted)", "E1.1", "ContiguousKVCache.attention",
           "out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None],\n"
           "                                     enable_gqa=True)\n",
           "group = queries.shape[1] // keys.shape[1]\n"
           "scores = queries @ keys.repeat_interleave(group, 1).transpose(-1, -2) / q.shape[-1] ** 0.5\n"
           "weights = torch.exp(scores).masked_fill(~visible[:, None], 0)\n"
           "out = weights / weights.sum(-1, keepdim=True) @ values.repeat_interleave(group, 1)\n", "float16"),
    # ---- E2.1: static batching's slot accounting ---------------------------------------------------------
    Mutant("E2.1 counts one decode pass too many", "E2.1", "slot_accounting",
           "range(1, max(outs))", "range(max(outs))", "one batch of 3"),
    Mutant("E2.1 counts empty slots as bubbles", "E2.1", "slot_accounting",
           '"bubbles": b - live', '"bubbles": batch_size - live', "one batch of 3"),
    Mutant("E2.1 counts the whole padded rectangle as padding", "E2.1", "slot_accounting",
           "b * max(lens) - sum(lens)", "b * max(lens)", "one batch of 3"),
    Mutant("E2.1 keeps a row live one pass too long", "E2.1", "slot_accounting",
           "sum(t < n for n in outs)", "sum(t <= n for n in outs)", "one batch of 3"),
    Mutant("E2.1 pads every batch to the longest prompt of all", "E2.1", "slot_accounting",
           "b * max(lens) - sum(lens)", "b * max(prompt_lens) - sum(lens)", "two full batches"),
    Mutant("E2.1 a prefill has no idle slots", "E2.1", "slot_accounting",
           '"idle_slots": idle, "bubbles": 0', '"idle_slots": 0, "bubbles": 0', "one batch of 3"),
    # ---- E3.1: the BlockPool -----------------------------------------------------------------------------
    Mutant("E3.1 blocks_for rounds down", "E3.1", "BlockPool.blocks_for",
           "ceil_div(num_tokens, self.block_size)", "num_tokens // self.block_size", "blocks_for"),
    Mutant("E3.1 blocks_for is one too many at exact multiples", "E3.1", "BlockPool.blocks_for",
           "ceil_div(num_tokens, self.block_size)", "num_tokens // self.block_size + 1", "blocks_for"),
    Mutant("E3.1 blocks_needed forgets the tokens already held", "E3.1", "BlockPool.blocks_needed",
           "self.num_tokens.get(owner, 0) + num_new_tokens", "num_new_tokens", "try_append_slots"),
    Mutant("E3.1 blocks_needed goes negative for a reserved table", "E3.1", "BlockPool.blocks_needed",
           "return need if need > 0 else 0", "return need", "blocks_needed"),
    Mutant("E3.1 allocate takes the most recently freed block", "E3.1", "BlockPool.allocate",
           "blocks = [self._take_free() for _ in range(n)]",
           "blocks = [self.free_queue.popitem(last=True)[0] for _ in range(n)]\n"
           "for b in blocks:\n    self.ref_counts[b] = 1", "allocate: blocks come from the head"),
    Mutant("E3.1 allocate compares with every block, not the free ones", "E3.1", "BlockPool.allocate",
           "if n > len(self.free_queue):", "if n > self.num_blocks:", "too many blocks"),
    Mutant("E3.1 try_append_slots refuses an exact fit", "E3.1", "BlockPool.try_append_slots",
           "if need > len(self.free_queue):", "if need >= len(self.free_queue):", None),
    Mutant("E3.1 try_append_slots leaves an empty table behind when it fails", "E3.1", "BlockPool.try_append_slots",
           "need = self.blocks_needed(owner, num_new_tokens)",
           "self.tables.setdefault(owner, [])\nself.num_tokens.setdefault(owner, 0)\n"
           "self.num_hashed.setdefault(owner, 0)\nneed = self.blocks_needed(owner, num_new_tokens)", "pool is short"),
    Mutant("E3.1 free returns the blocks head first", "E3.1", "BlockPool.free",
           "reversed(self.tables.pop(owner))", "self.tables.pop(owner)", "free: every block comes back"),
    Mutant("E3.1 free ignores the reference count", "E3.1", "BlockPool.free",
           "self.ref_counts[b] -= 1\n    if self.ref_counts[b] == 0:\n        self.free_queue[b] = None",
           "self.ref_counts[b] = 0\n    self.free_queue[b] = None", "shared by two tables"),
    Mutant("E3.1 free forgets the owner's token count", "E3.1", "BlockPool.free",
           "del self.num_tokens[owner], self.num_hashed[owner]", "del self.num_hashed[owner]", None),
    Mutant("E3.1 free forgets how many of the owner's blocks were hashed", "E3.1", "BlockPool.free",
           "del self.num_tokens[owner], self.num_hashed[owner]", "del self.num_tokens[owner]", "forgotten"),
    Mutant("E3.1 free wipes the prefix-cache hashes of the freed blocks", "E3.1", "BlockPool.free",
           "self.free_queue[b] = None",
           "self.free_queue[b] = None\n        if self.block_hash[b] is not None:\n"
           "            del self.hash_to_block[self.block_hash[b]]\n            self.block_hash[b] = None",
           "keep their hashes"),
    # ---- E4.1: the scheduler's running loop -----------------------------------------------------------
    Mutant("E4.1 leaves prompts under way unfinished", "E4.1", "Scheduler._schedule_running",
           "n = budget.prefill_chunk(n)", "n = 0", "a prompt in chunks"),
    Mutant("E4.1 caps a running prompt by the token budget only", "E4.1", "Scheduler._schedule_running",
           "n = budget.prefill_chunk(n)", "n = min(n, budget.tokens)", "a prompt in chunks"),
    Mutant("E4.1 caps a running prompt by the prompt budget only", "E4.1", "Scheduler._schedule_running",
           "n = budget.prefill_chunk(n)", "n = min(n, budget.prompt)", None),
    Mutant("E4.1 takes a prompt's last token for a decode", "E4.1", "Scheduler._schedule_running",
           "decode = n == 1 and len(req.output_token_ids) > 0", "decode = n == 1", None),
    Mutant("E4.1 does not spend the budget on decodes", "E4.1", "Scheduler._schedule_running",
           "budget.spend(n, decode)", "if not decode:\n        budget.spend(n, decode)", "the token budget"),
    Mutant("E4.1 never checks the token budget", "E4.1", "Scheduler._schedule_running",
           "while i < len(running) and budget.tokens > 0:", "while i < len(running):", "token budget"),
    Mutant("E4.1 forgets the policy's service accounting", "E4.1", "Scheduler._schedule_running",
           "self.policy.on_scheduled(req, n)\n    ", "", "fair"),
    Mutant("E4.1 reports a preemption of this step's priority pass as its own", "E4.1", "Scheduler._schedule_running",
           "return len(out.preempted) > preempted_before", "return bool(out.preempted)", "priorit"),
    Mutant("E4.1 never reports memory running short", "E4.1", "Scheduler._schedule_running",
           "return len(out.preempted) > preempted_before", "return False", "memory that runs short"),
    # ---- E5.1: the chunk budget -----------------------------------------------------------------------------
    Mutant("E5.1 a chunk ignores the token budget", "E5.1", "StepBudget.prefill_chunk",
           "min(remaining, self.prompt, self.tokens)", "min(remaining, self.prompt)", "prefill_chunk"),
    Mutant("E5.1 one chunk too many per step", "E5.1", "StepBudget.prefill_chunk",
           "if self.chunks <= 0:", "if self.chunks < 0:", "prefill_chunk"),
    Mutant("E5.1 decodes spend the prompt budget", "E5.1", "StepBudget.spend",
           "if not decode:\n    self.prompt -= num_tokens\n", "self.prompt -= num_tokens\nif not decode:\n", "spend"),
    Mutant("E5.1 a chunk is never counted", "E5.1", "StepBudget.spend",
           "\n    self.chunks -= 1", "", "spend"),
    Mutant("E5.1 a decode uses up a chunk", "E5.1", "StepBudget.spend",
           "\n    self.chunks -= 1", "\nself.chunks -= 1", "spend"),
    Mutant("E5.1 a chunk does not spend the token budget", "E5.1", "StepBudget.spend",
           "self.tokens -= num_tokens\nif not decode:\n", "if decode:\n    self.tokens -= num_tokens\nelse:\n",
           "spend"),
    # ---- E6.1: the preemption victim ------------------------------------------------------------------------
    Mutant("E6.1 preempts the oldest request", "E6.1", "Scheduler._make_room",
           "victim = self.running[-1]", "victim = self.running[0]", "most recently admitted"),
    Mutant("E6.1 always preempts the request that needs the block", "E6.1", "Scheduler._make_room",
           "victim = self.running[-1]", "victim = req", None),
    Mutant("E6.1 preempts once and gives up", "E6.1", "Scheduler._make_room",
           "while self.pool.try_append_slots(req.request_id, n) is None:",
           "if self.pool.try_append_slots(req.request_id, n) is None:", None),
    Mutant("E6.1 keeps preempting after the request itself went", "E6.1", "Scheduler._make_room",
           "\n    if victim is req:\n        return False", "", None),
    Mutant("E6.1 preempts the lowest priority, the oldest of equals", "E6.1", "Scheduler._make_room",
           "victim = self.running[-1]", "victim = max(self.running, key=lambda r: r.priority)", None),
    Mutant("E6.1 preempts the request holding the most blocks", "E6.1", "Scheduler._make_room",
           "victim = self.running[-1]",
           "victim = max(self.running, key=lambda r: len(self.pool.table(r.request_id)))", None),
    # ---- E7.1: the online softmax -----------------------------------------------------------------------
    Mutant("E7.1 softmax without the running max", "E7.1", "paged_attention_kernel",
           "p = tl.exp2(s - m_new[:, None])", "p = tl.exp2(s)", "large scores",
           more=(("l_i = l_i * alpha +", "l_i = l_i +"), ("acc = acc * alpha[:, None] +", "acc = acc +"))),
    Mutant("E7.1 forgets to rescale the weighted sum", "E7.1", "paged_attention_kernel",
           "acc = acc * alpha[:, None] +", "acc = acc +", None),
    Mutant("E7.1 forgets to rescale the running sum", "E7.1", "paged_attention_kernel",
           "l_i = l_i * alpha +", "l_i = l_i +", None),
    Mutant("E7.1 never moves the running max on", "E7.1", "paged_attention_kernel",
           "\n    m_i = m_new", "", None),
    Mutant("E7.1 a query cannot see itself", "E7.1", "paged_attention_kernel",
           "k_pos[None, :] <= q_pos[:, None]", "k_pos[None, :] < q_pos[:, None]", "context 0"),
    Mutant("E7.1 ignores the block table", "E7.1", "paged_attention_kernel",
           "tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)",
           "(k_pos // BLOCK_SIZE).to(tl.int64)", None),
    Mutant("E7.1 natural exp on base-2 scores", "E7.1", "paged_attention_kernel",
           "alpha = tl.exp2(", "alpha = tl.exp(", None, more=(("p = tl.exp2(", "p = tl.exp("),)),
    Mutant("E7.1 rounds the scores to the input dtype", "E7.1", "paged_attention_kernel",
           "s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale",
           "s = (tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale).to(q.dtype)", "16"),
    # ---- E8.1: prefix lookup and share --------------------------------------------------------------------
    Mutant("E8.1 lookup skips over a miss", "E8.1", "BlockPool.lookup",
           "break", "continue", "a miss ends the prefix"),
    Mutant("E8.1 share leaves free cached blocks in the free list", "E8.1", "BlockPool.share",
           "del self.free_queue[b]", "pass", "free cached block"),
    Mutant("E8.1 share counts references before it validates", "E8.1", "BlockPool.share",
           "shared\")\nfor b in blocks:\n", "shared\")\n", "refuses"),
    Mutant("E8.1 share shares a partly filled block", "E8.1", "BlockPool.share",
           "for b in blocks:\n    if self.block_hash[b] is None:\n",
           "for b in ():\n    if self.block_hash[b] is None:\n", "refuses"),
    Mutant("E8.1 share replaces a table that exists", "E8.1", "BlockPool.share",
           "if owner in self.tables:", "if owner in ():", "refuses"),
    Mutant("E8.1 share holds the blocks but no tokens", "E8.1", "BlockPool.share",
           "self.num_tokens[owner] = len(blocks) * self.block_size", "self.num_tokens[owner] = 0", "share: a new"),
    Mutant("E8.1 looks up every full block, leaving nothing to compute", "E8.1", "Scheduler._prefix_hits",
           "req.block_hashes[: (req.num_tokens - 1) // self.block_size]", "req.block_hashes",
           "the engine with prefix caching"),
    Mutant("E8.1 looks up one block too few", "E8.1", "Scheduler._prefix_hits",
           "(req.num_tokens - 1) // self.block_size]", "(req.num_tokens - 1) // self.block_size - 1]",
           "the engine with prefix caching"),
    Mutant("E8.1 hashes each block alone, not chained to its prefix", "E8.1", "Scheduler._prefix_hits",
           "req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)",
           "ids, bs = req.all_token_ids(), self.block_size\n"
           "req.block_hashes = [hash(tuple(ids[i : i + bs])) for i in range(0, len(ids) - bs + 1, bs)]",
           "chain"),
    # ---- E9.1: shortest job first ---------------------------------------------------------------------------
    Mutant("E9.1 sizes a job by its prompt alone", "E9.1", "ShortestJobFirstPolicy.order",
           "work = req.num_prompt_tokens + req.params.max_tokens", "work = req.num_prompt_tokens",
           "least work first"),
    Mutant("E9.1 serves the longest job first", "E9.1", "ShortestJobFirstPolicy.order",
           "return (work,", "return (-work,", "least work first"),
    Mutant("E9.1 puts a preempted request behind its equals", "E9.1", "ShortestJobFirstPolicy.order",
           "0 if front else 1", "1 if front else 0", "preempted request goes back"),
    Mutant("E9.1 breaks ties by arrival only", "E9.1", "ShortestJobFirstPolicy.order",
           "(work, 0 if front else 1, req.arrival_time)", "(work, req.arrival_time)", "preempted request goes back"),
    Mutant("E9.1 ranks by the tokens so far (the rank moves while it runs)", "E9.1", "ShortestJobFirstPolicy.rank",
           "return (req.num_prompt_tokens + req.params.max_tokens, req.admitted_seq)",
           "return (req.num_tokens, req.admitted_seq)", "never changes"),
    Mutant("E9.1 ranks by admission only (preempts the newest, not the longest)", "E9.1",
           "ShortestJobFirstPolicy.rank", "return (req.num_prompt_tokens + req.params.max_tokens, req.admitted_seq)",
           "return req.admitted_seq", None),
    Mutant("E9.1 preempts the oldest of equal jobs", "E9.1", "ShortestJobFirstPolicy.rank",
           "req.admitted_seq)", "-req.admitted_seq)", None),
    # ---- E10.1: goodput ----------------------------------------------------------------------------------
    Mutant("E10.1 refused requests count as good", "E10.1", "SLO.met_by",
           'if req.finish_reason not in ("stop", "length"):', "if req.finish_reason is None:", "not served"),
    Mutant("E10.1 a TTFT met exactly fails", "E10.1", "SLO.met_by",
           "m.ttft > self.ttft", "m.ttft >= self.ttft", "met exactly"),
    Mutant("E10.1 a TPOT met exactly fails", "E10.1", "SLO.met_by",
           "m.tpot > self.tpot", "m.tpot >= self.tpot", "met exactly"),
    Mutant("E10.1 an E2E met exactly fails", "E10.1", "SLO.met_by",
           "m.e2e > self.e2e", "m.e2e >= self.e2e", "met exactly"),
    Mutant("E10.1 a one-token answer misses any TPOT target", "E10.1", "SLO.met_by",
           "m.tpot is not None and m.tpot > self.tpot", "(m.tpot is None or m.tpot > self.tpot)", "one-token"),
    Mutant("E10.1 a target of 0 counts as no target", "E10.1", "SLO.met_by",
           "if self.ttft is not None and", "if self.ttft and", "zero"),
    Mutant("E10.1 TPOT over n gaps, not n - 1", "E10.1", "SLO.met_by",
           "if self.tpot is not None and m.tpot is not None and m.tpot > self.tpot:",
           "t = m.token_times\n"
           "if self.tpot is not None and len(t) > 1 and (t[-1] - t[0]) / len(t) > self.tpot:", "n - 1 gaps"),
    Mutant("E10.1 TPOT from the finish time, not the last token", "E10.1", "SLO.met_by",
           "if self.tpot is not None and m.tpot is not None and m.tpot > self.tpot:",
           "t = m.token_times\n"
           "if self.tpot is not None and len(t) > 1 and (m.finished_time - t[0]) / (len(t) - 1) > self.tpot:",
           "served requests"),
    # ---- E6.4 ------------------------------------------------------------------------------------------------
    Mutant('E6.4 swaps whether or not the host pool has room', 'E6.4', 'Scheduler._preempt',
           'swap and n > 0 and host.can_hold(n)', 'swap and n > 0', 'full host pool'),
    Mutant('E6.4 drops the computed tokens of a swapped victim too', 'E6.4', 'Scheduler._preempt',
           'host.allocate(rid, n)))\n', 'host.allocate(rid, n)))\n    req.num_computed_tokens = 0\n', 'swap out'),
    Mutant('E6.4 copies the table out last block first', 'E6.4', 'Scheduler._preempt',
           'zip(self.pool.table(rid),', 'zip(reversed(self.pool.table(rid)),', 'swap out'),
    Mutant('E6.4 lists the copies back as (device, host) pairs', 'E6.4', 'Scheduler._admit',
           'list(zip(self.host_pool.free(rid), self.pool.table(rid)))',
           'list(zip(self.pool.table(rid), self.host_pool.free(rid)))', 'swap in'),
    Mutant('E6.4 never gives the host blocks back', 'E6.4', 'Scheduler._admit',
           'list(zip(self.host_pool.free(rid), self.pool.table(rid)))',
           'list(zip(self.host_pool.tables[rid], self.pool.table(rid)))', 'swap out'),
    # ---- E8.4 ------------------------------------------------------------------------------------------------
    Mutant('E8.4 takes the most recently freed block', 'E8.4', 'BlockPool._take_free',
           'popitem(last=False)', 'popitem(last=True)', 'fresh pool'),
    Mutant('E8.4 leaves the evicted hash in the index', 'E8.4', 'BlockPool._take_free',
           '    del self.hash_to_block[h]\n', '', 'evicts it'),
    Mutant("E8.4 keeps the evicted block's hash", 'E8.4', 'BlockPool._take_free',
           '    self.block_hash[block] = None\n', '', 'evicts it'),
    Mutant('E8.4 does not count evictions', 'E8.4', 'BlockPool._take_free',
           '    self.num_evictions += 1\n', '', 'evicts it'),
    Mutant('E8.4 gives the block no reference', 'E8.4', 'BlockPool._take_free',
           'self.ref_counts[block] = 1\n', '', 'fresh pool'),
    # ---- E9.3 ------------------------------------------------------------------------------------------------
    Mutant('E9.3 multiplies by the weight', 'E9.3', 'FairPolicy.level',
           '/ self.weight(tenant)', '* self.weight(tenant)', 'level'),
    Mutant('E9.3 breaks ties by tenant order, not by arrival', 'E9.3', 'FairPolicy._next_tenant',
           'key=lambda t: (self.level(t), self.queues[t][0].arrival_time)', 'key=self.level',
           'lowest level goes next'),
    Mutant('E9.3 never advances the virtual time', 'E9.3', 'FairPolicy.pop',
           'self.vtime = max(self.vtime, self.level(tenant))  # the virtual time: the level served last, never lower\n',
           '', 'pop moves the virtual time'),
    Mutant('E9.3 lets the virtual time fall', 'E9.3', 'FairPolicy.pop',
           'max(self.vtime, self.level(tenant))', 'self.level(tenant)', 'pop moves the virtual time'),
    Mutant('E9.3 lets an idle tenant bank credit', 'E9.3', 'FairPolicy._queue',
           'max(self.served[tenant], self.vtime * self.weight(tenant))', 'self.served[tenant]', 'back from idle'),
    Mutant('E9.3 lowers what a returning tenant was served', 'E9.3', 'FairPolicy._queue',
           'max(self.served[tenant], self.vtime * self.weight(tenant))', 'self.vtime * self.weight(tenant)',
           'back from idle'),
    Mutant('E9.3 re-enters at the virtual time, forgetting the weight', 'E9.3', 'FairPolicy._queue',
           'self.vtime * self.weight(tenant))', 'self.vtime)', 'back from idle'),
    # ---- E10.4 -----------------------------------------------------------------------------------------------
    Mutant('E10.4 counts a multiply-add as one FLOP, or q.k only', 'E10.4', 'roofline_terms',
           'per_pair = 4 *', 'per_pair = 2 *', 'one decode token'),
    Mutant('E10.4 counts KV heads, not query heads, for the FLOPs', 'E10.4', 'roofline_terms',
           'c.num_heads * c.head_dim', 'c.num_kv_heads * c.head_dim', 'one decode token'),
    Mutant("E10.4 forgets the decode token's own K/V write", 'E10.4', 'roofline_terms',
           'kv * (shape.decode_context + shape.num_decode_tokens)', 'kv * shape.decode_context', 'one decode token'),
    Mutant('E10.4 reads K/V once per (query, key) pair', 'E10.4', 'roofline_terms',
           'kv * (shape.prefill_context + shape.num_prefill_tokens)', 'kv * shape.prefill_pairs', 'prefill chunk'),
    Mutant('E10.4 prices prefill attention as linear in the chunk', 'E10.4', 'roofline_terms',
           'per_pair * shape.prefill_pairs', 'per_pair * shape.num_prefill_tokens', 'prefill chunk'),
    # ---- E11.1 -----------------------------------------------------------------------------------------------
    Mutant('E11.1 never marks a swap', 'E11.1', 'preemptions',
           'swapped=d.swapped_blocks > 0', 'swapped=False', 'preempted twice'),
    Mutant('E11.1 names the victim as the one it made room for', 'E11.1', 'preemptions',
           't.step, d.by, d.tokens', 't.step, d.request, d.tokens', 'one preemption'),
    Mutant("E11.1 reads a step's admissions before its preemptions", 'E11.1', 'preemptions',
           ('    for d in t.decisions:\n'
            '        if isinstance(d, Preempted):\n'
            '            p = Preemption(d.request, t.step, d.by, d.tokens, swapped=d.swapped_blocks > 0)\n'
            '            found.append(p)\n'
            '            away[d.request] = p\n'
            '    for rid in t.admitted:\n'
            '        if rid in away:\n'
            '            away.pop(rid).resumed = t.step\n'),
           ('    for rid in t.admitted:\n'
            '        if rid in away:\n'
            '            away.pop(rid).resumed = t.step\n'
            '    for d in t.decisions:\n'
            '        if isinstance(d, Preempted):\n'
            '            p = Preemption(d.request, t.step, d.by, d.tokens, swapped=d.swapped_blocks > 0)\n'
            '            found.append(p)\n'
            '            away[d.request] = p\n'),
           'very step that preempted it'),
    # ---- E12.1 -----------------------------------------------------------------------------------------------
    Mutant("E12.1 top-p counts each token's own probability", 'E12.1', 'filter_logits',
           '(probs.cumsum(dim=-1) - probs) >= top_p[:, None]', 'probs.cumsum(dim=-1) > top_p[:, None]', 'top-p keeps'),
    Mutant('E12.1 top-p on the probabilities before top-k', 'E12.1', 'filter_logits',
           'sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)', 'sorted_logits.softmax(dim=-1)',
           'top-p applies to what top-k kept'),
    Mutant('E12.1 returns the logits in sorted order', 'E12.1', 'filter_logits',
           'logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)', 'logits = sorted_logits',
           'top-k keeps'),
    Mutant('E12.1 keeps k + 1 tokens', 'E12.1', 'filter_logits',
           'ranks >= top_k[:, None]', 'ranks > top_k[:, None]', 'top-k keeps'),
    Mutant('E12.1 applies the temperature after filtering', 'E12.1', 'filter_logits',
           'logits = logits / temperature[:, None]\n', '', 'temperature comes before top-p',
           more=(('return logits\n', 'return logits / temperature[:, None]\n'),)),
    # ---- E12.2 -----------------------------------------------------------------------------------------------
    Mutant("E12.2 holds back a whole stop string's length", 'E12.2', 'Detokenizer.update',
           '- max(map(len, stops)) + 1)', '- max(map(len, stops)))', 'held-back text'),
    Mutant('E12.2 holds nothing back for stop strings', 'E12.2', 'Detokenizer.update',
           'settled = settled[: max(0, len(settled) - max(map(len, stops)) + 1)]', 'pass', 'never sent'),
    Mutant('E12.2 sends half a character', 'E12.2', 'Detokenizer.update',
           'settled = settled.rstrip("\\ufffd")', 'pass', 'half a character'),
    Mutant('E12.2 cuts a request that an EOS ended', 'E12.2', 'Detokenizer.update',
           'if stops and ending in (None, "length"):', 'if stops:', 'another reason'),
    Mutant('E12.2 keeps the stop string in the text', 'E12.2', 'Detokenizer.update',
           'text[:at], s, "stop"', 'text[: at + len(s)], s, "stop"', 'never sent'),
    # ---- E12.3 -----------------------------------------------------------------------------------------------
    Mutant('E12.3 sends the role in every chunk', 'E12.3', 'chunk',
           '{"role": "assistant"} if first else {}', '{"role": "assistant"}', 'chat chunk'),
    Mutant('E12.3 a stop reason in every chunk', 'E12.3', 'chunk',
           'if reason is not None:\n    choice["stop_reason"]', 'choice["stop_reason"]', 'last chunk'),
    Mutant('E12.3 usage without include_usage', 'E12.3', 'chunk',
           'if gen.include_usage:\n    body["usage"] = None', 'body["usage"] = None', 'include_usage'),
    Mutant('E12.3 the non-streaming object name', 'E12.3', 'chunk',
           'obj = "chat.completion.chunk"', 'obj = "chat.completion"', 'chat chunk'),
    Mutant('E12.3 ends an event with one newline', 'E12.3', 'sse', '\\n\\n".encode()', '\\n".encode()', 'sse'),
    # ---- E13.1 -----------------------------------------------------------------------------------------------
    Mutant("E13.1 greedy compares guess i with the row after it", "E13.1", "accept_greedy",
           "zip(guesses, target)", "zip(guesses, target[1:])", "every guess right"),
    Mutant("E13.1 greedy gives no bonus token", "E13.1", "accept_greedy",
           "kept.append(target[len(kept)])", "if len(kept) < len(guesses):\n    kept.append(target[len(kept)])",
           "every guess right"),
    Mutant("E13.1 greedy goes on past a wrong guess", "E13.1", "accept_greedy",
           "break", "continue", "the first guess wrong"),
    Mutant("E13.1 accepts with probability 1 - p(guess)", "E13.1", "accept_sampled",
           "< float(probs[i, guess])", "< 1 - float(probs[i, guess])", "certain guess"),
    Mutant("E13.1 draws the correction from p, the rejected guess left in", "E13.1", "accept_sampled",
           "residual[guess] = 0.0", "residual[guess] = residual[guess]", "certain guess"),
    Mutant("E13.1 sampling gives no bonus token", "E13.1", "accept_sampled",
           "kept.append(draw(probs[len(guesses)], generator))", "pass", "certain guess"),
    Mutant("E13.1 sampling goes on after a rejection", "E13.1", "accept_sampled",
           "kept.append(draw(residual, generator))\n    return kept",
           "kept.append(draw(residual, generator))\n    continue", "certain guess"),
    Mutant("E13.1 sampling compares guess i with row i + 1", "E13.1", "accept_sampled",
           "< float(probs[i, guess])", "< float(probs[i + 1, guess])", "certain guess"),
    Mutant("E13.1 accepts a guess when p(guess) > 0.5", "E13.1", "accept_sampled",
           "if float(torch.rand((), generator=generator)) < float(probs[i, guess]):",
           "if float(probs[i, guess]) > 0.5:", "first token is distributed"),
    Mutant("E13.1 draws the bonus token from the row before the last", "E13.1", "accept_sampled",
           "probs[len(guesses)]", "probs[len(guesses) - 1]", "certain guess"),
    Mutant("E13.1 draws without the request's generator", "E13.1", "accept_sampled",
           "torch.rand((), generator=generator)", "torch.rand(())", "same generator seed"),
    # ---- E14.1 -----------------------------------------------------------------------------------------------
    Mutant("E14.1 scales by the largest value, not the largest absolute value", "E14.1", "quantize_int8",
           "g.abs().amax(dim=1)", "g.amax(dim=1)", "known inputs"),
    Mutant("E14.1 rounds toward zero (truncates)", "E14.1", "quantize_int8",
           ".round().clamp(-127, 127)", ".trunc().clamp(-127, 127)", "known inputs"),
    Mutant("E14.1 one scale per column, not per group", "E14.1", "quantize_int8",
           "g.abs().amax(dim=1)", "g.abs().amax(dim=(0, 1)).expand(g.shape[0], -1)", "weight-like matrix"),
    Mutant("E14.1 groups along the output dimension", "E14.1", "quantize_int8",
           "g = grouped(w, group)", "g = grouped(w.t(), group)", "known inputs",
           more=(("q.flatten(0, 1)[: w.shape[0]]", "q.flatten(0, 1)[: w.shape[1]].t()"),)),
    Mutant("E14.1 divides by the unrounded scale", "E14.1", "quantize_int8",
           "divisor = scales.float()[:, None, :]", "divisor = (g.abs().amax(dim=1) / 127)[:, None, :]",
           "weight-like matrix"),
    Mutant("E14.1 a step of 1/128 of the largest value", "E14.1", "quantize_int8",
           "/ 127).half()", "/ 128).half()", "known inputs"),
    # ---- E15.1 -----------------------------------------------------------------------------------------------
    Mutant("E15.1 the first token seen when it was sampled (the transfer left out of TTFT)", "E15.1", "land",
           "pm.first_scheduled_time, at", "pm.first_scheduled_time, pm.first_token_time", "one prefilled request"),
    Mutant("E15.1 arrives at the decode instance (TTFT from the handoff)", "E15.1", "land",
           "= pm.arrival_time, pm.first_scheduled_time", "= at, pm.first_scheduled_time", "one prefilled request"),
    Mutant("E15.1 forgets the prefill's first token", "E15.1", "land",
           "req.append_token(prefilled.output_token_ids[0])", "pass", "one prefilled request"),
    Mutant("E15.1 keeps the prefill's max_tokens=1", "E15.1", "land",
           "params = replace(prefilled.params, max_tokens=max_tokens)", "params = prefilled.params",
           "one prefilled request"),
    Mutant("E15.1 leaves the prompt uncomputed (the decode instance prefills it again)", "E15.1", "land",
           "req.num_computed_tokens = num_prompt", "pass", "one prefilled request"),
    Mutant("E15.1 no landing pool: computed tokens without K/V to copy in", "E15.1", "land",
           "engine.host_pool.allocate(rid, num_prompt)", "pass", "one prefilled request"),
    Mutant("E15.1 no token time for the first token", "E15.1", "land",
           "m.token_times = [at]", "m.token_times = []", "one prefilled request"),
    # ---- E9.4 (the capstone) ---------------------------------------------------------------------------------
    Mutant("E9.4 ranks by the tokens so far", "E9.4", "CapstonePolicy.rank",
           "req.num_prompt_tokens + req.params.max_tokens,", "req.num_tokens,", "does not change"),
    Mutant("E9.4 serves the most work first", "E9.4", "CapstonePolicy.order",
           "return (first_token_work,", "return (-first_token_work,", "goodput on the sample"),
    Mutant("E9.4 keeps arrival order (first come, first served with preempted first)", "E9.4",
           "CapstonePolicy.order", "return (first_token_work, 0 if front else 1,", "return (0 if front else 1,",
           "goodput on the sample"),
    Mutant("E9.4 orders by the answer's length alone", "E9.4", "CapstonePolicy.order",
           "first_token_work,", "-req.params.max_tokens,", "goodput on the sample"),
]

ALTERNATIVES = [
    Alternative("E1.1 attention written out with einsum, one row's keys at a time", "E1.1", {
        "ContiguousKVCache.attention": """
        kc, vc = self.k[layer], self.v[layer]
        for r in range(b):  # row r's tokens go into its own strip, at their positions
            kc[slots[r], positions[r]] = k[r * q_len : (r + 1) * q_len]
            vc[slots[r], positions[r]] = v[r * q_len : (r + 1) * q_len]
        group = q.shape[1] // k.shape[1]  # query heads per K/V head
        keys = kc[slots, :length].repeat_interleave(group, dim=2)  # [B, L, Hq, D]
        values = vc[slots, :length].repeat_interleave(group, dim=2)
        queries = q.view(b, q_len, *q.shape[1:])  # [B, Q, Hq, D]
        scores = torch.einsum("bqhd,blhd->bhql", queries, keys) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        out = torch.einsum("bhql,blhd->bqhd", scores.softmax(-1), values)
        return out.reshape(b * q_len, *q.shape[1:])
        """}),
    Alternative("E2.1 counting down each answer's tokens", "E2.1", {
        "slot_accounting": """
        steps = []
        for first in range(0, len(prompt_lens), batch_size):
            lens = list(prompt_lens[first : first + batch_size])
            left = [n - 1 for n in output_lens[first : first + batch_size]]  # the prefill samples each first token
            idle = batch_size - len(lens)
            steps.append({"batch_slots": batch_size, "useful": sum(lens),
                          "padding": sum(max(lens) - n for n in lens), "idle_slots": idle, "bubbles": 0})
            while any(left):
                live = sum(1 for n in left if n > 0)
                steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": idle,
                              "bubbles": len(lens) - live})
                left = [max(n - 1, 0) for n in left]
        return steps
        """}),
    Alternative("E3.1 with negative floor division, one allocation path and a popping free", "E3.1", {
        "BlockPool.blocks_for": "return -(-num_tokens // self.block_size)",
        "BlockPool.blocks_needed": """
        held = len(self.tables[owner]) if owner in self.tables else 0
        return max(0, self.blocks_for(self.num_tokens.get(owner, 0) + num_new_tokens) - held)
        """,
        "BlockPool.allocate": """
        if not 0 <= n <= self.num_free_blocks:
            raise BlockPoolError(f"cannot allocate {n} blocks: {self.num_free_blocks} are free")
        table = self.tables.setdefault(owner, [])
        start = len(table)
        for _ in range(n):
            table.append(self._take_free())
        if owner not in self.num_tokens:
            self.num_tokens[owner] = self.num_hashed[owner] = 0
        return table[start:]
        """,
        "BlockPool.try_append_slots": """
        need = self.blocks_needed(owner, num_new_tokens)
        if need > self.num_free_blocks:
            return None
        blocks = self.allocate(owner, need)
        self.num_tokens[owner] += num_new_tokens
        return blocks
        """,
        "BlockPool.free": """
        table = self.tables.get(owner)
        if table is None:
            raise BlockPoolError(f"{owner!r} holds no table")
        while table:
            b = table.pop()  # the last block first
            self.ref_counts[b] -= 1
            if not self.ref_counts[b]:
                self.free_queue[b] = None
        del self.tables[owner]
        self.num_tokens.pop(owner)
        self.num_hashed.pop(owner)
        """}),
    Alternative("E4.1 a for loop over a copy of the running list", "E4.1", {
        "Scheduler._schedule_running": """
        preempted_before = len(out.preempted)
        for req in list(self.running):
            if budget.tokens <= 0 or req not in self.running:
                break  # the step is full, or req was preempted to make room for one ranked above it
            left = req.num_tokens - req.num_computed_tokens
            decode = left == 1 and bool(req.output_token_ids)
            n = 1 if decode else budget.prefill_chunk(left)
            if n <= 0:
                continue
            if not self._make_room(req, n, out):
                break
            out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, self.pool.table(req.request_id)))
            self.policy.on_scheduled(req, n)
            budget.spend(n, decode)
        return len(out.preempted) != preempted_before
        """}),
    Alternative("E5.1 with conditional expressions", "E5.1", {
        "StepBudget.prefill_chunk": "return max(0, min(remaining, self.prompt, self.tokens)) if self.chunks > 0 else 0",
        "StepBudget.spend": """
        self.tokens -= num_tokens
        self.prompt -= 0 if decode else num_tokens
        self.chunks -= 0 if decode else 1
        """}),
    Alternative("E6.1 counting the blocks before it takes them", "E6.1", {
        "Scheduler._make_room": """
        while self.pool.blocks_needed(req.request_id, n) > self.pool.num_free_blocks:
            victim = self.running[-1]
            self._preempt(victim, out, by=req)
            if victim is req:
                return False
        self.pool.append_slots(req.request_id, n)
        return True
        """}),
    Alternative("E7.1 rescaling before adding, offsets by subtraction", "E7.1", {
        "paged_attention_kernel": """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block_idx = k_pos // BLOCK_SIZE
            block = tl.load(table + block_idx, mask=k_ok, other=0).to(tl.int64)
            base = block * stride_cb + (k_pos - block_idx * BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + base[:, None] + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + base[:, None] + d[None, :], mask=kv_mask, other=0.0)
            visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
            s = tl.where(visible, tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale, float("-inf"))
            m_next = tl.maximum(m_i, tl.max(s, 1))
            correction = tl.exp2(m_i - m_next)
            p = tl.exp2(s - m_next[:, None])
            acc = acc * correction[:, None]
            acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            l_i = l_i * correction + tl.sum(p, 1)
            m_i = m_next
        """}),
    Alternative("E8.1 membership tests, one validation pass, trimming the hits afterwards", "E8.1", {
        "BlockPool.lookup": """
        hits: list[int] = []
        for h in hashes:
            if h not in self.hash_to_block:
                return hits  # the prefix ends at the first miss
            hits.append(self.hash_to_block[h])
        return hits
        """,
        "BlockPool.share": """
        if owner in self.tables:
            raise BlockPoolError(f"{owner!r} already has a table")
        uncached = [b for b in blocks if self.block_hash[b] is None]
        if uncached:
            raise BlockPoolError(f"blocks {uncached} are not cached")
        for b in blocks:
            self.free_queue.pop(b, None)  # a free cached block leaves the free list
            self.ref_counts[b] += 1
        self.tables[owner] = [*blocks]
        self.num_tokens[owner] = self.block_size * len(blocks)
        self.num_hashed[owner] = len(blocks)
        """,
        "Scheduler._prefix_hits": """
        if not self.config.enable_prefix_caching:
            return []
        req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)
        hits = self.pool.lookup(req.block_hashes)
        if len(hits) * self.block_size >= req.num_tokens:  # all cached: the last token is computed again
            hits = hits[:-1]
        return hits
        """}),
    Alternative("E9.1 with a boolean tie-break and the prompt's length", "E9.1", {
        "ShortestJobFirstPolicy.order": "return (req.num_prompt_tokens + req.params.max_tokens, not front, "
                                        "req.arrival_time)",
        "ShortestJobFirstPolicy.rank": "return (len(req.prompt_token_ids) + req.params.max_tokens, req.admitted_seq)",
    }),
    Alternative("E10.1 one verdict per target", "E10.1", {
        "SLO.met_by": """
        if req.finish_reason not in ("stop", "length"):
            return False
        m = req.metrics
        ttft_ok = self.ttft is None or (m.ttft is not None and m.ttft <= self.ttft)
        tpot_ok = self.tpot is None or m.tpot is None or m.tpot <= self.tpot  # one token: no TPOT to miss
        e2e_ok = self.e2e is None or (m.e2e is not None and m.e2e <= self.e2e)
        return ttft_ok and tpot_ok and e2e_ok
        """}),
    Alternative('E6.4 the recompute branch first, pairs by comprehension', 'E6.4', {
        'Scheduler._preempt': """
        swap = self.config.preemption_mode == "swap"
        if not (swap and n > 0 and host.can_hold(n)):
            req.num_computed_tokens = 0  # recompute
        else:
            host_blocks = host.allocate(rid, n)
            out.swap_out[rid] = [(d, h) for d, h in zip(self.pool.table(rid), host_blocks)]
        """}),
    Alternative('E6.4 frees the host blocks first, pairs with what allocate returned', 'E6.4', {
        'Scheduler._admit': """
        if rid in self.host_pool:
            host_blocks = self.host_pool.free(rid)
            device_blocks = self.pool.allocate(rid, total_blocks)
            self.pool.append_slots(rid, req.num_computed_tokens)
            out.swap_in[rid] = list(zip(host_blocks, device_blocks))
        """}),
    Alternative('E8.4 the head by iteration, the walrus for the hash', 'E8.4', {
        'BlockPool._take_free': """
        block = next(iter(self.free_queue))
        del self.free_queue[block]
        if (h := self.block_hash[block]) is not None:
            self.hash_to_block.pop(h)
            self.block_hash[block] = None
            self.num_evictions += 1
        self.ref_counts[block] = 1
        return block
        """}),
    Alternative('E9.3 an if instead of max', 'E9.3', {
        'FairPolicy.pop': """
        tenant = self._next_tenant()
        if self.level(tenant) > self.vtime:
            self.vtime = self.level(tenant)
        return self._take(tenant, self.queues[tenant].popleft())
        """}),
    Alternative('E9.3 the first of the sorted tenants', 'E9.3', {
        'FairPolicy._next_tenant': """
        return sorted(self.queues, key=lambda t: (self.level(t), self.queues[t][0].arrival_time))[0]
        """}),
    Alternative('E10.4 the factors spelled out, the bytes as two sums', 'E10.4', {
        'roofline_terms': """
        flops_per_pair = 2 * 2 * c.num_layers * c.num_heads * c.head_dim  # two products, a multiply-add each
        prefill = (flops_per_pair * shape.prefill_pairs, kv * shape.prefill_context + kv * shape.num_prefill_tokens)
        decode = (flops_per_pair * shape.decode_context, kv * shape.decode_context + kv * shape.num_decode_tokens)
        """}),
    Alternative('E11.1 closes the open preemption by search', 'E11.1', {
        'preemptions': """
        found: list[Preemption] = []
        for t in trace:
            for d in t.decisions:
                if d.kind == "preempted":
                    found.append(Preemption(d.request, t.step, d.by, d.tokens, d.swapped_blocks > 0))
            for rid in t.admitted:
                for p in found:
                    if p.request == rid and p.resumed is None:
                        p.resumed = t.step
        return found
        """}),
    Alternative('E12.1 row by row', 'E12.1', {
        'filter_logits': """
        logits = logits / temperature[:, None]
        if bool((top_k < logits.shape[-1]).any()) or bool((top_p < 1).any()):
            for row, k, p in zip(logits, top_k.tolist(), top_p.tolist()):
                ranked, order = row.sort(descending=True)
                ranked[k:] = float("-inf")
                probs = ranked.softmax(dim=-1)
                ranked[probs.cumsum(dim=-1) - probs >= p] = float("-inf")
                row[order] = ranked  # the row is a view of logits: written in place
        return logits
        """}),
    Alternative('E12.2 the hold-back computed once, 0 without stop strings', 'E12.2', {
        'Detokenizer.update': """
        before = self.streamed.get(req.request_id, "")
        text = self.tokenizer.decode(req.output_token_ids)
        stops = req.params.stop or []
        found = None
        if ending is None or ending == "length":
            for s in stops:
                at = text.find(s, max(0, len(before) - len(s)))
                if at != -1:
                    text, found, ending = text[:at], s, "stop"
                    break
        if ending:
            settled = text
        else:
            hold = max((len(s) for s in stops), default=1) - 1
            settled = text[: max(0, len(text) - hold)].rstrip("\\ufffd")
        new = settled[len(before):] if settled.startswith(before) else ""
        self.streamed[req.request_id] = text if ending else before + new
        return TextUpdate(new, found)
        """}),
    Alternative('E12.3 the delta by unpacking, usage by a dict union', 'E12.3', {
        'chunk': """
        reason = finish_reason(out)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if out.finished:
            choice["stop_reason"] = out.outputs[0].stop_reason
        if gen.kind == "chat":
            choice["delta"] = {**({"role": "assistant"} if first else {}), "content": out.new_text}
            kind = "chat.completion.chunk"
        else:
            choice["text"] = out.new_text
            kind = "text_completion"
        body = {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}
        return body | ({"usage": None} if gen.include_usage else {})
        """}),
    Alternative('E12.3 bytes joined', 'E12.3', {
        'sse': """
        payload = data if isinstance(data, str) else json.dumps(data)
        return b"data: " + payload.encode() + b"\\n\\n"
        """}),
    Alternative("E13.1 a while loop and slices; torch.multinomial draws", "E13.1", {
        "accept_greedy": """
        n = 0
        while n < len(guesses) and guesses[n] == target[n]:
            n += 1
        return list(guesses[:n]) + [target[n]]
        """,
        "accept_sampled": """
        out: list[int] = []
        for row, guess in zip(probs, guesses):
            u = torch.rand(1, generator=generator).item()
            if u >= row[guess].item():  # rejected: the target's token, drawn with the guess taken out
                others = row.clone()
                others[guess] = 0
                out.append(int(torch.multinomial(others, 1, generator=generator)))
                return out
            out.append(guess)
        out.append(int(torch.multinomial(probs[-1], 1, generator=generator)))
        return out
        """}),
    Alternative("E14.1 group by group, in a loop", "E14.1", {
        "quantize_int8": """
        w = w.detach().float()
        k, n = w.shape
        groups = (k + group - 1) // group
        q = torch.zeros(k, n, dtype=torch.int8)
        scales = torch.zeros(groups, n, dtype=torch.float16)
        for i in range(groups):
            rows = w[i * group:(i + 1) * group]
            scales[i] = (rows.abs().max(dim=0).values / 127).to(torch.float16)
            step = scales[i].float()
            nonzero = step > 0
            values = torch.zeros_like(rows)
            values[:, nonzero] = torch.round(rows[:, nonzero] / step[nonzero])
            q[i * group:(i + 1) * group] = values.clamp(-127, 127).to(torch.int8)
        return Int8Weight(q, scales, group)
        """}),
    Alternative("E15.1 a fresh SamplingParams, the metrics one by one", "E15.1", {
        "land": """
        n = len(prefilled.prompt_token_ids)
        p = prefilled.params
        params = SamplingParams(max_tokens=max_tokens, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                seed=p.seed, stop=p.stop, stop_token_ids=p.stop_token_ids, ignore_eos=p.ignore_eos)
        req = engine.add_request(prefilled.request_id, list(prefilled.prompt_token_ids), params,
                                 priority=prefilled.priority, tenant=prefilled.tenant, arrival_time=at)
        req.num_computed_tokens = n
        engine.host_pool.allocate(req.request_id, n)
        req.append_token(prefilled.output_token_ids[0])
        req.metrics.arrival_time = prefilled.metrics.arrival_time
        req.metrics.first_scheduled_time = prefilled.metrics.first_scheduled_time
        req.metrics.first_token_time = at
        req.metrics.token_times.append(at)
        req.metrics.num_preemptions = prefilled.metrics.num_preemptions
        req.metrics.num_cached_tokens = prefilled.metrics.num_cached_tokens
        return req
        """}),
    Alternative("E9.4 least total work first (E9.1's keys)", "E9.4", {
        "CapstonePolicy.order": """
        return (req.num_prompt_tokens + req.params.max_tokens, not front, req.arrival_time)
        """}),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_checker_catches_wrong_solution(mutant):
    with StandIns() as swap:
        swap.try_body(mutant.exercise, mutant.unit, mutant.body(), mutant.index)
        result = run_exercise(mutant.exercise, timeout=60)
    assert result.status == "failed", f"{mutant.name}: the check did not fail ({result.status})\n{result.report()}"
    assert result.stub is None, f"{mutant.name}: failed on a stub, not on the wrong code\n{result.report()}"
    if mutant.case is not None:
        assert mutant.case in (result.case or ""), f"{mutant.name}: caught at the wrong case\n{result.report()}"


@pytest.mark.parametrize("alternative", ALTERNATIVES, ids=lambda a: a.name)
def test_checker_accepts_a_different_correct_solution(alternative):
    with StandIns() as swap:
        for unit, body in alternative.bodies.items():
            assert textwrap.dedent(body).strip() != reference_body(alternative.exercise, unit).strip(), (
                f"{alternative.name}: {unit} is the reference itself, not an alternative")
            swap.try_body(alternative.exercise, unit, body)
        result = run_exercise(alternative.exercise, timeout=60)
    assert result.passed, f"{alternative.name}: a correct solution failed the check\n{result.report()}"


def test_every_build_exercise_is_covered():
    """A new build exercise needs its own wrong solutions and a correct alternative here, or this fails."""
    builds = [e.id for e in EXERCISES if e.kind == "build"]
    for ex in builds:
        mutants = sum(m.exercise == ex for m in MUTANTS)
        alternatives = sum(a.exercise == ex for a in ALTERNATIVES)
        assert mutants >= 3 and alternatives >= 1, (
            f"{ex} has {mutants} mutants and {alternatives} alternatives here: at least 3 and 1 are needed")
    assert len({m.name for m in MUTANTS}) == len(MUTANTS), "two mutants share a name"


@pytest.mark.needs_exercise("E3.1")
def test_a_failed_check_leaves_the_engine_as_it_was():
    """A check swaps code in and out; after a failing one, every function is the original again."""
    from minfer.kv.block_pool import BlockPool

    before = dict(vars(BlockPool))
    with StandIns() as swap:
        swap.try_body("E3.1", "BlockPool.blocks_for", "return 0")
        assert BlockPool.blocks_for is not before["blocks_for"]
        assert not run_exercise("E3.1").passed
    assert dict(vars(BlockPool)) == before
    assert run_exercise("E3.1").passed


@pytest.mark.needs_exercise("E2.1")
def test_a_check_first_imported_during_a_stand_in_checks_the_reference_after_it():
    """A module imported while a wrong answer stood in for a module-level function took the wrong answer by
    name; leaving the stand-in gives it the original back, or that check would grade the wrong answer ever after."""
    import sys

    sys.modules.pop("minfer.exercises.checks.ch02", None)  # imported afresh, inside the stand-in
    mutant = next(m for m in MUTANTS if m.name == "E2.1 counts one decode pass too many")
    with StandIns() as swap:
        swap.try_body(mutant.exercise, mutant.unit, mutant.body())
        assert not run_exercise(mutant.exercise).passed
    assert run_exercise(mutant.exercise).passed
