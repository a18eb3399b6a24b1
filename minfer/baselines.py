"""Baselines that continuous batching is measured against.

* ``static_batching``: request-level batching on minfer's own model -- take ``batch_size`` requests, pad
  their prompts to the longest, and decode every row until the longest output is done. Finished rows
  keep computing (bubbles); the next batch waits for the whole batch. This is how inference worked
  before iteration-level scheduling, and chapter 02 measures its waste.
* ``hf_generate_static``: Hugging Face ``generate`` on static batches (left padding).
* ``hf_continuous_batching``: Hugging Face's own continuous batching manager.

Every baseline does the same useful work as the engine -- each request's prompt and exactly
``max_tokens`` output tokens (EOS ignored) -- so "useful output tokens per second" compares like with like.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minfer.kv.contiguous import ContiguousKVCache
from minfer.model.llama import LlamaModel
from minfer.units import ceil_div
from minfer.workload import WorkItem, token_prompts


@dataclass(slots=True)
class BaselineResult:
    name: str
    output_tokens: int  # useful output tokens (each request's own max_tokens)
    seconds: float
    outputs: list[list[int]] = field(default_factory=list)  # generated ids per request, in input order
    steps: list[dict[str, int]] = field(default_factory=list)  # static batching: per-step slot accounting
    first_token_seconds: list[float] = field(default_factory=list)  # static batching: TTFT per request, from the start

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else float("nan")


def _batches(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def slot_accounting(prompt_lens: Sequence[int], output_lens: Sequence[int],
                    batch_size: int) -> list[dict[str, int]]:
    """How static batching spends its ``batch_size`` row-slots in each forward pass -- fixed by the lengths alone.

    Each batch of ``b`` requests runs one prefill pass over its prompts, padded to the longest (``width``), which
    samples every row's first token; then decode passes until its longest answer is complete. Per pass:

    * ``useful``: prompt tokens (the prefill), or rows whose answer still wants a token (a decode);
    * ``padding``: the prefill's padded positions, ``b * width`` minus the prompt tokens;
    * ``bubbles``: decode rows whose answer is already complete, computing nothing anyone reads;
    * ``idle_slots``: slots a last, smaller batch leaves empty.
    """
    # BEGIN EXERCISE E2.1
    steps = []
    for batch in _batches(len(prompt_lens), batch_size):
        lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
        b, idle = len(batch), batch_size - len(batch)
        steps.append({"batch_slots": batch_size, "useful": sum(lens), "padding": b * max(lens) - sum(lens),
                      "idle_slots": idle, "bubbles": 0})
        for t in range(1, max(outs)):  # decode pass t computes token t + 1 of every answer
            live = sum(t < n for n in outs)
            steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": idle,
                          "bubbles": b - live})
    return steps
    # END EXERCISE


@torch.inference_mode()
def static_batching(model: LlamaModel, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int],
                    batch_size: int = 16) -> BaselineResult:
    """Greedy request-level batching with padding; ``steps`` says, per forward pass, how many slots computed
    useful tokens, padding, or finished rows (bubbles): ``slot_accounting``."""
    dev = model.device
    longest = max(map(len, prompts)) + max(max_tokens)  # finished rows keep decoding to the end
    cache = ContiguousKVCache(model.config, batch_size, longest, model.dtype, dev)
    outputs: list[list[int]] = [[] for _ in prompts]
    first_token = [0.0] * len(prompts)  # every request arrived at the start: its TTFT is when its batch prefilled
    start = time.perf_counter()
    for batch in _batches(len(prompts), batch_size):
        rows = list(batch)
        b = len(rows)
        lens = torch.tensor([len(prompts[i]) for i in rows], device=dev)
        width = int(lens.max())
        ids = torch.zeros(b, width, dtype=torch.long, device=dev)  # right padding with token 0
        for r, i in enumerate(rows):
            ids[r, : len(prompts[i])] = torch.tensor(prompts[i])
        positions = torch.arange(width, device=dev).expand(b, width)
        slots = torch.arange(b, device=dev)
        hidden = model(ids.flatten(), positions.flatten(), cache.attention(slots, positions))
        last = hidden.view(b, width, -1)[torch.arange(b, device=dev), lens - 1]
        token = model.compute_logits(last).argmax(-1)
        budget = [max_tokens[i] for i in rows]
        pos = lens.clone()
        for r, i in enumerate(rows):
            outputs[i].append(int(token[r]))
            first_token[i] = time.perf_counter() - start
        for t in range(1, max(budget)):  # every row decodes until the longest is done
            hidden = model(token, pos, cache.attention(slots, pos[:, None]))
            token = model.compute_logits(hidden).argmax(-1)
            pos += 1
            live = [r for r in range(b) if t < budget[r]]
            for r in live:
                outputs[rows[r]].append(int(token[r]))
    seconds = time.perf_counter() - start
    steps = slot_accounting([len(p) for p in prompts], max_tokens, batch_size)
    return BaselineResult("minfer static batching", sum(max_tokens), seconds, outputs, steps, first_token)


@torch.inference_mode()
def hf_generate_static(hf_model, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int],
                       batch_size: int = 16, pad_token_id: int = 0) -> BaselineResult:
    """Hugging Face ``generate`` (greedy) in static batches, left-padded; EOS ignored via ``min_new_tokens``."""
    dev = hf_model.device
    outputs: list[list[int]] = [[] for _ in prompts]
    start = time.perf_counter()
    for batch in _batches(len(prompts), batch_size):
        rows = list(batch)
        width = max(len(prompts[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, i in enumerate(rows):
            n = len(prompts[i])
            ids[r, width - n:] = torch.tensor(prompts[i])
            mask[r, width - n:] = 1
        new = max(max_tokens[i] for i in rows)
        out = hf_model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, pad_token_id=pad_token_id)
        for r, i in enumerate(rows):
            outputs[i] = out[r, width : width + max_tokens[i]].tolist()
    seconds = time.perf_counter() - start
    return BaselineResult("HF generate, static batches", sum(max_tokens), seconds, outputs)


PAGE_SIZE = 256  # tokens per cache page of Hugging Face's paged cache (its default)


def hf_continuous_batching(hf_model, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> BaselineResult:
    """Hugging Face's continuous batching manager (transformers >= 5), greedy, EOS disabled, each
    request with its own ``max_new_tokens``. Not under ``torch.inference_mode``: the manager allocates its buffers
    here and updates them in place from its own thread, which PyTorch forbids for inference tensors (transformers
    5.19 fails every request so). A request that fails or comes back short raises: its tokens were not computed."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), eos_token_id=-1)
    # a KV cache that holds every request at once, as minfer's pool does (left to itself, Hugging Face sizes
    # it to 90% of the free memory: 14 GB on a 24 GB machine, for a workload that needs megabytes)
    pages = sum(ceil_div(len(p) + m, PAGE_SIZE) for p, m in zip(prompts, max_tokens))
    cache = ContinuousBatchingConfig(page_size=PAGE_SIZE, num_blocks=pages)
    outputs: list[list[int]] = [[] for _ in prompts]
    with hf_model.continuous_batching_context_manager(generation_config=config, block=True, timeout=30,
                                                      continuous_batching_config=cache) as manager:
        start = time.perf_counter()  # after the manager's warm-up, as for the other systems
        ids = {manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=m, eos_token_id=-1): i
               for i, (p, m) in enumerate(zip(prompts, max_tokens))}
        done = 0
        while done < len(prompts):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("Hugging Face's continuous batching loop stopped early")
                continue
            if result.is_finished():
                outputs[ids[result.request_id]] = list(result.generated_tokens)
                done += 1
        seconds = time.perf_counter() - start
    short = [i for i, (out, m) in enumerate(zip(outputs, max_tokens)) if len(out) != m]
    if short:
        i = short[0]
        raise RuntimeError(f"Hugging Face's continuous batching returned {len(short)} of {len(prompts)} requests "
                           f"without their tokens (request {i}: {len(outputs[i])} of {max_tokens[i]}; its log "
                           "above says why)")
    return BaselineResult("HF continuous batching", sum(max_tokens), seconds, outputs)


# ---- as systems of the benchmark harness (``minfer.bench`` lists them by name) -----------------------------
SMOLLM2 = ("smollm2-135m", "cpu", torch.float32)


def _inputs(workload: Sequence[WorkItem]) -> tuple[list[list[int]], list[int]]:
    """The very token ids the engines get for ``workload``, and each request's output length."""
    from minfer.model.loader import load_model_cached

    model, _ = load_model_cached(*SMOLLM2)
    prompts = token_prompts(workload, model.config.vocab_size)
    return [list(p) for p in prompts], [w.output_len for w in workload]  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1)
def hf_smollm2():
    """Hugging Face's model of the same weights (float32, CPU), loaded once per process."""
    from transformers import AutoModelForCausalLM

    from minfer.model.loader import resolve_checkpoint

    return AutoModelForCausalLM.from_pretrained(resolve_checkpoint("smollm2-135m"), dtype=torch.float32).eval()


def minfer_static_system(workload: Sequence[WorkItem]) -> tuple[int, float]:
    from minfer.model.loader import load_model_cached

    r = static_batching(load_model_cached(*SMOLLM2)[0], *_inputs(workload))
    return r.output_tokens, r.seconds


def hf_static_system(workload: Sequence[WorkItem]) -> tuple[int, float]:
    r = hf_generate_static(hf_smollm2(), *_inputs(workload))
    return r.output_tokens, r.seconds


def hf_continuous_system(workload: Sequence[WorkItem]) -> tuple[int, float]:
    r = hf_continuous_batching(hf_smollm2(), *_inputs(workload))
    return r.output_tokens, r.seconds
