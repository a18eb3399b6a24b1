"""``GET /metrics``: what a long-running server keeps instead of every request -- counters and histograms.

Prometheus scrapes this text every few seconds and keeps the history itself; the server holds only a few
numbers per metric, however long it runs (the engine keeps a bounded window of recent requests and steps,
``EngineConfig.finished_window``/``trace_window``). The figures come from the same records as everywhere
else in minfer: the gauges from the last ``StepTrace``, the latencies from each finished request's
``RequestMetrics`` (on the engine's clock, which the serving loop keeps on the wall clock).

Each app has its own registry, so several servers (tests, a notebook) can live in one process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minfer.metrics import SpecDecodeStats
from minfer.request import RequestOutput

# seconds; wide enough for a laptop CPU (TTFT of seconds under load) and a GPU (ITL of milliseconds)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                   2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """The Prometheus metrics of one server; ``observe`` is a step hook of the ``EngineLoop``."""

    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()
        self.model = model
        # every metric carries the served model's name (as vLLM's do); bound once here
        gauge = lambda name, doc: Gauge(name, doc, ["model_name"], registry=r).labels(model)
        counter = lambda name, doc: Counter(name, doc, ["model_name"], registry=r).labels(model)
        histogram = lambda name, doc: Histogram(name, doc, ["model_name"], buckets=LATENCY_BUCKETS,
                                                registry=r).labels(model)
        self.running = gauge("minfer_num_requests_running", "Requests running (holding KV blocks).")
        self.waiting = gauge("minfer_num_requests_waiting", "Requests queued for admission.")
        self.blocks_used = gauge("minfer_kv_blocks_used", "KV cache blocks in use.")
        self.blocks_free = gauge("minfer_kv_blocks_free", "KV cache blocks free (cached prefixes included).")
        self.preemptions = counter("minfer_preemptions", "Requests preempted (KV blocks freed, to recompute).")
        self.steps = counter("minfer_engine_steps", "Engine steps run.")
        self.prompt_tokens = counter("minfer_prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("minfer_generation_tokens", "Tokens generated.")
        self.ttft = histogram("minfer_time_to_first_token_seconds", "Arrival to first token (engine clock).")
        self.itl = histogram("minfer_inter_token_latency_seconds", "Gap between consecutive tokens of a request.")
        self.e2e = histogram("minfer_e2e_request_latency_seconds", "Arrival to finish (engine clock).")
        # speculative decoding, under vLLM's names (so its dashboards read them): drafts, guesses, guesses kept
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Requests' steps that verified guessed tokens.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Guessed tokens verified.")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Guessed tokens accepted.")
        self.finished = Counter("minfer_requests_finished", "Requests finished, by finish reason.",
                                ["model_name", "finish_reason"], registry=r)
        self.http_errors = Counter("minfer_http_errors", "Requests answered with an error, by HTTP status.",
                                   ["model_name", "status"], registry=r)

    def observe(self, engine: Any, outputs: list[RequestOutput]) -> None:
        """After a step: gauges from its ``StepTrace``, counters and latencies from its outputs."""
        self.steps.inc()
        if engine.trace:
            t = engine.trace[-1]
            self.running.set(t.num_running)
            self.waiting.set(t.num_waiting)
            self.blocks_used.set(t.num_blocks - t.num_free_blocks)
            self.blocks_free.set(t.num_free_blocks)
            self.preemptions.inc(len(t.preempted))
            if t.draft_tokens:
                spec = SpecDecodeStats.of([t])
                self.spec_drafts.inc(spec.num_drafts)
                self.spec_draft_tokens.inc(spec.num_draft_tokens)
                self.spec_accepted_tokens.inc(spec.num_accepted_tokens)
        for out in outputs:
            self.generation_tokens.inc(len(out.new_token_ids))
            if not out.finished:
                continue
            self.finished.labels(self.model, str(out.outputs[0].finish_reason)).inc()
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            rm = out.metrics
            if rm.ttft is not None:
                self.ttft.observe(rm.ttft)
            for gap in rm.itl:
                self.itl.observe(gap)
            if rm.e2e is not None:
                self.e2e.observe(rm.e2e)

    def error(self, status: int) -> None:
        self.http_errors.labels(self.model, str(status)).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
