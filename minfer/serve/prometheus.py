"""``GET /metrics``: what a long-running server keeps instead of every request -- counters and histograms.

Prometheus scrapes this text every few seconds and keeps the history itself; the server holds only a few
numbers per metric, however long it runs (the engine keeps a bounded window of recent requests and steps,
``EngineConfig.finished_window``/``trace_window``). The figures come from the same records as everywhere
else in minfer: the gauges from the last ``StepTrace``, the latencies from each request's ``RequestMetrics``
(on the engine's clock, which the serving loop keeps on the wall clock).

**The names are vLLM's** (``vllm:*``, with its types, units, buckets and labels), so that what operators built
for vLLM -- its stock Grafana dashboards, alerts, autoscalers reading ``vllm:num_requests_waiting`` -- reads
minfer unchanged. And the *meaning* is vLLM's too, which is not always the obvious one:

* a request's first token is when its prompt counts (``vllm:prompt_tokens_total``, prefix-cache queries and
  hits) and when its TTFT is observed -- not when it finishes, so a dashboard sees a long answer's TTFT while
  it is still streaming;
* ``vllm:inter_token_latency_seconds`` is one observation per *output* after the first: one step's tokens come
  out together, so under speculative decoding a step that kept three guesses is one gap, not four;
* ``vllm:iteration_tokens_total`` observes, per step that produced outputs, the prompt tokens of the requests
  whose first token came in that step plus the tokens generated in it (vLLM's definition; it is *not* the
  number of tokens the step computed -- a chunk of a long prompt counts when the prompt's last chunk ends);
* the per-request histograms (queue, prefill, decode, inference, e2e time; prompt and generation lengths;
  ``max_tokens``) are observed when a request finishes, for the requests that produced at least one token --
  queue = arrival to first scheduled, prefill = first scheduled to first token, decode = first to last token,
  inference = first scheduled to last token (preemptions included in whichever phase they interrupted).

minfer keeps two extras under its own prefix, which vLLM has no equivalent for: ``minfer_engine_steps_total``
and ``minfer_http_errors_total`` (answers other than 200, by status).

Each app has its own registry, so several servers (tests, a notebook) can live in one process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minfer.metrics import SpecDecodeStats
from minfer.request import RequestOutput

# vLLM's buckets (seconds): TTFT reaches far (a queue of minutes), token gaps start at 10 ms, whole requests at 0.3 s
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_GAP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                     40.0, 80.0)
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ENGINE = "0"  # vLLM labels every metric with its engine core's index; minfer has one engine


def one_two_five(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``: vLLM's buckets for token counts (``limit``: the context length)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    """The Prometheus metrics of one server; ``observe`` is a step hook of the ``EngineLoop``."""

    def __init__(self, model: str, max_model_len: int) -> None:
        self.registry = r = CollectorRegistry()
        self.model = model
        labels = ("model_name", "engine")
        # every metric carries the served model's name and the engine index (as vLLM's do); bound once here
        gauge = lambda name, doc: Gauge(name, doc, labels, registry=r).labels(model, ENGINE)
        counter = lambda name, doc: Counter(name, doc, labels, registry=r).labels(model, ENGINE)

        def histogram(name: str, doc: str, buckets: Iterable[float]) -> Any:
            return Histogram(name, doc, labels, buckets=tuple(buckets), registry=r).labels(model, ENGINE)

        lengths = one_two_five(max_model_len)
        # scheduler state, after the last step
        self.running = gauge("vllm:num_requests_running", "Requests running (holding KV blocks).")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests queued for admission.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV cache usage: blocks in use / all blocks (1 = full); "
                                                          "cached prefixes no request holds count as free.")
        # counters
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens, counted when the prompt's first token "
                                                           "comes out (cached ones included).")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted (KV blocks freed, to recompute).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.success = Counter("vllm:request_success", "Requests finished, by finish reason.",
                               [*labels, "finished_reason"], registry=r)
        # per step, per output, per token
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Prompt tokens of the requests whose first "
                                          "token came in the step, plus the tokens the step generated.",
                                          ITERATION_TOKEN_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between a request's consecutive outputs.",
                             TOKEN_GAP_BUCKETS)
        # vLLM's former name of the same histogram (deprecated in vLLM 0.11), which older dashboards still read
        self.itl_former = histogram("vllm:time_per_output_token_seconds", "The same observations as "
                                    "vllm:inter_token_latency_seconds (vLLM's former name).", TOKEN_GAP_BUCKETS)
        # per finished request
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", "A request's decode time / (its tokens "
                              "- 1); 0 for a request of one token.", TOKEN_GAP_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.", REQUEST_TIME_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled (WAITING).",
                               REQUEST_TIME_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "First scheduled to first token.",
                                 REQUEST_TIME_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", "First token to last token.",
                                REQUEST_TIME_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds", "First scheduled to last token "
                                   "(RUNNING, preemptions included).", REQUEST_TIME_BUCKETS)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "A request's prompt tokens.", lengths)
        self.generation_len = histogram("vllm:request_generation_tokens", "A request's generated tokens.", lengths)
        # vLLM: the longest of a request's n sequences; minfer generates one (n=1), so its generated tokens
        self.max_generation_len = histogram("vllm:request_max_num_generation_tokens", "The most tokens any "
                                            "sequence of the request generated (n=1: its generated tokens).",
                                            lengths)
        self.max_tokens = histogram("vllm:request_params_max_tokens", "The request's max_tokens.", lengths)
        # speculative decoding, as vLLM counts it: drafts, guesses, guesses kept
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Requests' steps that verified guessed tokens.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Guessed tokens verified.")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Guessed tokens accepted.")
        # minfer's own
        self.steps = Counter("minfer_engine_steps", "Engine steps run.", ["model_name"], registry=r).labels(model)
        self.http_errors = Counter("minfer_http_errors", "Requests answered with an error, by HTTP status.",
                                   ["model_name", "status"], registry=r)

    def observe(self, engine: Any, outputs: list[RequestOutput]) -> None:
        """After a step: gauges from its ``StepTrace``; token counts and latencies from its outputs."""
        self.steps.inc()
        if engine.trace:
            t = engine.trace[-1]
            self.running.set(t.num_running)
            self.waiting.set(t.num_waiting)
            self.kv_usage.set(1 - t.num_free_blocks / t.num_blocks if t.num_blocks else 0.0)
            self.preemptions.inc(len(t.preempted))
            if t.draft_tokens:
                spec = SpecDecodeStats.of([t])
                self.spec_drafts.inc(spec.num_drafts)
                self.spec_draft_tokens.inc(spec.num_draft_tokens)
                self.spec_accepted_tokens.inc(spec.num_accepted_tokens)
        step_tokens = 0
        finished = [out for out in outputs if out.finished]
        for out in outputs:
            step_tokens += self._tokens(out)
        if outputs:
            self.iteration_tokens.observe(step_tokens)
        if finished:
            requests = _recently_finished(engine, {out.request_id for out in finished})
            for out in finished:
                self._finished(out, requests.get(out.request_id))

    def _tokens(self, out: RequestOutput) -> int:
        """One output's new tokens: the first (TTFT, the prompt counted) or the next (a gap). Returns the tokens
        it adds to the step's ``iteration_tokens``."""
        new = len(out.new_token_ids)
        if not new:
            return 0
        m = out.metrics
        self.generation_tokens.inc(new)
        if len(m.token_times) == new:  # its first tokens: the prompt is done
            prompt = len(out.prompt_token_ids)
            self.prompt_tokens.inc(prompt)
            self.prefix_queries.inc(prompt)
            self.prefix_hits.inc(m.num_cached_tokens)
            if m.ttft is not None:
                self.ttft.observe(m.ttft)
            return prompt + new
        gap = m.token_times[-1] - m.token_times[-1 - new]  # since the request's previous output
        self.itl.observe(gap)
        self.itl_former.observe(gap)
        return new

    def _finished(self, out: RequestOutput, request: Any) -> None:
        self.success.labels(self.model, ENGINE, str(out.outputs[0].finish_reason)).inc()
        m = out.metrics
        if not m.token_times or m.first_scheduled_time is None or m.first_token_time is None:
            return  # refused, timed out or aborted before its first token: no phases to time
        n = len(out.outputs[0].token_ids)
        last = m.token_times[-1]
        decode = last - m.first_token_time
        if m.e2e is not None:
            self.e2e.observe(m.e2e)
        self.queue.observe(m.first_scheduled_time - m.arrival_time)
        self.prefill.observe(m.first_token_time - m.first_scheduled_time)
        self.decode.observe(decode)
        self.inference.observe(last - m.first_scheduled_time)
        self.tpot.observe(decode / (n - 1) if n > 1 else 0.0)
        self.prompt_len.observe(len(out.prompt_token_ids))
        self.generation_len.observe(n)
        self.max_generation_len.observe(n)
        if request is not None and request.params.max_tokens:
            self.max_tokens.observe(request.params.max_tokens)

    def error(self, status: int) -> None:
        self.http_errors.labels(self.model, str(status)).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)


def _recently_finished(engine: Any, ids: set[str]) -> dict[str, Any]:
    """The ``Request`` objects of ``ids`` (for their ``max_tokens``): the engine appends each finished request to
    ``engine.finished`` as it reports it, so they are the last ones there (unless ``finished_window`` is
    smaller than one step's finishes)."""
    found: dict[str, Any] = {}
    for req in reversed(getattr(engine, "finished", ())):
        if req.request_id in ids:
            found[req.request_id] = req
            if len(found) == len(ids):
                break
    return found
