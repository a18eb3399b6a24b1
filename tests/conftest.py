"""Shared fixtures: the tiny random model (fast unit tests) and the real SmolLM2 (integration tests)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton fixes its mode at import (transformers imports it): interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")  # on a CPU, or attention_backend="triton" cannot run

from minfer import LLMEngine  # noqa: E402
from minfer.model.loader import load_model  # noqa: E402


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
