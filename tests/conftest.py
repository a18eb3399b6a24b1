"""Shared fixtures: the tiny random model (fast unit tests), the real SmolLM2 (integration tests), and the class
handout of this checkout (the exercise machinery's tests)."""

from __future__ import annotations

import functools
import os
import random

import pytest
import torch

if not torch.cuda.is_available():  # Triton fixes its mode at import (transformers imports it): interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")  # on a CPU, or attention_backend="triton" cannot run

from minfer import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from minfer.model.loader import load_model, tiny_random_model  # noqa: E402
from minfer.model.tokenizer import ByteTokenizer  # noqa: E402
from minfer.viz.snapshot import browser_missing  # noqa: E402


def skip_unless_required(why: str, variable: str) -> None:
    """Skip, saying ``why`` -- or fail where ``variable`` is set (CI sets it): there a missing install step must fail
    the run instead of skipping what it would check."""
    (pytest.fail if os.environ.get(variable) else pytest.skip)(why)


def require_browser() -> None:
    """Skip without Chromium and playwright -- or fail under MINFER_REQUIRE_BROWSER=1 (CI)."""
    if missing := browser_missing():
        skip_unless_required(missing, "MINFER_REQUIRE_BROWSER")


@pytest.fixture(scope="session")
def handout(tmp_path_factory):
    """The class handout of this checkout (what ``make student`` writes), built once for every test that reads it;
    tests that change a copy of it make their own."""
    from minfer.exercises.standin import ROOT
    from minfer.exercises.student import build_student_copy

    dest = tmp_path_factory.mktemp("handout") / "course"
    build_student_copy(ROOT, dest)
    return dest


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the 2-layer seeded random model."""
    return load_model("tiny-random")


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct in float32."""
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def hf_smollm2():
    """The same weights run by Hugging Face transformers: the reference for exactness."""
    from transformers import AutoModelForCausalLM

    from minfer.model.loader import resolve_checkpoint

    return AutoModelForCausalLM.from_pretrained(resolve_checkpoint("smollm2-135m"), dtype=torch.float32).eval()


def tiny_engine(tiny, **config) -> LLMEngine:
    """An engine over the shared tiny random model that checks scheduler and pool invariants after every step."""
    model, tok = tiny
    return LLMEngine(EngineConfig(model="tiny-random", debug_checks=True, **config), model=model, tokenizer=tok)


@functools.cache
def alone(prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """Greedy tokens of a request that has the whole engine to itself."""
    e = LLMEngine(EngineConfig(model="tiny-random", max_num_seqs=1, num_blocks=256), model=tiny_random_model(),
                  tokenizer=ByteTokenizer())
    e.add_request("solo", list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return tuple(run_checked(e)["solo"].outputs[0].token_ids)


@torch.inference_mode()
def whole_sequence_hidden(model, ids: list[int]) -> torch.Tensor:
    """Every position's final hidden state for one sequence: the model alone over a contiguous cache, no engine."""
    from minfer.kv.contiguous import ContiguousKVCache

    cache, pos = ContiguousKVCache(model.config, 1, len(ids)), torch.arange(len(ids))
    return model(torch.tensor(ids), pos, cache.attention(torch.tensor([0]), pos[None]))


def check_engines_sharing_a_model(tiny, field: str, backends: tuple[str, str], uses) -> None:
    """Two engines on one model object, ``field`` set to each of ``backends``, stepped in turn: each engine runs its
    own backend (``uses(its model) == backend``; the speed-up layer gives each a copy of the model's module tree),
    the shared model stays the plain one, and each engine's greedy tokens equal what it makes alone."""
    model, tok = tiny
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [list(range(5, 30)), list(range(40, 52))]

    def engine(backend: str) -> LLMEngine:
        e = LLMEngine(EngineConfig(model="tiny-random", attention_backend="torch", num_blocks=32, debug_checks=True,
                                   **{field: backend}), model=model, tokenizer=tok)
        for i, p in enumerate(prompts):
            e.add_request(f"r{i}", p, params)
        return e

    alone = {}
    for backend in backends:
        e = engine(backend)
        e.run()
        alone[backend] = {r.request_id: r.output_token_ids for r in e.finished}
    pair = [(engine(b), b) for b in backends]
    while any(e.has_unfinished_requests() for e, _ in pair):
        for e, backend in pair:
            if e.has_unfinished_requests():
                e.step()
                assert uses(e.executor.model) == backend
                assert uses(model) == "torch"
                e.scheduler.check_invariants()
    for e, backend in pair:
        assert {r.request_id: r.output_token_ids for r in e.finished} == alone[backend]


def run_checked(engine: LLMEngine, max_steps: int = 100_000, before_step=None) -> dict:
    """Step the engine to completion, checking scheduler and pool invariants after every step (calling
    ``before_step()`` before each, e.g. to abort requests mid-run). Returns the final output of every request
    by id."""
    final = {}
    steps = 0
    while engine.has_unfinished_requests():
        if before_step is not None:
            before_step()
        for out in engine.step():
            if out.finished:
                assert out.request_id not in final, f"{out.request_id} finished twice"
                final[out.request_id] = out
        engine.scheduler.check_invariants()
        steps += 1
        assert steps < max_steps, "engine did not finish"
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks, "blocks leaked"
    return final


def greedy_run(model, backend: str, block_size: int = 16, max_tokens=(9,) * 4, padded_decode: bool = False):
    """Greedy tokens per request id for a fixed set of prompts. Small chunks and a small pool: prompts
    split mid-block, and decodes share steps with prefill chunks."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 320) for _ in range(n)] for n in (7, 41, 23, 2)]
    config = EngineConfig(model="tiny-random", attention_backend=backend, block_size=block_size,
                          num_blocks=24, max_num_seqs=3, chunked_prefill_size=13)
    engine = LLMEngine(config, model=model, tokenizer=ByteTokenizer())
    if padded_decode:  # the CUDA-graph path, run eagerly: decode batches padded to 1, 2 or 4 rows
        from minfer.cuda_graphs import DecodeGraphs

        engine.executor.forward = DecodeGraphs(engine.executor, max_batch=4, capture=False)
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
    return engine, {rid: o.outputs[0].token_ids for rid, o in run_checked(engine).items()}


# tiny models for checking a backend against the reference: as shipped (GQA 3, head_dim 16), and GQA 1 with
# a head_dim that is no power of two -- each with its block size
BACKEND_CASES = [({}, 16), (dict(num_heads=2, num_kv_heads=2, head_dim=48), 32)]


def check_backend_matches_reference(backend: str, overrides: dict, block_size: int) -> None:
    """The engine with ``backend`` gives the reference's greedy tokens on a run that mixes decodes and
    prefill chunks in one step."""
    from minfer.model.loader import tiny_random_config, tiny_random_model

    model = tiny_random_model(tiny_random_config(**overrides), seed=3)
    _, expected = greedy_run(model, "torch", block_size)
    engine, got = greedy_run(model, backend, block_size)
    assert engine.kv_cache.backend.name == backend, f"the engine did not use the {backend} backend"
    assert any(len(t.prefill_tokens) and len(t.decode_tokens) for t in engine.trace), "no mixed step ran"
    assert got == expected


def decisions(step, kind: type) -> list:
    """The step's scheduler decisions of one kind (``minfer.plan.Admitted``, ``Preempted``, ...)."""
    return [d for d in step.decisions if isinstance(d, kind)]


def decision(step, request_id: str, kind: type):
    """The one decision of ``kind`` the step recorded for ``request_id``."""
    found = [d for d in decisions(step, kind) if d.request == request_id]
    assert len(found) == 1, f"step {step.step}: {len(found)} {kind.__name__} decisions for {request_id}"
    return found[0]
