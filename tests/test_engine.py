"""The engine on the tiny random model: API, streaming, stop conditions, bad input, and the central
property of continuous batching -- a request's tokens do not depend on who else shares its steps."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import alone, run_checked, tiny_engine
from minfer import LLM, EngineConfig, LLMEngine, SamplingParams
from minfer.units import ceil_div

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_generate_accepts_strings_token_ids_and_per_prompt_params(tiny):
    llm = LLM.__new__(LLM)
    llm.engine, llm._ids = tiny_engine(tiny, num_blocks=64), iter(range(10**6))
    outs = llm.generate(["hello", [5, 6, 7]], [GREEDY, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)],
                        use_tqdm=False)
    assert [o.prompt for o in outs] == ["hello", None]
    assert [len(o.outputs[0].token_ids) for o in outs] == [12, 3]
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outs)
    assert outs[0].outputs[0].text == tiny[1].decode(outs[0].outputs[0].token_ids)
    chat = llm.chat([{"role": "user", "content": "hi"}], GREEDY)
    assert chat[0].prompt_token_ids[0] == 1  # rendered through the chat template


def test_step_streams_one_token_per_request_per_step(tiny):
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("a", [5] * 10, GREEDY)
    seen: list[int] = []
    text = ""
    while e.has_unfinished_requests():
        for out in e.step():
            assert len(out.new_token_ids) == 1
            seen += out.new_token_ids
            text += out.new_text
            assert out.outputs[0].token_ids == seen  # cumulative = sum of the increments
        e.scheduler.check_invariants()
    assert len(seen) == 12 and text == tiny[1].decode(seen)


def test_without_streaming_a_step_reports_only_the_requests_that_end(tiny):
    """``stream_outputs=False`` (what ``run()`` and the cluster simulator use) changes what a step returns, never
    what is computed: each step reports exactly the requests that ended in it, with the same tokens and text."""
    def steps(stream: bool) -> tuple[list[list], LLMEngine]:  # (the outputs of each step, the engine)
        e = tiny_engine(tiny, num_blocks=64, max_num_seqs=2)
        e.stream_outputs = stream
        for i, n in enumerate([3, 9, 5]):
            e.add_request(f"r{i}", [5 + i] * 7, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        e.add_request("s", [9] * 7, SamplingParams(max_tokens=40, temperature=0, stop=[tiny[1].decode(alone((9,) * 7,
                                                                                                      3)[1:3])]))
        out = []
        while e.has_unfinished_requests():
            out.append(e.step())
        return out, e

    (streamed, a), (quiet, b) = steps(True), steps(False)
    assert any(not o.finished for step in streamed for o in step)
    assert all(o.finished for step in quiet for o in step)
    ended = [[(o.request_id, o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason)
              for o in step if o.finished] for step in streamed]
    assert ended == [[(o.request_id, o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason)
                      for o in step] for step in quiet]
    assert [r.request_id for r in a.finished] == [r.request_id for r in b.finished]
    assert any(r.finish_reason == "stop" for r in b.finished), "a stop string ended one (its text is checked above)"


def test_requests_join_and_leave_between_steps(tiny):
    """Iteration-level scheduling: a request that arrives while others decode runs in the very next step."""
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("a", [5] * 8, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    for _ in range(3):
        e.step()
    e.add_request("b", [6] * 4, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    e.step()
    assert "b" in e.trace[-1].prefill_tokens and "a" in e.trace[-1].decode_tokens
    e.step()
    assert e.trace[-1].finished == ["b"]  # b leaves at once; a keeps decoding
    run_checked(e)


@pytest.mark.parametrize("kw", [
    dict(chunked_prefill_size=7), dict(max_num_seqs=2), dict(num_blocks=12, block_size=4),
    dict(enable_chunked_prefill=False), dict(admission="reserve", num_blocks=40, block_size=4),
    dict(max_prefill_chunks_per_step=3, chunked_prefill_size=20),
])
def test_batched_tokens_equal_alone(tiny, kw):
    prompts = [list(range(3 + i, 3 + i + n)) for i, n in enumerate([30, 5, 17, 1, 36, 9])]
    e = tiny_engine(tiny, **kw)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, GREEDY)
    outs = run_checked(e)
    for i, p in enumerate(prompts):
        assert tuple(outs[str(i)].outputs[0].token_ids) == alone(tuple(p), GREEDY.max_tokens), (kw, i)


def test_budgets_are_respected(tiny):
    e = tiny_engine(tiny, chunked_prefill_size=16, max_prefill_chunks_per_step=2, max_num_seqs=3, num_blocks=64)
    for i in range(6):
        e.add_request(str(i), [7] * 40, GREEDY)
    run_checked(e)
    for t in e.trace:
        assert t.num_prefill_tokens <= 16 and len(t.prefill_tokens) <= 2 and t.batch_size <= 3
    assert any(len(t.prefill_tokens) == 2 for t in e.trace)


def test_unchunked_prefill_ingests_whole_prompts(tiny):
    e = tiny_engine(tiny, enable_chunked_prefill=False, num_blocks=64)
    e.add_request("long", [9] * 300, GREEDY)
    e.step()
    assert e.trace[0].prefill_tokens == {"long": 300}


def test_preemption_recomputes_and_resumes_exactly(tiny):
    """A pool too small for everyone: the most recently admitted request is preempted, recomputed later,
    and still ends with exactly the tokens it would have produced alone."""
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    e = tiny_engine(tiny, num_blocks=10, block_size=4)
    prompts = [[3 + i] * 9 for i in range(4)]
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, params)
    outs = run_checked(e)
    preempted = [r for t in e.trace for r in t.preempted]
    assert len(preempted) >= 3
    first = next(t for t in e.trace if t.preempted)
    # FCFS admits in id order, so the victim (the most recently admitted) has a larger id than the survivors
    assert all(int(first.preempted[0]) > int(r) for r in first.blocks)
    for i, p in enumerate(prompts):
        assert tuple(outs[str(i)].outputs[0].token_ids) == alone(tuple(p), 30)
        assert outs[str(i)].metrics.num_preemptions == preempted.count(str(i))


def test_reserve_admission_never_preempts(tiny):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    e = tiny_engine(tiny, num_blocks=10, block_size=4, admission="reserve")
    for i in range(4):
        e.add_request(str(i), [3 + i] * 9, params)
    run_checked(e)
    assert not any(t.preempted for t in e.trace)
    assert max(t.num_running for t in e.trace) == 1  # 10 blocks hold one request's 38 slots at a time


def test_reserve_admission_caps_at_max_model_len(tiny):
    """max_tokens far beyond the model's limit: the request can only ever hold max_model_len - 1 slots, so
    reserve admission must reserve that many, not prompt + max_tokens (which would never fit, and wait forever)."""
    e = tiny_engine(tiny, num_blocks=8, block_size=16, max_model_len=128, admission="reserve")
    e.add_request("a", [5] * 10, SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True))
    out = run_checked(e, max_steps=500)["a"].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 128 - 10


def streamed(e: LLMEngine) -> tuple[dict[str, str], dict]:
    """Run to the end, concatenating each request's streamed ``new_text``; also the final outputs."""
    pieces: dict[str, str] = {}
    final = {}
    while e.has_unfinished_requests():
        for out in e.step():
            pieces[out.request_id] = pieces.get(out.request_id, "") + out.new_text
            if out.finished:
                final[out.request_id] = out
        e.scheduler.check_invariants()
    return pieces, final


def streamed_script(e: LLMEngine, rid: str, script: list[int]) -> tuple[str, object]:
    """Run ``e`` to the end with request ``rid``'s sampled tokens replaced by ``script``, one per step (the
    model still runs; only what it sampled for ``rid`` is overridden). Returns its streamed text, final output."""
    tokens = iter(script)
    real = e.executor.execute

    def scripted(out):
        result = real(out)
        if rid in result.sampled:
            result.sampled[rid] = next(tokens)
        return result

    e.executor.execute = scripted
    pieces, final = streamed(e)
    return pieces[rid], final[rid]


def test_streamed_text_adds_up_to_the_final_text(tiny):
    """The byte tokenizer splits multi-byte characters across tokens, and stop strings cut text after the fact:
    neither may make the stream repeat, show half a character, or show text the final output does not have."""
    model, tok = tiny
    script = tok.encode("héllo wörld ✓ done")  # one token per UTF-8 byte
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("r", [5], SamplingParams(max_tokens=len(script), stop=["✓"]))
    stream, final = streamed_script(e, "r", script)
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "✓"
    assert stream == final.outputs[0].text == "héllo wörld "  # no "\ufffd", no repeats
    # a stop string completed by the very token that reaches max_tokens still cuts the text
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("last", [5], SamplingParams(max_tokens=3, stop=["ab"]))
    stream, final = streamed_script(e, "last", tok.encode("xab"))
    assert stream == final.outputs[0].text == "x" and final.outputs[0].finish_reason == "stop"
    # and on the model's own tokens (arbitrary bytes for the tiny model), cut at a piece of them
    text = tok.decode(list(alone((5,) * 6, 24)))
    piece = text[5:8]
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("free", [5] * 6, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    e.add_request("cut", [5] * 6, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[piece]))
    pieces, final = streamed(e)
    assert pieces["free"] == final["free"].outputs[0].text == text
    assert pieces["cut"] == final["cut"].outputs[0].text == text[: text.find(piece)]


def test_generate_with_a_bad_prompt_leaves_nothing_behind(tiny):
    llm = LLM.__new__(LLM)
    llm.engine, llm._ids = tiny_engine(tiny, num_blocks=64), iter(range(10**6))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[5, 6], [7], []], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests() and not llm.engine.detokenizer.streamed and not llm.engine.finished
    assert not llm.engine.scheduler.ended and not llm.engine.scheduler.joined
    assert llm.generate([[5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == list(alone((5, 6), 12))


def test_stop_conditions(tiny):
    model, tok = tiny
    free_run = alone(tuple([5] * 6), 12)
    e = tiny_engine(tiny, num_blocks=64)
    e.add_request("tok", [5] * 6, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[free_run[3]]))
    text = tok.decode(list(free_run))
    e.add_request("eos", [5] * 6, SamplingParams(max_tokens=12, temperature=0))
    outs = run_checked(e)
    stop_at = free_run.index(free_run[3])
    assert outs["tok"].outputs[0].token_ids == list(free_run[: stop_at + 1])
    assert outs["tok"].outputs[0].finish_reason == "stop" and outs["tok"].outputs[0].stop_reason == free_run[3]
    if 2 in free_run:  # the tiny model may or may not emit EOS (id 2) in 12 tokens
        assert outs["eos"].outputs[0].token_ids[-1] == 2 and outs["eos"].outputs[0].finish_reason == "stop"
    else:
        assert outs["eos"].outputs[0].finish_reason == "length"
    # a stop string: the text is cut before it, and the request ends there
    piece = text[2:4]
    if piece:
        e.add_request("str", [5] * 6, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[piece]))
        out = run_checked(e)["str"]
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == piece
        assert out.outputs[0].text == text[: text.find(piece)]


def test_seeded_sampling_is_independent_of_the_batch(tiny):
    params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=50, seed=1234)
    e1 = tiny_engine(tiny, num_blocks=64)
    e1.add_request("x", [11] * 7, params)
    solo = run_checked(e1)["x"].outputs[0].token_ids
    e2 = tiny_engine(tiny, num_blocks=64)
    for i in range(5):
        e2.add_request(f"other{i}", [20 + i] * (3 + i), SamplingParams(max_tokens=8, temperature=1.0))
    e2.add_request("x", [11] * 7, params)
    assert run_checked(e2)["x"].outputs[0].token_ids == solo


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", 0), ("top_k", -2),
])
def test_bad_sampling_params_are_refused(tiny, field, value):
    with pytest.raises(ValueError, match=field):  # when built ...
        SamplingParams(**{field: value})
    params = SamplingParams()
    setattr(params, field, value)  # ... and when changed afterwards: add_request checks again
    e = tiny_engine(tiny, num_blocks=8)
    e.add_request("ok", [5, 6], GREEDY)
    with pytest.raises(ValueError, match=field):
        e.add_request("bad", [5, 6], params)
    assert list(e.scheduler.requests) == ["ok"]
    assert run_checked(e)["ok"].outputs[0].token_ids == list(alone((5, 6), 12))


def test_bad_requests_are_refused_without_disturbing_others(tiny):
    e = tiny_engine(tiny, num_blocks=8, block_size=4, max_model_len=64)
    e.add_request("ok", [5, 6], GREEDY)
    e.step()
    with pytest.raises(ValueError, match="empty"):
        e.add_request("empty", [], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        e.add_request("long", [5] * 64, GREEDY)
    with pytest.raises(ValueError, match="num_blocks"):
        e.add_request("huge", [5] * 40, GREEDY)  # 10 blocks of 4 > a pool of 8
    with pytest.raises(ValueError, match="already in use"):
        e.add_request("ok", [7], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        e.add_request("vocab", [5, 10**6], GREEDY)
    with pytest.raises(ValueError, match="priority"):
        e.add_request("prio", [5], GREEDY, priority="high")
    with pytest.raises(ValueError, match="tenant"):
        e.add_request("tenant", [5], GREEDY, tenant=7)
    assert list(e.scheduler.requests) == ["ok"] and set(e.detokenizer.streamed) <= {"ok"}
    e.scheduler.check_invariants()
    assert e.abort_request("nobody") is False
    assert run_checked(e)["ok"].outputs[0].token_ids == list(alone((5, 6), 12))


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="policy"):
        EngineConfig(policy="random")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=1.5)


def test_abort_frees_blocks_and_reports(tiny):
    e = tiny_engine(tiny, num_blocks=16)
    e.add_request("a", [5] * 10, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    e.add_request("b", [6] * 10, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    e.step()
    e.step()
    assert e.abort_request("a") is True
    e.scheduler.check_invariants()
    outs = run_checked(e)
    # step 1 prefilled a (its first token), step 2 decoded it (second) beside b's prefill
    assert outs["a"].outputs[0].finish_reason == "abort" and len(outs["a"].outputs[0].token_ids) == 2
    assert outs["b"].outputs[0].finish_reason == "length"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 6)), min_size=1, max_size=7),
    block_size=st.sampled_from([2, 4, 16]),
    extra_blocks=st.integers(0, 30),
    max_num_seqs=st.integers(1, 5),
    chunk=st.integers(1, 48),
    chunks_per_step=st.integers(1, 3),
    chunked=st.booleans(),
    aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6)), max_size=3),
)
def test_random_workloads_give_each_request_its_solo_tokens(tiny, reqs, block_size, extra_blocks, max_num_seqs,
                                                            chunk, chunks_per_step, chunked, aborts):
    """Random arrivals, lengths, budgets, pool sizes and aborts: every request that is not aborted ends
    with exactly its solo tokens, an aborted one with a prefix of them; invariants hold at every step
    and the pool is entirely free at the end."""
    need = max(ceil_div(p + m - 1, block_size) for p, m, _ in reqs)
    e = tiny_engine(tiny, num_blocks=need + extra_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
               chunked_prefill_size=chunk, max_prefill_chunks_per_step=chunks_per_step,
               enable_chunked_prefill=chunked)
    prompts = {}
    for i, (p, m, arrive) in enumerate(reqs):
        prompts[str(i)] = (tuple((i * 7 + j) % 250 + 3 for j in range(p)), m)
        e.add_request(str(i), list(prompts[str(i)][0]), SamplingParams(max_tokens=m, temperature=0, ignore_eos=True),
                      arrival_time=arrive * 0.01)
    aborted = set()
    final = {}
    step = 0
    while e.has_unfinished_requests():
        for when, who in aborts:
            if when == step and e.abort_request(str(who % len(reqs))):
                aborted.add(str(who % len(reqs)))
        for out in e.step():
            if out.finished:
                final[out.request_id] = out
        e.scheduler.check_invariants()
        step += 1
        assert step < 5000
    assert e.block_pool.num_free_blocks == e.block_pool.num_blocks
    assert set(final) == set(prompts)
    for rid, (prompt, m) in prompts.items():
        got = tuple(final[rid].outputs[0].token_ids)
        want = alone(prompt, m)
        if rid in aborted:
            assert final[rid].outputs[0].finish_reason == "abort" and got == want[: len(got)]
        else:
            assert got == want, rid


def test_llm_uses_offline_defaults_that_keywords_override():
    from minfer.engine import OFFLINE_DEFAULTS

    llm = LLM("tiny-random", num_blocks=32)
    assert llm.engine.config.max_prefill_chunks_per_step == OFFLINE_DEFAULTS["max_prefill_chunks_per_step"] > 1
    assert llm.engine.config.chunked_prefill_size == OFFLINE_DEFAULTS["chunked_prefill_size"] > 512
    one = LLM("tiny-random", num_blocks=32, max_prefill_chunks_per_step=1)
    assert one.engine.config.max_prefill_chunks_per_step == 1
    assert EngineConfig().max_prefill_chunks_per_step == 1  # the step-level engine keeps its latency defaults
    assert EngineConfig().chunked_prefill_size == 512
    assert llm.engine.config.enable_prefix_caching and not EngineConfig().enable_prefix_caching


def test_llm_second_generate_reuses_the_first_ones_prompt_blocks():
    """LLM() caches prefixes, as vLLM's does: the same prompts sent again skip the prefill of their full blocks, and
    the tokens do not change."""
    llm = LLM("tiny-random", num_blocks=64, block_size=8, debug_checks=True)  # invariants checked after every step
    prompts = [[(7 * i + j) % 200 + 3 for j in range(20 + 5 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = llm.generate(prompts, params, use_tqdm=False)
    second = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in second] == [o.outputs[0].token_ids for o in first]
    assert [o.metrics.num_cached_tokens for o in first] == [0, 0, 0]
    # every full block of each prompt, short of the last prompt token (its logits give the first output token)
    assert [o.metrics.num_cached_tokens for o in second] == [(len(p) - 1) // 8 * 8 for p in prompts]
