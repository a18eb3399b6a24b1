"""Chapter 06: the preemption victim (E6.1) and how many preemptions a burst into a small pool causes (E6.2)."""

from __future__ import annotations

from minfer.exercises.checks.common import cpu_sim_engine, greedy, sim_engine, tiny_engine
from minfer.exercises.harness import Measurement, Tester
from minfer.plan import SchedulerOutput
from minfer.request import SamplingParams

QUESTIONS = ["Why is the sea salty?", "Name two moons of Jupiter.", "What is a prime number?",
             "How do bees make honey?", "What does a compiler do?", "Why do leaves change colour?",
             "What is the speed of sound?", "Who painted the Mona Lisa?"]  # chapter 06's burst


def chapter_prompts() -> list[list[int]]:
    """Chapter 06's eight chat prompts, through SmolLM2's tokenizer and chat template (no weights needed)."""
    from transformers import AutoTokenizer

    from minfer.model.loader import resolve_checkpoint
    from minfer.model.tokenizer import HFTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(resolve_checkpoint("smollm2-135m")))
    return [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


def measure_preemptions() -> Measurement:
    prompts = chapter_prompts()
    engine = sim_engine(model="smollm2-135m", hardware="cpu-2core", num_blocks=16, block_size=8)
    for i, p in enumerate(prompts):  # the scheduler's decisions depend on lengths only: the simulator decides alike
        engine.add_request(f"q{i}", p, SamplingParams(max_tokens=48, ignore_eos=True))
    engine.run()
    n = sum(len(t.preempted) for t in engine.trace)
    first = next(t for t in engine.trace if t.preempted)
    longest = max(map(len, prompts))
    first_blocks, last_blocks = -(-longest // 8), -(-(longest + 47) // 8)
    return Measurement(
        n, "preemptions", rel_tol=0.5,
        explain=f"{n} preemptions, the first in step {first.step}. Admission is optimistic: a prompt of up to "
                f"{longest} tokens needs only {first_blocks} blocks of 8, so requests are admitted while their prompts "
                f"fit. But every answer grows: at the end a request holds {longest + 47} tokens, {last_blocks} blocks, "
                "and the 16-block pool carries one such request and part of another. So requests take turns: "
                "whenever a running request needs a block and none is free, the most recently admitted one is "
                "preempted, and later recomputes its prompt and its answer so far. A guess of one or two preemptions "
                "forgets that every admitted answer keeps growing until it finishes.")


def victims_by_rank(engine, priority: dict[str, int] | None = None) -> None:
    """Every preemption took the lowest-ranked running request: the lowest priority (the largest value),
    among those the most recently admitted. Checked against the order the trace shows."""
    priority = priority or {}
    admitted: dict[str, int] = {}
    running: set[str] = set()
    seq = 0
    for tr in engine.trace:
        for victim in tr.preempted:
            if victim not in running:  # admitted and preempted in one step: not in the running pass
                continue
            worst = max(running, key=lambda r: (priority.get(r, 0), admitted[r]))
            assert victim == worst, (
                f"step {tr.step} preempted {victim} (admitted #{admitted[victim]}, priority {priority.get(victim, 0)});"
                f" the lowest-ranked running request was {worst} (admitted #{admitted[worst]}, priority "
                f"{priority.get(worst, 0)})")
            running.discard(victim)
        for rid in tr.admitted:
            seq += 1
            admitted[rid] = seq
            running.add(rid)
        running -= set(tr.finished) | set(tr.preempted)


def check_victim(t: Tester) -> None:
    with t.case("first come, first served: each victim is the most recently admitted running request",
                hint="the running list is kept in rank order (policy.rank): the victim is its *last* request, not "
                     "its first (the oldest has the most work to lose)"):
        engine = cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=4)
        for i, (p, n) in enumerate([(9, 12), (6, 14), (7, 10), (5, 16)]):
            engine.add_request(f"r{i}", [5 + i] * p, greedy(n))
        t.run(engine)
        assert any(tr.preempted for tr in engine.trace), "this case is meant to preempt"
        victims_by_rank(engine)

    with t.case("priorities: the lowest priority goes first, whoever needs the block",
                hint="the rank of a running request comes from the policy; take the last in rank order"):
        prio = {"a": 0, "b": 2, "c": 1, "d": 2}
        engine = cpu_sim_engine(block_size=4, num_blocks=12, max_num_seqs=4, policy="priority")
        for i, rid in enumerate(prio):
            engine.add_request(rid, [7 + i] * 6, greedy(14 - i), priority=prio[rid])
        t.run(engine)
        assert any(tr.preempted for tr in engine.trace), "this case is meant to preempt"
        victims_by_rank(engine, prio)

    with t.case("the request that needs a block may be the victim itself: then it alone is preempted",
                hint="when the lowest-ranked request is the one asking, preempt it and stop: nobody else loses "
                     "blocks for it"):
        engine = cpu_sim_engine(block_size=4, num_blocks=8, max_num_seqs=2)
        engine.add_request("old", [1] * 12, greedy(8))  # 3 blocks, grows to 5
        engine.add_request("new", [2] * 12, greedy(8))  # admitted second: the lowest rank
        t.run(engine)
        first = next(tr for tr in engine.trace if tr.preempted)
        assert first.preempted == ["new"], f"step {first.step} preempted {first.preempted}: only 'new' should go"

    with t.case("preempt until it fits: an urgent prompt chunk that needs four blocks takes two victims",
                hint="after each preemption try again; stop as soon as the request fits (or is itself preempted)"):
        engine = cpu_sim_engine(block_size=2, num_blocks=12, max_num_seqs=5, chunked_prefill_size=8, policy="priority")
        prio = {f"s{i}": 1 for i in range(3)} | {"big": 0}
        for i in range(3):
            engine.add_request(f"s{i}", [3 + i] * 2, greedy(10), priority=1)
        t.run(engine, before_step=lambda step: step == 3 and engine.add_request("big", [9] * 16, greedy(2), priority=0))
        victims_by_rank(engine, prio)
        step = next((tr for tr in engine.trace if len(tr.preempted) > 1), None)
        assert step is not None and step.preempted == ["s2", "s1"], (
            f"big's chunk needs 4 blocks: s2, then s1 (the lowest-ranked) must be preempted in one step; the steps "
            f"with preemptions were {[(tr.step, tr.preempted) for tr in engine.trace if tr.preempted]}")

    with t.case("recompute gives the very same tokens as a roomy pool (tiny model)",
                hint="a preempted request restarts from position 0 with its tokens so far; nothing is lost"):
        outs = {}
        for blocks in (10, 100):
            engine = tiny_engine(block_size=4, num_blocks=blocks, max_num_seqs=4, chunked_prefill_size=8)
            for i, (p, n) in enumerate([(9, 12), (14, 9), (6, 16), (11, 10)]):
                engine.add_request(f"r{i}", [4 + 3 * i + j % 5 for j in range(p)], greedy(n))
            outs[blocks] = {k: o.outputs[0].token_ids for k, o in t.run(engine).items()}
        assert outs[10] == outs[100], "preemption changed the generated tokens"


# ---- E6.4: swap preemption ----------------------------------------------------------------------------------
def swap_storm(blocks: int = 12, swap_blocks: int | None = None, mode: str = "swap"):
    """Six requests burst into a small pool on a simulated H100: victims swapped out and back in, again and again."""
    engine = sim_engine(block_size=4, num_blocks=blocks, max_num_seqs=6, chunked_prefill_size=8,
                            preemption_mode=mode, num_swap_blocks=swap_blocks)
    for i, (p, n) in enumerate([(9, 14), (6, 18), (11, 10), (5, 16), (7, 12), (10, 9)]):
        engine.add_request(f"r{i}", [3 + i] * p, greedy(n))
    return engine


def watch_swaps(engine) -> list[tuple[dict, dict, SchedulerOutput, dict]]:
    """Wrap the engine's scheduler: record, for every step, the device and host tables before it was planned, the
    plan itself (``SchedulerOutput``) and the device tables after, so that a case can compare the copies the plan
    lists with them."""
    sched, seen = engine.scheduler, []
    plan = sched.schedule

    def schedule(now: float):
        device = {k: list(v) for k, v in sched.pool.tables.items()}
        host = {k: list(v) for k, v in sched.host_pool.tables.items()}
        out = plan(now)
        seen.append((device, host, out, {k: list(v) for k, v in sched.pool.tables.items()}))
        return out

    sched.schedule = schedule
    return seen


def check_swap(t: Tester) -> None:
    with t.case("swap out: a victim's blocks are copied to host blocks, (device, host) pairs in table order, and it "
                "keeps its computed tokens",
                hint="pair self.pool.table(rid) with host.allocate(rid, n) before pool.free(rid) gives the device "
                     "blocks back; do not set num_computed_tokens to 0 for a swapped victim"):
        engine = swap_storm()
        seen = watch_swaps(engine)
        t.run(engine)
        swapped = 0
        for device, _, out, _ in seen:
            for req in out.preempted:
                rid = req.request_id
                assert rid in out.swap_out, f"{rid} was preempted with room in the host pool, but not swapped out"
                pairs = out.swap_out[rid]
                assert [d for d, _ in pairs] == device[rid], (
                    f"{rid}'s copies start from device blocks {[d for d, _ in pairs]}; its table was {device[rid]}")
                n = next(d.tokens for d in out.decisions if d.kind == "preempted" and d.request == rid)
                assert len(pairs) == -(-n // 4), f"{rid} held {n} tokens (blocks of 4) but {len(pairs)} are copied"
                swapped += 1
        assert swapped, "this case is meant to preempt"

    with t.case("swap in: a returning victim takes device blocks, gets its host copies back as (host, device) pairs "
                "in table order, and resumes where it stopped",
                hint="allocate total_blocks, append_slots(rid, req.num_computed_tokens), then pair host_pool.free(rid) "
                     "(its host blocks, in order) with the new table"):
        engine = swap_storm()
        seen = watch_swaps(engine)
        t.run(engine)
        resumed = 0
        for _, host, out, after in seen:
            for rid, pairs in out.swap_in.items():
                assert [h for h, _ in pairs] == host[rid], (
                    f"{rid} copies back from host blocks {[h for h, _ in pairs]}; it held {host[rid]}")
                chunk = next(c for c in out.chunks if c.request.request_id == rid)
                assert chunk.start > 0, f"{rid} was swapped in but computes from token 0 again"
                assert [d for _, d in pairs] == after[rid][: len(pairs)], (
                    f"{rid}'s copies go to device blocks {[d for _, d in pairs]}; its table starts "
                    f"{after[rid][: len(pairs)]}")
                resumed += 1
        assert resumed, "this case is meant to swap victims back in"
        assert engine.host_pool.num_used_blocks == 0, "host blocks still held after every request finished"

    with t.case("a full host pool: the victim falls back to recompute",
                hint="swap only if host.can_hold(n); otherwise set req.num_computed_tokens = 0"):
        engine = swap_storm(swap_blocks=3)
        seen = watch_swaps(engine)
        t.run(engine)
        fell_back = [r.request_id for _, _, out, _ in seen for r in out.preempted if r.request_id not in out.swap_out]
        assert fell_back, "with 3 host blocks some victims cannot be swapped out"
        assert max(tr.num_swapped_blocks for tr in engine.trace) <= 3

    with t.case("recompute mode never swaps",
                hint="swap only when self.config.preemption_mode == 'swap'"):
        engine = swap_storm(mode="recompute")
        t.run(engine)
        assert any(tr.preempted for tr in engine.trace), "this case is meant to preempt"
        assert not any(tr.swapped_out or tr.swapped_in for tr in engine.trace), "recompute mode copied blocks"

    with t.case("swapped K/V give the very same tokens as a roomy pool (tiny model)",
                hint="a swapped-in request must find its K/V where its new table says: the pairs' order matters"):
        outs = {}
        for blocks, mode in ((10, "swap"), (100, "recompute")):
            engine = tiny_engine(block_size=4, num_blocks=blocks, max_num_seqs=4, chunked_prefill_size=8,
                                 preemption_mode=mode)
            for i, (p, n) in enumerate([(9, 12), (14, 9), (6, 16), (11, 10)]):
                engine.add_request(f"r{i}", [4 + 3 * i + j % 5 for j in range(p)], greedy(n))
            outs[mode] = {k: o.outputs[0].token_ids for k, o in t.run(engine).items()}
            if mode == "swap":
                assert any(tr.swapped_in for tr in engine.trace), "this case is meant to swap"
        assert outs["swap"] == outs["recompute"], "swapping changed the generated tokens"
