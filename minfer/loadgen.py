"""The load client: replay a minfer workload against any OpenAI-compatible server, and measure what a client sees.

    python -m minfer.bench --endpoint http://127.0.0.1:8000/v1 --workload poisson --rate 2 -n 50

Every ``WorkItem`` becomes one streaming request, sent at its ``arrival_time`` after the start (an *open*
loop: a request is sent on time whether or not earlier ones have finished, as real users do). The prompt is
the very token ids the in-process benchmark would submit (``workload.token_prompts``), with ``max_tokens =
output_len`` and ``ignore_eos`` (honoured by minfer, vLLM and SGLang), so the same workload means the same
work on every server.

The client keeps, per request, its own clock readings: when the request was sent, when each streamed event
carrying tokens arrived, when the stream ended. From them come the same figures as in-process
(``minfer.metrics.summarize`` reads a ``ClientRecord`` as it reads a ``Request``): TTFT, ITL, e2e,
throughput, goodput under SLOs -- but now they include everything between the user and the engine: the
network, HTTP parsing, the wait for the engine's step boundary, detokenization, the event stream.
An HTTP error or a broken stream is kept as a request with its own finish reason (``"http 429"``, ``"error"``).

Pointing it at vLLM (or SGLang): start ``vllm serve MODEL`` and pass its base URL and model name --
``--endpoint http://HOST:8000/v1 --model MODEL --vocab-size N`` (prompt ids are drawn below ``N``; minfer's
server reports its vocabulary in ``/v1/models``, other servers do not, and 32,000 is safe for common models).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from minfer.metrics import SLO, Summary, summarize
from minfer.request import RequestMetrics
from minfer.workload import SIM_VOCAB_SIZE, WorkItem, token_prompts

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls count silver stars in the cold "
         "night sky above an old stone bridge").split()


@dataclass(slots=True)
class ClientRecord:
    """One request as the client saw it; read by ``summarize`` like a ``Request`` (times on the client clock)."""

    index: int  # the work item
    num_prompt_tokens: int
    metrics: RequestMetrics
    finish_reason: str | None = None  # the server's, or "http NNN" / "error" when no answer came
    num_output_tokens: int = 0
    request_id: str | None = None  # the server's id for the request ("cmpl-7")
    error: str | None = None


def request_body(item: WorkItem, prompt: str | list[int], model: str | None, api: str) -> dict:
    body: dict = {"max_tokens": item.output_len, "temperature": 0.0, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    if item.priority:
        body["priority"] = item.priority
    if item.tenant is not None:
        body["user"] = item.tenant
    if api == "chat":
        text = prompt if isinstance(prompt, str) else " ".join(WORDS[t % len(WORDS)] for t in prompt)
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = prompt
    return body


async def send(client: httpx.AsyncClient, url: str, body: dict, record: ClientRecord) -> ClientRecord:
    """POST one streaming request and fill ``record`` as events arrive."""
    m = record.metrics
    m.arrival_time = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                record.finish_reason, record.error = f"http {r.status_code}", text[:500]
                return record
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                now = time.perf_counter()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    record.finish_reason, record.error = "error", json.dumps(event["error"])[:500]
                    continue
                record.request_id = record.request_id or event.get("id")
                if event.get("usage"):
                    record.num_output_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    delta = choice.get("delta", {})
                    if "text" in choice or "content" in delta:  # a role-only chat event carries no token
                        if m.first_token_time is None:
                            m.first_token_time = now
                        m.token_times.append(now)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
            m.finished_time = time.perf_counter()
            if record.finish_reason is None:
                record.finish_reason, record.error = "error", "the stream ended without a finish reason"
            if not record.num_output_tokens:  # a server without usage events: one token per event
                record.num_output_tokens = len(m.token_times)
    except (httpx.HTTPError, OSError, ValueError) as e:  # refused, reset, timed out, or not JSON
        record.finish_reason, record.error = "error", f"{type(e).__name__}: {e}"
    return record


async def replay(endpoint: str, workload: Sequence[WorkItem], model: str | None = None, api: str = "completions",
                 vocab_size: int | None = None, seed: int = 0, timeout: float = 600.0,
                 progress: bool = False) -> list[ClientRecord]:
    """Send every item at its arrival time; returns a record per item, in workload order.

    ``model``: the served model name (default: the first of ``/v1/models``). ``vocab_size``: prompt ids are
    drawn below it (default: what ``/v1/models`` reports, else 32,000)."""
    if api not in ("completions", "chat"):
        raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
    base = endpoint.rstrip("/")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), limits=limits) as client:
        if model is None or vocab_size is None:
            listed = (await client.get(f"{base}/models")).raise_for_status().json()["data"]
            if not listed:
                raise ValueError(f"{base}/models lists no model")
            entry = next((d for d in listed if d["id"] == model), listed[0])
            model = model or entry["id"]
            vocab_size = vocab_size or entry.get("vocab_size") or SIM_VOCAB_SIZE
        prompts = token_prompts(workload, vocab_size, seed)
        url = f"{base}/{'chat/completions' if api == 'chat' else 'completions'}"
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(workload), desc=f"requests to {base}", unit="req")

        async def one(i: int, item: WorkItem, start: float) -> ClientRecord:
            await asyncio.sleep(max(0.0, start + item.arrival_time - time.perf_counter()))
            n = len(prompts[i]) if isinstance(prompts[i], list) else item.prompt_len
            record = await send(client, url, request_body(item, prompts[i], model, api),
                                ClientRecord(i, n, RequestMetrics(arrival_time=0.0)))
            if bar is not None:
                bar.update(1)
            return record

        start = time.perf_counter()
        try:
            return list(await asyncio.gather(*(one(i, w, start) for i, w in enumerate(workload))))
        finally:
            if bar is not None:
                bar.close()


def run_endpoint(endpoint: str, workload: Sequence[WorkItem], slo: SLO | None = None,
                 **options: object) -> tuple[Summary, list[ClientRecord]]:
    """``replay`` from synchronous code (its own event loop); the summary is over every request."""
    records = asyncio.run(replay(endpoint, workload, **options))  # type: ignore[arg-type]
    return summarize(records, slo), records  # type: ignore[arg-type]


def endpoint_runner(endpoint: str, slo: SLO | None = None, **options: object):  # -> bench.Runner
    """A benchmark system (``minfer.bench``) that sends the workload to ``endpoint``; the summary's
    ``extra`` counts the requests that got no answer (``errors``)."""

    def run(workload: list[WorkItem]) -> Summary:
        summary, records = run_endpoint(endpoint, workload, slo, **options)
        summary.extra["errors"] = sum(r.error is not None for r in records)
        return summary

    return run
