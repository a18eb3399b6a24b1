"""Every exercise of the course, in one table.

Three kinds:

* **build** -- write a real piece of the engine, in the package, between ``# BEGIN EXERCISE`` and
  ``# END EXERCISE`` markers. ``check`` runs hidden edge cases against it.
* **predict** -- write down a number before the chapter measures it; ``check(id, number)`` measures it and
  says how close you were and why the number is what it is.
* **explain** -- a short written answer; model answers are in ``docs/instructor.md``.

A checker is named ``"module:function"`` inside ``minfer.exercises.checks`` and imported only when it runs
(listing the exercises imports nothing of the engine). ``minutes`` is the time a student typically needs,
``difficulty`` how hard it is (1-3: the course never sets two 3s in a row), ``requires`` the earlier exercises it
builds on; ``heading`` is how its chapter announces all of that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["build", "predict", "explain"]


@dataclass(slots=True, frozen=True)
class Exercise:
    id: str  # "E<chapter>.<n>"
    kind: Kind
    chapter: int
    section: str  # the chapter section that sets it (stub messages point there)
    title: str
    task: str  # one or two sentences: what to do
    checker: str | None = None  # "ch03:check_block_pool" (build, predict); None for explain
    minutes: int = 15
    difficulty: int = 1  # 1 (a direct application) .. 3 (several cases to get right together)
    requires: tuple[str, ...] = ()  # earlier exercises whose ideas (and code) this one builds on

    @property
    def heading(self) -> str:
        """How the chapter announces it (its markdown cell starts with ``### `` and this): kind, difficulty, time
        and prerequisites, from this one table."""
        after = f"; after {', '.join(self.requires)}" if self.requires else ""
        return (f"Exercise {self.id} · {self.kind}: {self.title} "
                f"(difficulty {self.difficulty} of 3, about {self.minutes} minutes{after})")

    @property
    def notebook_hint(self) -> str:
        return f"chapter {self.chapter:02d} §{self.section}"


def _b(id: str, chapter: int, section: str, title: str, task: str, checker: str, minutes: int, *, difficulty: int,
       requires: tuple[str, ...] = ()) -> Exercise:
    return Exercise(id, "build", chapter, section, title, task, checker, minutes, difficulty, requires)


def _p(id: str, chapter: int, section: str, title: str, task: str, checker: str, minutes: int = 5, *,
       difficulty: int, requires: tuple[str, ...] = ()) -> Exercise:
    return Exercise(id, "predict", chapter, section, title, task, checker, minutes, difficulty, requires)


def _e(id: str, chapter: int, section: str, title: str, task: str, minutes: int = 10, *, difficulty: int,
       requires: tuple[str, ...] = ()) -> Exercise:
    return Exercise(id, "explain", chapter, section, title, task, None, minutes, difficulty, requires)


EXERCISES: tuple[Exercise, ...] = (
    # 01 -- the KV cache and the two phases
    _b("E1.1", 1, "A KV cache", "the KV-cache step",
       "Write the attend step of ContiguousKVCache.attention: store the new tokens' keys and values at their "
       "positions in each row's strip (slots[row], not the row number), then attend each query to its strip's keys "
       "at positions 0..its own -- never to a later position, or the padding a neighbour's prefill wrote there. "
       "The new tokens may be a chunk that starts mid-sequence.", "ch01:check_kv_cache", 30, difficulty=2),
    _p("E1.2", 1, "Prefill and decode, measured", "decode cost per token, batch 32 vs 1",
       "How many times cheaper per token is a decode step at batch 32 than at batch 1 (context 128)?",
       "ch01:measure_decode_batching", difficulty=1),
    _e("E1.3", 1, "A KV cache", "why the speed-up is smaller",
       "The cache cut the token computations 15x, but the time far less. Why?", difficulty=1),
    # 02 -- static batching
    _b("E2.1", 2, "Request-level batching", "static batching's slot accounting",
       "Write baselines.slot_accounting: per forward pass of static batching, how many row-slots computed useful "
       "tokens, padding, finished rows (bubbles), or sat idle. A batch's prefill pads every prompt to its longest "
       "and samples each row's first token; one decode pass follows per further token of its longest answer (none "
       "after one-token answers); a last, smaller batch leaves slots idle.", "ch02:check_slot_accounting", 25,
       difficulty=2),
    _p("E2.2", 2, "Request-level batching", "useful decode rows",
       "Chapter 02's 24 requests run in static batches of 8. What percentage of the decode rows compute a token "
       "that someone reads?", "ch02:measure_decode_share", difficulty=1, requires=('E2.1',)),
    _e("E2.3", 2, "Request-level batching", "sorting the queue",
       "Sort the requests by length before batching them: what does it fix, what not, and why can a server not "
       "do it well?", difficulty=2),
    # 03 -- the paged KV cache
    _b("E3.1", 3, "The BlockPool", "the BlockPool: allocate, append, free",
       "Write BlockPool.blocks_for, blocks_needed, allocate, try_append_slots and free. Blocks come from the head "
       "of the free list, one reference each; a new owner gets a table even for 0 blocks or 0 tokens; a new block "
       "is taken only when the last is full, and blocks_needed is never negative (a table may hold more blocks "
       "than its tokens fill). When the pool is short, allocate raises BlockPoolError (so does a negative count) "
       "and try_append_slots returns None, both changing nothing. free gives the blocks back tail-first, each to "
       "the free list only when its last owner lets go, and raises BlockPoolError for an owner that holds no "
       "table (unknown, or freed already).", "ch03:check_block_pool", 45, difficulty=3),
    _p("E3.2", 3, "The BlockPool", "blocks after step 5",
       "A request with a 45-token prompt runs alone in a pool of 16-token blocks. How many blocks does it hold "
       "after step 5 (step 1 is its prefill)?", "ch03:measure_blocks_after_step5", difficulty=1, requires=('E3.1',)),
    _e("E3.3", 3, "What paging wastes", "choosing a block size",
       "Why not blocks of 1 token (no waste at all), or of 256? Name what each extreme costs.",
       difficulty=1, requires=('E3.1',)),
    # 04 -- continuous batching
    _b("E4.1", 4, "The scheduler", "the scheduler's running-request loop",
       "Write Scheduler._schedule_running: every running request, in rank order, gets one decode token or its "
       "next prompt chunk (as much of the rest of its prompt as the step's budget gives it) until the step's "
       "token budget is spent; grow its blocks (preempting if the pool is short: stop if the request itself was "
       "the victim), schedule it, tell the policy and spend the budget. Return whether anyone was preempted.",
       "ch04:check_running_loop", 45, difficulty=3, requires=('E3.1',)),
    _p("E4.2", 4, "Run it", "forward passes",
       "The 24 requests of chapter 02 run with continuous batching, 8 at a time. How many forward passes (steps) "
       "will the engine take?", "ch04:measure_forward_passes", difficulty=2, requires=('E4.1',)),
    _e("E4.3", 4, "The scheduler", "running requests first",
       "Why does the scheduler serve running requests before it admits waiting ones? What would go wrong the "
       "other way round?", difficulty=1, requires=('E4.1',)),
    # 05 -- chunked prefill
    _b("E5.1", 5, "The budget in the scheduler", "the chunk budget",
       "Write StepBudget.prefill_chunk and StepBudget.spend: how many prompt tokens a request may compute this "
       "step, and what a decode or a chunk uses up of the step's three budgets.", "ch05:check_chunk_budget", 20,
       difficulty=2, requires=('E4.1',)),
    _p("E5.2", 5, "The experiment", "steps for a chunked prompt",
       "Four requests are decoding when a 1,536-token prompt arrives; chunked_prefill_size=256 and the default "
       "token budget. In how many steps is the long prompt computed?", "ch05:measure_chunked_steps",
       difficulty=2, requires=('E5.1',)),
    _e("E5.3", 5, "The experiment", "choosing a chunk size",
       "What does a smaller chunk buy, and what does it cost? Which users feel each side?",
       difficulty=1, requires=('E5.1',)),
    # 06 -- preemption
    _b("E6.1", 6, "Preemption under memory pressure", "the preemption victim",
       "Write Scheduler._make_room: grow a request's blocks, preempting the lowest-ranked running request (the "
       "last of the running list, which is kept in rank order) and trying again until the pool can; if the "
       "request itself was the victim, stop there and return False.", "ch06:check_victim", 20,
       difficulty=1, requires=('E4.1',)),
    _p("E6.2", 6, "A burst into a small pool", "how many preemptions",
       "Chapter 06's eight chat requests (48 output tokens each) arrive at once in a pool of 16 blocks of 8 "
       "tokens. How many preemptions happen before all finish?", "ch06:measure_preemptions",
       difficulty=2, requires=('E6.1',)),
    _e("E6.3", 6, "A burst into a small pool", "recompute, swap, or reserve",
       "Why does the victim go back to the front of the queue? When would swapping its blocks to host memory "
       "beat recomputing them?", difficulty=2, requires=('E6.1',)),
    _b("E6.4", 6, "Recompute or swap?", "swap preemption: out to host memory and back",
       "Write the swap path of the scheduler. In Scheduler._preempt: with preemption_mode=\"swap\", a victim that "
       "has computed tokens (n > 0) whose K/V fit in the host pool (host.can_hold(n)) gets host blocks for them "
       "(host.allocate(rid, n)) and out.swap_out[rid] lists the copies, (device block, host block) pairs in table "
       "order, and keeps its num_computed_tokens; any other victim drops its K/V: num_computed_tokens = 0. In "
       "Scheduler._admit: a request the host pool holds (rid in self.host_pool) takes total_blocks device blocks, "
       "fills them with its computed tokens (pool.append_slots), gives its host blocks back (host_pool.free, which "
       "returns them) and out.swap_in[rid] lists the copies back, (host block, device block) pairs in table order.",
       "ch06:check_swap", 25, difficulty=2, requires=('E6.1',)),
    # 07 -- Triton kernels
    _b("E7.1", 7, "4. The paged-attention kernel", "the online-softmax loop",
       "Write the loop of paged_attention_kernel: for each tile of BLOCK_N keys, find their blocks through the "
       "block table, load keys, score, mask causally (and keys past the context's end, and dimensions past "
       "head_dim), and fold the tile into the running max, sum and weighted values -- rescaling what was summed "
       "when the maximum rises, so that no raw score is ever exponentiated.", "ch07:check_online_softmax", 45,
       difficulty=3, requires=('E1.1', 'E3.1')),
    _p("E7.2", 7, "1. What the reference does -- and what it wastes", "bytes moved, reference vs kernel",
       "For one decode step of 32 requests with contexts between 20 and 600 tokens, how many times the bytes "
       "attention needs does the reference move (gather, write the copy, read it again)?",
       "ch07:measure_bytes_ratio", difficulty=2),
    _e("E7.3", 7, "4. The paged-attention kernel", "the running maximum",
       "The kernel starts m_i at -1e30, not -inf, and works in base 2. Why each? What goes wrong without the "
       "running maximum?", difficulty=2, requires=('E7.1',)),
    # 08 -- prefix caching
    _b("E8.1", 8, "3. Admission: look up, share, compute the rest", "prefix lookup and share",
       "Write Scheduler._prefix_hits (which of a request's block hashes to look up: full blocks only, never its "
       "last token), BlockPool.lookup (the cached blocks of the longest matching prefix: a miss ends it; nothing "
       "taken) and BlockPool.share (start a table with them: a reference each, a free cached block taken out of "
       "the free list, their tokens counted as held; an owner that has a table already, or a block that is not "
       "cached, raises BlockPoolError and changes nothing).", "ch08:check_prefix_sharing", 35,
       difficulty=3, requires=('E3.1',)),
    _p("E8.2", 8, "3. Admission: look up, share, compute the rest", "tokens served from the cache",
       "Six requests share a 200-token system prompt and add 30 tokens of their own (16-token blocks), admitted "
       "one per step. How many prompt tokens does the cache serve in all?", "ch08:measure_cached_tokens",
       difficulty=2, requires=('E8.1',)),
    _e("E8.3", 8, "6. Eviction: least recently used first", "what to evict",
       "Why is a prompt's last block evicted before its first? Give a workload where LRU is the wrong choice.",
       difficulty=2, requires=('E8.1',)),
    _b("E8.4", 8, "6. Eviction: least recently used first", "eviction: reuse the block freed longest ago",
       "Write BlockPool._take_free: take the block at the head of free_queue (the least recently freed) out of it "
       "and give it one reference. If that block is still cached (block_hash[block] is not None) it is evicted: "
       "its hash leaves hash_to_block, its block_hash becomes None, and num_evictions counts one more. A block "
       "that is not cached is no eviction.", "ch08:check_eviction", 15, difficulty=2, requires=('E8.1',)),
    # 09 -- policies and SLAs
    _b("E9.1", 9, "2. Priority", "a new policy: shortest job first",
       "Write ShortestJobFirstPolicy.order and .rank: the least work (prompt + max_tokens) first, ties by "
       "arrival, a preempted request ahead of its equals, and a running rank that never changes while the "
       "request runs (so preemption takes the longest job). Graded by goodput on a fixed simulated workload: it "
       "must beat first come, first served.", "ch09:check_sjf", 30, difficulty=2, requires=('E4.1',)),
    _e("E9.2", 9, "5. Queue timeouts", "what SJF does to long jobs",
       "Under steady load, what happens to a 1,000-token job behind a stream of short ones with SJF? Propose a "
       "fix from this chapter's knobs and say what it costs.", difficulty=2, requires=('E9.1',)),
    _b("E9.3", 9, "3. Fairness between tenants", "fair queuing's virtual time",
       "Write FairPolicy.level (a tenant's tokens served divided by its weight), _next_tenant (of the tenants "
       "with a queue, the lowest level; ties: the one whose first waiting request arrived first), pop (take the "
       "head of that tenant's queue, and move vtime up to its level -- vtime never decreases) and _queue (the "
       "tenant's queue; a tenant without one gets a new, empty one, and re-enters at no less than the virtual "
       "time: served[tenant] is raised to at least vtime * weight, never lowered).", "ch09:check_fair", 25,
       difficulty=2, requires=('E4.1',)),
    _b("E9.4", 9, "8. The capstone: a policy of your own", "capstone: a scheduling policy of your own design",
       "Design CapstonePolicy.order and .rank (minfer/scheduler/policies.py): the waiting queue's sort key and the "
       "running list's (its last request is the preemption victim; a rank never changes while its request runs). "
       "Scored on the simulator (minfer.capstone) by goodput -- requests per second within TTFT 500 ms "
       "and TPOT 25 ms -- on a workload family of chats, long documents and long generations; develop on the "
       "sample (score('capstone')). The grade runs other members of the family: at least 3x first come, first "
       "served's goodput on each passes, and the score ranks the rest.", "capstone:check_capstone", 120,
       difficulty=3, requires=('E9.1',)),
    # 10 -- benchmarking and simulation
    _b("E10.1", 10, "1. What a serving benchmark measures", "goodput: did a request meet its SLO?",
       "Write SLO.met_by: a request counts toward goodput only if it was served (finished by 'stop' or 'length') "
       "and met every target given (a target of None is none; exactly at the target counts; a one-token answer "
       "has no TPOT to miss).",
       "ch10:check_slo", 15, difficulty=1),
    _p("E10.2", 10, "2. A roofline per step", "a decode step on an H100",
       "How many milliseconds does one decode step of Llama-3-8B (bfloat16) at batch 1, with 1,024 tokens of "
       "context, take on a simulated H100-SXM?", "ch10:measure_h100_decode", difficulty=2),
    _e("E10.3", 10, "1. What a serving benchmark measures", "goodput versus throughput",
       "A change doubles throughput and halves goodput. How? Which would you report to a customer?",
       difficulty=2, requires=('E10.1',)),
    _b("E10.4", 10, "2. A roofline per step", "the attention terms of the cost model",
       "Write the two attention terms of roofline_terms, each a (FLOPs, bytes) pair. A (query, key) pair costs "
       "per_pair = 4 * num_layers * num_heads * head_dim FLOPs (q.k and p.v, 2 FLOPs per multiply-add, every "
       "query head, every layer). Prefill: per_pair * prefill_pairs FLOPs; it reads its chunks' context K/V and "
       "writes the new tokens' K/V: kv * (prefill_context + num_prefill_tokens) bytes. Decode: per_pair * "
       "decode_context FLOPs and kv * (decode_context + num_decode_tokens) bytes (kv: bytes of K/V per token, "
       "already computed). The shape's fields may be numbers or numpy arrays.", "ch10:check_attention_terms", 15,
       difficulty=2),
    # 11 -- the scheduler visualizer
    _b("E11.1", 11, "4. The same scheduler on a simulated H100", "read a trace: find the preemptions",
       "Write minfer.trace.preemptions: one Preemption per Preempted decision in the trace (StepTrace.decisions), "
       "in order: the victim (request), the step, by, tokens, swapped (it copied blocks to host memory: "
       "swapped_blocks > 0) and resumed: the step of the victim's next admission (StepTrace.admitted) after that "
       "preemption, or None if the trace ends first. A step preempts before it admits, so a victim re-admitted in "
       "the same step resumed there; a request preempted twice makes two entries.",
       "ch11:check_preemptions", 20, difficulty=1, requires=('E6.1',)),
    _p("E11.2", 11, "4. The same scheduler on a simulated H100", "the next step",
       "The chapter prints four requests decoding, step by step, up to step 19, with the blocks each holds and the "
       "free blocks. How many tokens will step 20 compute?", "ch11:measure_next_tokens",
       difficulty=1, requires=('E4.1',)),
    _e("E11.3", 11, "4. The same scheduler on a simulated H100", "explain a preemption",
       "Pick one preemption of the 40-block run: why was that request the victim, what made the pool run dry in "
       "that step, and what did the preemption cost in tokens and in steps?", difficulty=2, requires=('E11.1',)),
    # 12 -- serving over HTTP
    _b("E12.1", 12, "1. Choosing a token: temperature, top-k, top-p, seeds", "temperature, top-k and top-p",
       "Write filter_logits for a batch, each row with its own temperature, top_k and top_p: divide the row's "
       "logits by its temperature, then set to -inf every token outside its top_k highest, and every token outside "
       "its top-p set -- the highest-probability tokens, in order, while the probability of those before them "
       "(softmax over what top-k kept) is below top_p: the favourite always stays. top_k = vocab and top_p = 1 "
       "filter nothing. Return the logits in the vocabulary's order.", "ch12:check_filter_logits", 25, difficulty=2),
    _b("E12.2", 12, "2. From tokens to text, one step at a time", "the incremental detokenizer",
       "Write Detokenizer.update: decode the request's whole output; if it has stop strings and ending is None or "
       "\"length\", look for each (in order) in the new text only (from len(streamed) - len(stop) on): the first "
       "found cuts the text before it, ending becomes \"stop\" and the update names it. Unless the request ends, "
       "hold back the last max(len(stop)) - 1 characters (with stop strings) and then any trailing \"\\ufffd\". "
       "Send what the settled text adds to what was streamed (nothing if it no longer starts with it), remember "
       "it -- or the whole text when the request ends -- and return TextUpdate(new_text, stop).",
       "ch12:check_detokenizer", 30, difficulty=3),
    _b("E12.3", 12, "4. Talking to it", "a streamed event",
       "Write protocol.chunk and protocol.sse. chunk: {id, object, created, model, choices: [choice]}; the choice "
       "has index 0, logprobs None, finish_reason (protocol.finish_reason(out)) and, only once finished, "
       "stop_reason; chat: object \"chat.completion.chunk\" and delta {content: out.new_text}, with role "
       "\"assistant\" first in the first chunk only; completion: object \"text_completion\" and text. With "
       "include_usage every chunk has \"usage\": None. sse: b\"data: \" + the JSON (or a string as it is) + "
       "two newlines.", "ch12:check_stream_chunk", 20, difficulty=1),
    _p("E12.4", 12, "1. Choosing a token: temperature, top-k, top-p, seeds", "what top-p keeps",
       "Eight tokens have logits 3, 2, 1, 0, -1, -2, -3, -4. With temperature 0.5 and top_p 0.9, how many of them "
       "can be sampled?", "ch12:measure_top_p_kept", difficulty=1, requires=('E12.1',)),
    # 13 -- speculative decoding
    _b("E13.1", 13, "2. Guess, verify, accept", "verification: greedy acceptance and rejection sampling",
       "Write accept_greedy and accept_sampled. Greedy: keep each guess that equals the target's argmax at its "
       "position (target[i] for guess i), stop at the first that does not and append the target's token there; "
       "all kept: append target[k], the bonus token. Sampled: keep guess i with probability probs[i, guess] (one "
       "torch.rand(generator=...) draw, kept if below it); at the first rejection append a draw from row i with "
       "the guess removed (draw(weights, generator)) and stop; all kept: append a draw from the last row.",
       "ch13:check_verification", 25, difficulty=2),
    _p("E13.2", 13, "4. Measured on this machine", "tokens a step on the copy task",
       "One request copies a paragraph from its prompt, greedily, with ngram speculation (k = 5 guesses a step). "
       "On average, how many tokens does each of its speculating steps produce (SpecDecodeStats' "
       "mean_acceptance_length: the kept guesses plus the one token every step gives)?",
       "ch13:measure_copy_acceptance", difficulty=1, requires=('E13.1',)),
    _e("E13.3", 13, "5. Where it stops paying", "why speculation stops paying at large batch",
       "On this CPU ngram speculation made one request much faster, 16 requests far less. On a simulated H100 the "
       "gain shrinks with the batch too. Why? Use the roofline of a decode step, what a rejected guess costs, and "
       "where the lookahead slots come from.", difficulty=2, requires=('E13.2',)),
    # 14 -- bytes per weight
    _b("E14.1", 14, "2. The formats", "the int8 group quantizer",
       "Write quantize_int8: cut w ([in, out]) into groups of `group` consecutive inputs of each output column "
       "(grouped(w, group) gives [groups, group, out]); each group's scale is its largest absolute value over 127, "
       "rounded to float16, and each q the nearest integer to w / scale computed with that rounded scale, in "
       "-127..127 (an all-zero group: scale 0 and q 0). Return Int8Weight(q as int8 [in, out], scales [groups, out] "
       "float16, group).", "ch14:check_int8_quantizer", 20, difficulty=2),
    _p("E14.2", 14, "4. Quality and speed, measured here", "int8's decode speed-up",
       "From the bytes a decode step reads in each format: how many times faster is a batch-1 decode step with "
       "weights=\"int8\" than with the float32 weights, on this machine?", "ch14:measure_int8_speedup",
       difficulty=2, requires=('E14.1',)),
    _e("E14.3", 14, "4. Quality and speed, measured here", "the bound missed, and prefill unmoved",
       "int8 reads about 3.8x fewer bytes than float32. Why is its batch-1 decode less than 3.8x faster, and why "
       "does a long prefill gain little or nothing?", difficulty=2, requires=('E14.2',)),
    # 15 -- beyond one machine: disaggregated prefill and decode
    _b("E15.1", 15, "2. The handoff", "landing a prefilled request on a decode instance",
       "Write disagg.land: add the request to the decode instance (arriving at `at`, its own prompt, priority and "
       "tenant, max_tokens as given), append the first token the prefill instance sampled, put its prompt's K/V in "
       "the landing pool (engine.host_pool.allocate) and count them computed, so the scheduler admits it as a "
       "swapped-in request and never prefills it again; it keeps the prefill's arrival and first-scheduled times, "
       "and its first token is seen at `at` (first_token_time and token_times).", "ch15:check_land", 20,
       difficulty=2, requires=('E6.4',)),
    _p("E15.2", 15, "2. The handoff", "a long prompt's handoff",
       "Llama-3-70B in bfloat16 (80 layers, 8 KV heads of 128): how many milliseconds does the K/V of a 4,096-token "
       "prompt take to cross the RDMA-400G link (50 GB/s, 5 us)?", "ch15:measure_handoff_ms", difficulty=1),
    _e("E15.3", 15, "3. Goodput: when splitting pays", "why one prefill and one decode GPU lose on short prompts",
       "On short prompts (64 tokens in, 256 out), 1 prefill + 1 decode GPU meet the SLOs far less often than 2 "
       "colocated GPUs, even over the fast link. Why? Say which GPU is the bottleneck and why, and what you would "
       "change.", difficulty=2, requires=('E15.1',)),
    _e("E15.4", 15, "4. A second tier for the KV cache", "why a small host tier makes TTFT worse",
       "On the simulated H100, a 250-block host tier serves about 1% of the prompt tokens and makes mean TTFT "
       "slightly worse than no tier, while 1,000 blocks cut it. Why does the small tier cost anything, and what "
       "decides the size at which a tier starts to pay?", difficulty=2, requires=('E8.4',)),
)

BY_ID = {e.id: e for e in EXERCISES}


def get(exercise_id: str) -> Exercise:
    """The exercise named ``exercise_id`` ("E3.1"); a clear error naming the known ones otherwise."""
    ex = BY_ID.get(str(exercise_id).strip().upper())
    if ex is None:
        raise ValueError(f"no exercise {exercise_id!r}; known: {', '.join(BY_ID)}")
    return ex


def stub_message(ex: Exercise, unit: str) -> str:
    """What a stubbed region raises: the exercise, the function, and where the chapter explains it."""
    return f"{ex.id}: write {unit} ({ex.title}), see {ex.notebook_hint}"
