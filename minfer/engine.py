"""LLMEngine (step by step) and LLM (offline generation): the public face of minfer.

One ``step()`` is the whole data flow of an inference server:

    schedule()  → which requests compute which tokens (and who is admitted, preempted, refused)
    execute()   → one forward pass over all of them, one sampled token per request at its last token
    update()    → append tokens, stop what is finished, free its blocks at once
    StepTrace   → one plain record of it all, for metrics, widgets and tests

Time is kept on the engine's own clock, ``engine.now``: each step advances it by the step's measured
wall time (real model) or modelled time (simulator), and it jumps over idle gaps to the next arrival.
So a workload with arrival times replays the same way in a notebook, a test, or a simulated H100.

One bad request must never fail the others. Every field is checked when the request is added (a clear
``ValueError`` naming the field, and nothing changes); and if a step still fails, the engine finds the
request(s) whose chunk makes it fail -- running halves of the step until each failing part is one request --
ends those with finish reason ``"error"`` and serves everyone else (``faults.py``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tqdm.auto import tqdm

from minfer import input_checks
from minfer.config import SPEED_UPS, EngineConfig
from minfer.detokenizer import Detokenizer
from minfer.executor import ExecutorSetup, ModelOutput
from minfer.faults import execute_isolating_faults, failure
from minfer.kv.block_pool import BlockPool
from minfer.kv.host_cache import HostPrefixCache, TieredBlockPool
from minfer.kv.host_pool import HostBlockPool
from minfer.plan import Ended, SchedulerOutput
from minfer.request import (
    CompletionOutput,
    Request,
    RequestOutput,
    SamplingParams,
)
from minfer.runner import build_model_executor, resolve_dtype
from minfer.scheduler.scheduler import Scheduler, StopCheck
from minfer.sim.executor import build_sim_executor
from minfer.trace import StepTrace

__all__ = ["EXECUTORS", "LLM", "LLMEngine", "Prompt", "build_executor", "resolve_dtype"]

Prompt = str | Sequence[int]

# EngineConfig.executor → the function that builds it (a new executor: one entry here, one Literal name)
EXECUTORS: dict[str, Callable[[EngineConfig, Any, Any], ExecutorSetup]] = {
    "model": build_model_executor,  # the real model (runner.py)
    "sim": build_sim_executor,  # a roofline cost model of a GPU, no weights (sim/executor.py)
}


def build_executor(config: EngineConfig, model: Any = None, tokenizer: Any = None) -> ExecutorSetup:
    """The executor ``config.executor`` names, with what the engine must know before its first step."""
    return EXECUTORS[config.executor](config, model, tokenizer)


def _keep_last(items: list, n: int | None) -> None:
    """Drop all but the ``n`` most recent items (``None``: keep all). A server runs for days: what it keeps
    per request or per step must not grow with them (aggregates, such as its /metrics, are kept elsewhere)."""
    if n is not None and len(items) > n:
        del items[: len(items) - n]


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
        self.finished: list[Request] = []  # requests that ended, in order (metrics read these); the most
        # recent config.finished_window of them when it is set (as engine.trace keeps config.trace_window steps)
        self._ended_between_steps: list[Request] = []  # aborted since the last step: the next step reports them
        self.stream_outputs = True  # an output for every request that got a token (False: only those that ended)
        self._step_index = 0
        setup = build_executor(config, model, tokenizer)
        self.executor = setup.executor
        self.model, self.tokenizer, self.kv_cache = setup.model, setup.tokenizer, setup.kv_cache
        self.max_model_len, self.vocab_size, self.eos_token_ids = (
            setup.max_model_len, setup.vocab_size, setup.eos_token_ids)
        self.detokenizer = Detokenizer(setup.tokenizer) if setup.tokenizer is not None else None
        self.block_pool = (BlockPool(setup.num_blocks, config.block_size) if not config.host_cache_blocks else
                           TieredBlockPool(setup.num_blocks, config.block_size,  # the prefix cache's host tier
                                           HostPrefixCache(config.host_cache_blocks, setup.num_swap_blocks)))
        self.host_pool = HostBlockPool(setup.num_swap_blocks, config.block_size)  # swapped-out K/V (swap mode)
        self.kv_block_bytes = setup.kv_block_bytes
        self.scheduler = Scheduler(config, self.block_pool, self.max_model_len, self.host_pool)

    # ---- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = 0, tenant: str | None = None, arrival_time: float | None = None) -> Request:
        """Queue a request. Bad input raises ``ValueError`` naming the field, and changes nothing.

        The engine keeps its own checked copy of ``params``: changing the caller's object later cannot reach
        a request that is already running."""
        request_id = input_checks.text("request_id", request_id)  # type: ignore[assignment]
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams (or None for the defaults), got {type(params).__name__}")
        params = replace(params)  # a fresh, re-validated copy (its lists are new lists)
        if self.vocab_size is not None:
            params.check_vocabulary(self.vocab_size)
        priority = input_checks.integer("priority", priority, -input_checks.INT32_MAX - 1, input_checks.INT32_MAX)
        tenant = input_checks.text("tenant", tenant, optional=True)
        if arrival_time is not None:
            arrival_time = input_checks.real("arrival_time", arrival_time, 0.0)
        ids = self._tokenize(prompt)
        if not ids:
            raise ValueError("prompt is empty: a request needs at least one prompt token")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's limit (max_model_len) is {self.max_model_len}, "
                "and a request needs room for at least one new token"
            )
        req = Request(request_id, ids, params, self.now if arrival_time is None else arrival_time,
                      prompt=prompt if isinstance(prompt, str) else None, priority=priority, tenant=tenant,
                      eos_token_ids=self.eos_token_ids)
        pool = self.block_pool
        if (need := pool.blocks_for(req.max_kv_slots(self.max_model_len))) > pool.num_blocks:
            raise ValueError(
                f"prompt of {len(ids)} tokens + max_tokens={params.max_tokens} needs {need} KV blocks of "
                f"{pool.block_size} tokens but the whole pool has {pool.num_blocks} (num_blocks): it could never finish"
            )
        self.scheduler.add_request(req, self.now)
        return req

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer (simulator): pass prompts as token-id lists")
            return self.tokenizer.encode(prompt)
        high = self.vocab_size - 1 if self.vocab_size is not None else None
        if not isinstance(prompt, (list, tuple)):
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return input_checks.integer_list("prompt token ids", prompt, 0, high)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (its blocks are freed); False if no unfinished request has that id."""
        req = self.scheduler.requests.get(request_id) if isinstance(request_id, str) else None
        if req is None:
            return False
        self.scheduler.finish(req, "abort", None, self.now)
        self._ended_between_steps.append(req)
        return True

    def _discard(self, request_id: str) -> None:
        """Take back a request that was just added, as if it never had been: no output, nothing kept."""
        self.scheduler.finish(self.scheduler.requests[request_id], "abort", None, self.now)
        self.scheduler.ended = [e for e in self.scheduler.ended if e.request != request_id]
        self.scheduler.joined = [r for r in self.scheduler.joined if r.request_id != request_id]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._ended_between_steps)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    def unfinished_requests(self) -> list[Request]:
        """Every request added and not finished yet (not arrived, queued or running), in the order added:
        what a widget or server reads instead of the scheduler's own bookkeeping."""
        return list(self.scheduler.requests.values())

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
        # a step with nothing to compute or copy (only refusals or timeouts) takes no time
        result, failed = (execute_isolating_faults(self.executor, out) if out.has_work
                          else (ModelOutput(duration=0.0), {}))
        t2 = time.perf_counter()
        # tokens exist once the forward pass is done: on the modelled clock, or the measured one
        done = start + (result.duration if result.duration is not None else t2 - t0)
        checks = sched.update(out, result.sampled, done, result.accepted)
        for req, why in failed.items():
            sched.finish(req, "error", why, done)
        outputs = self._finish_and_report(checks, out.finished + list(failed), done)
        t3 = time.perf_counter()
        duration = result.duration if result.duration is not None else t3 - t0
        self.now = start + duration
        sched.observe_step(out, duration)
        ended, joined = sched.take_log()
        if self.config.record_trace:
            self.trace.append(self._trace(out, result, outputs, start, duration, (t1 - t0) + (t3 - t2), ended,
                                          joined))
            _keep_last(self.trace, self.config.trace_window)
        if self.config.debug_checks:
            sched.check_invariants()
        self._step_index += 1
        return outputs

    def _finish_and_report(self, checks: list[StopCheck], ended: list[Request], now: float) -> list[RequestOutput]:
        """End what must end, then build outputs: first for requests that got a token, then for those that
        ended without one (refused, timed out, aborted, failed). Finished requests move to ``self.finished``."""
        outputs = []
        detok, stream = self.detokenizer, self.stream_outputs
        for req, reason, why, got in checks:
            new_text = ""
            if detok is not None and (stream or req.params.stop or reason):  # not streaming: decode once, at the end
                before = req.num_output_tokens - got
                try:
                    new_text, stop = self._new_text(detok, req, reason, got, now)
                except Exception as e:  # a tokenizer failing on one request's tokens fails that request only
                    reason, why = "error", failure(req, e)
                else:
                    if stop is not None:  # a stop string, even one the last allowed token completed
                        reason, why = "stop", stop
                        got = req.num_output_tokens - before  # the tokens after it are gone
            if reason is not None:  # it ends here (a request that failed in the step got no token: not in checks)
                self.scheduler.finish(req, reason, why, now)
            if stream or reason is not None:
                outputs.append(self._output(req, req.output_token_ids[-got:] if got else [], new_text))
        for req in ended + self._ended_between_steps:
            new_text = detok.update(req, req.finish_reason).new_text if detok is not None else ""
            outputs.append(self._output(req, [], new_text))
        self._ended_between_steps = []
        return outputs

    @staticmethod
    def _new_text(detok: Detokenizer, req: Request, reason: str | None, got: int, now: float) -> tuple[str, str | None]:
        """The settled text of ``req``'s ``got`` new tokens, and the stop string they complete, if any. Several
        tokens in one step (speculative decoding) are taken one at a time when stop strings are set, so that the
        request ends at the token that completed one -- the same tokens as without speculation; those after it
        are dropped."""
        if got == 1 or not req.params.stop:
            update = detok.update(req, reason)  # type: ignore[arg-type]
            return update.new_text, update.stop
        tail = req.output_token_ids[-got:]
        req.truncate_output(req.num_output_tokens - got)
        text = ""
        for i, token in enumerate(tail):
            req.append_token(token)
            req.metrics.token_times.append(now)
            update = detok.update(req, reason if i == got - 1 else None)  # type: ignore[arg-type]
            text += update.new_text
            if update.stop is not None:
                return text, update.stop
        return text, None

    def _output(self, req: Request, new_ids: list[int], new_text: str) -> RequestOutput:
        finished = req.is_finished
        detok = self.detokenizer
        text = "" if detok is None else detok.pop(req.request_id) if finished else detok.text(req.request_id)
        if finished:
            self.finished.append(req)
            _keep_last(self.finished, self.config.finished_window)
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            outputs=[CompletionOutput(0, text, list(req.output_token_ids), req.finish_reason, req.stop_reason)],
            finished=finished, metrics=req.metrics, new_token_ids=new_ids, new_text=new_text,
        )

    def _trace(self, out: SchedulerOutput, result: ModelOutput, outputs: list[RequestOutput], start: float,
               duration: float, sched_time: float, ended: list[Ended], joined: list[Request]) -> StepTrace:
        prefill: dict[str, int] = {}
        decode: dict[str, int] = {}
        positions: dict[str, int] = {}
        for c in out.chunks:
            rid = c.request.request_id
            (decode if c.is_decode else prefill)[rid] = c.num_tokens
            positions[rid] = c.start
        finished = [o for o in outputs if o.finished]
        pool, sched = self.block_pool, self.scheduler
        return StepTrace(
            step=self._step_index, start_time=start, duration=duration,
            prefill_tokens=prefill, decode_tokens=decode, positions=positions, blocks=sched.blocks_held(),
            num_running=len(sched.running), num_waiting=sched.num_waiting, num_pending=sched.num_pending,
            num_free_blocks=pool.num_free_blocks, num_blocks=pool.num_blocks,
            admitted=[r.request_id for r in out.admitted], preempted=[r.request_id for r in out.preempted],
            finished=[o.request_id for o in finished],
            finish_reasons={o.request_id: o.outputs[0].finish_reason for o in finished},  # type: ignore[misc]
            num_cached_tokens=out.num_cached_tokens, num_cached_blocks=pool.num_cached_blocks,
            scheduler_time=sched_time, decisions=[*out.decisions, *ended],
            tenants={r.request_id: r.tenant for r in joined if r.tenant is not None},
            priorities={r.request_id: r.priority for r in joined if r.priority != 0},
            swapped_out={rid: len(c) for rid, c in out.swap_out.items()},
            swapped_in={rid: len(c) for rid, c in out.swap_in.items()},
            spilled_blocks=len(out.spill), loaded_blocks={rid: len(c) for rid, c in out.load.items()},
            swap_bytes=self.kv_block_bytes * out.num_copies, num_swapped_blocks=self.host_pool.num_used_blocks,
            num_host_cached_blocks=len(sched.host_cache),
            draft_tokens=dict(result.proposed), accepted_tokens={r: len(a) for r, a in result.accepted.items()},
        )

    # ---- conveniences ----------------------------------------------------------------------------
    def run(self, progress: bool = False) -> list[RequestOutput]:
        """Step until every request has finished; returns each request's final output."""
        final: dict[str, RequestOutput] = {}
        total = self.num_unfinished_requests
        stream, self.stream_outputs = self.stream_outputs, False  # nobody reads per-token outputs: skip them
        try:
            with tqdm(total=total, disable=not progress, desc="requests", unit="req") as bar:
                while self.has_unfinished_requests():
                    for o in self.step():
                        if o.finished:
                            final[o.request_id] = o
                            bar.update(1)
        finally:
            self.stream_outputs = stream
        return list(final.values())


# Offline generation knows its whole batch up front and is judged by throughput: several prompts share each
# step's prefill budget, and the budget is larger (2048 tokens, not 512): bigger products run faster per row,
# and fewer steps means fewer decode rows spent in small batches. LLMEngine's own defaults, one prompt of at most
# 512 tokens per step, keep the inter-token latency of running requests steadier for a server. vLLM does the
# same: its LLM class gets larger step budgets than its server. Prefix caching is on, as in vLLM's LLM: a script
# that calls generate again with the same system prompt (or the same prompts) skips their prefill, and outputs are
# identical with it on or off (chapter 08); with nothing to share it costs a hash per full block (no measurable time
# on the README workload). LLMEngine leaves it off, for chapter 08 to turn on. And the model runs with every
# speed-up this machine has (SPEED_UPS: packed products, compiled norms), where LLMEngine runs the plain model the
# chapters read. Any keyword passed to LLM overrides these.
OFFLINE_DEFAULTS: dict[str, Any] = {**SPEED_UPS, "chunked_prefill_size": 2048, "max_prefill_chunks_per_step": 32,
                                    "enable_prefix_caching": True}


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
        one = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], int))
        batch: list[Prompt] = [prompts] if one else list(prompts)  # type: ignore[list-item, arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(batch)
        else:
            params = list(sampling_params)
            if len(params) != len(batch):
                raise ValueError(f"got {len(params)} SamplingParams for {len(batch)} prompts")
        ids = []
        try:
            for prompt, p in zip(batch, params):
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
