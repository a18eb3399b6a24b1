"""LLMEngine (step by step) and LLM (offline generation): the public face of minfer.

One ``step()`` is the whole data flow of an inference server:

    schedule()  → which requests compute which tokens (and who is admitted, preempted, refused)
    execute()   → one forward pass over all of them, one sampled token per request at its last token
    update()    → append tokens, stop what is finished, free its blocks at once
    StepTrace   → one plain record of it all, for metrics, widgets and tests

Time is kept on the engine's own clock, ``engine.now``: each step advances it by the step's measured
wall time (real model) or modelled time (simulator), and it jumps over idle gaps to the next arrival.
So a workload with arrival times replays the same way in a notebook, a test, or a simulated H100.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from tqdm.auto import tqdm

from minfer.config import EngineConfig, parse_bytes
from minfer.kv.block_pool import BlockPool
from minfer.request import (
    CompletionOutput,
    Request,
    RequestOutput,
    SamplingParams,
)
from minfer.scheduler.scheduler import Scheduler, SchedulerOutput, step_budgets
from minfer.trace import StepTrace

Prompt = str | Sequence[int]


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


class LLMEngine:
    """The step-level engine. Build it from an ``EngineConfig`` (or keyword arguments of one)::

        engine = LLMEngine(EngineConfig(model="smollm2-135m", num_blocks=256))
        engine.add_request("r1", "Hello", SamplingParams(max_tokens=16))
        while engine.has_unfinished_requests():
            for out in engine.step(): ...

    ``model``/``tokenizer`` may be passed in to reuse weights already loaded (notebooks build many
    engines over one model).
    """

    def __init__(self, config: EngineConfig | None = None, *, model: Any = None, tokenizer: Any = None,
                 **overrides: Any) -> None:
        config = replace(config, **overrides) if config else EngineConfig(**overrides)
        self.config = config
        self.now = 0.0
        self.trace: list[StepTrace] = []
        self.finished: list[Request] = []  # every request that ended, in order (metrics read these)
        self._texts: dict[str, str] = {}  # detokenized output so far, per unfinished request
        self._aborted: list[Request] = []
        self._stream = True  # an output for every request that got a token (run() needs only the finished)
        self._step_index = 0
        if config.executor == "sim":
            from minfer.sim.executor import build_sim_executor

            self.executor, self.model, self.tokenizer, num_blocks, self.max_model_len, self.eos_token_ids = (
                build_sim_executor(config)
            )
            self.block_pool = BlockPool(num_blocks, config.block_size)
        else:
            self._build_model_executor(model, tokenizer)
        self.scheduler = Scheduler(config, self.block_pool, self.max_model_len)

    def _build_model_executor(self, model: Any, tokenizer: Any) -> None:
        from minfer.cpu_malloc import keep_freed_memory
        from minfer.kv.cache import PagedKVCache, num_blocks_for_gpu, num_blocks_for_memory
        from minfer.model.loader import load_model
        from minfer.ops import attention_ops
        from minfer.runner import ModelRunner

        cfg = self.config
        dtype = resolve_dtype(cfg.dtype, cfg.device)
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA GPU (is a CUDA build of torch installed?)")
        # before any weights load: on the CPU, Triton's interpreter must be on before `triton` is imported
        store_kv, paged_attention = attention_ops(cfg.attention_backend, cfg.device)
        if cfg.device == "cpu":  # each step's activations reuse the last step's memory (see cpu_malloc.py)
            keep_freed_memory()
        if model is None:
            model, tokenizer = load_model(cfg.model, cfg.device, dtype)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with a preloaded model")
        else:
            model = model.to(device=cfg.device, dtype=dtype)
        self.model, self.tokenizer = model, tokenizer
        mcfg = model.config
        self.max_model_len = min(cfg.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
        self.eos_token_ids = tuple(sorted({tokenizer.eos_token_id, *mcfg.eos_token_ids}))
        num_blocks = cfg.num_blocks
        if num_blocks is None:
            if cfg.device.startswith("cuda"):
                from minfer.cuda_graphs import profile_forward

                # the largest step's activations stay reserved by PyTorch, so the pool leaves room for them
                # (CUDA-graph capture empties that cache and allocates its own; the 1 - gpu_memory_utilization
                # left over, 10% by default, is the margin that covers the difference)
                step_tokens = step_budgets(cfg, self.max_model_len)[1]
                profile_forward(model, step_tokens, cfg.max_num_seqs)
                num_blocks = num_blocks_for_gpu(mcfg, cfg.block_size, dtype, cfg.gpu_memory_utilization, cfg.device)
            else:
                num_blocks = num_blocks_for_memory(mcfg, cfg.block_size, dtype, parse_bytes(cfg.kv_cache_memory))
        if num_blocks < 1:
            raise ValueError("no memory left for KV cache blocks: lower the model size or raise the memory budget")
        self.kv_cache = PagedKVCache(mcfg, num_blocks, cfg.block_size, dtype, cfg.device, store_kv, paged_attention)
        self.block_pool = BlockPool(num_blocks, cfg.block_size)
        self.executor = ModelRunner(model, self.kv_cache, self.block_pool, seed=cfg.seed)
        if cfg.device.startswith("cuda") and cfg.cuda_graphs:
            from minfer.cuda_graphs import enable_cuda_graphs

            with torch.cuda.device(torch.device(cfg.device)):  # capture on this engine's GPU, not the current one
                enable_cuda_graphs(self.executor, max_batch=cfg.max_num_seqs)

    # ---- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = 0, tenant: str | None = None, arrival_time: float | None = None) -> Request:
        """Queue a request. Bad input raises ``ValueError`` and changes nothing."""
        params = params or SamplingParams()
        params.validate()
        request_id = str(request_id)
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        text = prompt if isinstance(prompt, str) else None
        ids = self._tokenize(prompt)
        if not ids:
            raise ValueError("prompt is empty: a request needs at least one prompt token")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's limit (max_model_len) is {self.max_model_len}, "
                "and a request needs room for at least one new token"
            )
        if arrival_time is not None and not math.isfinite(arrival_time):
            raise ValueError(f"arrival_time must be a finite number of seconds, got {arrival_time!r}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer (lower is served first), got {priority!r}")
        if tenant is not None and not isinstance(tenant, str):
            raise ValueError(f"tenant must be a string or None, got {tenant!r}")
        req = Request(request_id, list(ids), params, self.now if arrival_time is None else float(arrival_time),
                      prompt=text, priority=priority, tenant=tenant, eos_token_ids=self.eos_token_ids)
        pool = self.block_pool
        if (need := pool.blocks_for(req.max_kv_slots(self.max_model_len))) > pool.num_blocks:
            raise ValueError(
                f"prompt of {len(ids)} tokens + max_tokens={params.max_tokens} needs {need} KV blocks of "
                f"{pool.block_size} tokens but the whole pool has {pool.num_blocks} (num_blocks): it could never finish"
            )
        self._texts[request_id] = ""
        self.scheduler.add_request(req, self.now)
        return req

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer (simulator): pass prompts as token-id lists")
            return self.tokenizer.encode(prompt)
        ids = list(prompt)
        vocab = self.model.config.vocab_size if self.model is not None else None
        for t in ids:
            if not isinstance(t, int) or t < 0 or (vocab is not None and t >= vocab):
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {t!r}")
        return ids

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (its blocks are freed); False if no unfinished request has that id."""
        req = self.scheduler.requests.get(str(request_id))
        if req is None:
            return False
        self.scheduler.finish(req, "abort", None, self.now)
        self._aborted.append(req)
        return True

    def _discard(self, request_id: str) -> None:
        """Take back a request that was just added, as if it never had been: no output, nothing kept."""
        req = self.scheduler.requests[request_id]
        self.scheduler.finish(req, "abort", None, self.now)
        self._texts.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._aborted)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns an output for every request that got a token or finished."""
        sched = self.scheduler
        if not sched.running and not sched.num_waiting and (t := sched.next_arrival_time()) is not None:
            self.now = max(self.now, t)  # idle until the next request arrives
        start = self.now
        t0 = time.perf_counter()
        out = sched.schedule(start)
        t1 = time.perf_counter()
        sampled, model_time = self.executor.execute(out) if out.chunks else ({}, 0.0)
        t2 = time.perf_counter()
        # tokens exist once the forward pass is done: on the modelled clock, or the measured one
        done = start + (model_time if model_time is not None else t2 - t0)
        changed = sched.update(out, sampled, done)
        outputs = self._outputs(changed, out.finished, done)
        t3 = time.perf_counter()
        duration = model_time if model_time is not None else t3 - t0
        self.now = start + duration
        sched.observe_step(out, duration)
        if self.config.record_trace:
            self.trace.append(self._trace(out, outputs, start, duration, (t1 - t0) + (t3 - t2)))
        self._step_index += 1
        return outputs

    def _outputs(self, changed: list[Request], ended: list[Request], now: float) -> list[RequestOutput]:
        """Outputs for requests that got a token, then for those that ended without one (refused, timed
        out, aborted). Finished requests move to ``self.finished``."""
        outputs = []
        for req in changed:
            new_text = self._detokenize(req, now)  # may finish it (a stop string)
            if self._stream or req.is_finished:
                outputs.append(self._output(req, [req.output_token_ids[-1]], new_text))
        outputs += [self._output(req, [], self._detokenize(req, now)) for req in ended + self._aborted]
        self._aborted = []
        return outputs

    def _detokenize(self, req: Request, now: float) -> str:
        """The text this step adds to the request's stream; finishes the request on a stop string.

        The whole output is decoded again each time: the simplest detokenizer that is always right, since a
        token's text can depend on its neighbours. ``self._texts`` keeps what was streamed so far. Two things
        wait until they are settled: a trailing "\ufffd" (a character whose other bytes come with the next
        token), and, while stop strings are set, the last characters that could still begin one -- a client
        must never receive text that a stop string then removes."""
        stops = req.params.stop
        if self.tokenizer is None or not (self._stream or stops or req.is_finished):
            return ""  # run() reads only final outputs: decode once, at the end
        streamed = self._texts.get(req.request_id, "")
        text = self.tokenizer.decode(req.output_token_ids)
        if stops and req.finish_reason in (None, "length"):  # the last token may complete a stop string too
            for s in stops:
                at = text.find(s, max(0, len(streamed) - len(s)))
                if at >= 0:
                    text = text[:at]
                    if req.is_finished:  # by max_tokens in this very step: the stop string wins, as in vLLM
                        req.finish_reason, req.stop_reason = "stop", s
                    else:
                        self.scheduler.finish(req, "stop", s, now)
                    break
        settled = text
        if not req.is_finished:
            if stops:
                settled = settled[: max(0, len(settled) - max(map(len, stops)) + 1)]
            settled = settled.rstrip("\ufffd")
        new = settled[len(streamed):] if settled.startswith(streamed) else ""
        self._texts[req.request_id] = text if req.is_finished else streamed + new
        return new

    def _output(self, req: Request, new_ids: list[int], new_text: str) -> RequestOutput:
        finished = req.is_finished
        text = self._texts.pop(req.request_id, "") if finished else self._texts.get(req.request_id, "")
        if finished:
            self.finished.append(req)
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            outputs=[CompletionOutput(0, text, list(req.output_token_ids), req.finish_reason, req.stop_reason)],
            finished=finished, metrics=req.metrics, new_token_ids=new_ids, new_text=new_text,
        )

    def _trace(self, out: SchedulerOutput, outputs: list[RequestOutput], start: float, duration: float,
               sched_time: float) -> StepTrace:
        prefill, decode, positions = {}, {}, {}
        for c in out.chunks:
            rid = c.request.request_id
            (decode if c.is_decode else prefill)[rid] = c.num_tokens
            positions[rid] = c.start
        finished = [o for o in outputs if o.finished]
        pool, sched = self.block_pool, self.scheduler
        return StepTrace(
            step=self._step_index, start_time=start, duration=duration,
            prefill_tokens=prefill, decode_tokens=decode, positions=positions,
            blocks={r.request_id: len(pool.tables[r.request_id]) for r in sched.running},
            num_running=len(sched.running), num_waiting=sched.num_waiting, num_pending=sched.num_pending,
            num_free_blocks=pool.num_free_blocks, num_blocks=pool.num_blocks,
            admitted=[r.request_id for r in out.admitted], preempted=[r.request_id for r in out.preempted],
            finished=[o.request_id for o in finished],
            finish_reasons={o.request_id: o.outputs[0].finish_reason for o in finished},
            num_cached_tokens=out.num_cached_tokens, num_cached_blocks=pool.num_cached_blocks,
            scheduler_time=sched_time,
        )

    # ---- conveniences ----------------------------------------------------------------------------
    def run(self, progress: bool = False) -> list[RequestOutput]:
        """Step until every request has finished; returns each request's final output."""
        final: dict[str, RequestOutput] = {}
        total = self.num_unfinished_requests
        self._stream = False  # nobody reads per-token outputs: skip them (each copies the tokens so far)
        try:
            with tqdm(total=total, disable=not progress, desc="requests", unit="req") as bar:
                while self.has_unfinished_requests():
                    for o in self.step():
                        if o.finished:
                            final[o.request_id] = o
                            bar.update(1)
        finally:
            self._stream = True
        return list(final.values())


# Offline generation knows its whole batch up front and is judged by throughput: several prompts share each
# step's prefill budget (bigger, faster matrix products). LLMEngine's own default, one prompt per step, keeps the
# inter-token latency of running requests steadier for a server. vLLM does the same: its LLM class gets larger
# step budgets than its server. Any keyword passed to LLM overrides these.
OFFLINE_DEFAULTS: dict[str, Any] = {"max_prefill_chunks_per_step": 8}


class LLM:
    """Offline generation, vLLM-style::

        llm = LLM("smollm2-135m")
        outs = llm.generate(["What is the capital of France?"], SamplingParams(max_tokens=32, temperature=0))
        outs[0].outputs[0].text
    """

    def __init__(self, model: str = "smollm2-135m", **engine_config: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **{**OFFLINE_DEFAULTS, **engine_config}))
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams |
                 Sequence[SamplingParams] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (strings or token-id lists); outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        for p in params:
            p.validate()
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                rid = f"gen-{next(self._ids)}"
                self.engine.add_request(rid, prompt, p)
                ids.append(rid)
        except ValueError:
            for rid in ids:  # all or nothing: a bad prompt leaves the engine as it was
                self.engine._discard(rid)
            raise
        done = {o.request_id: o for o in self.engine.run(progress=use_tqdm)}
        return [done[rid] for rid in ids]

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of messages) or several, via the chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(list(c)) for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
