"""The server as the vLLM ecosystem meets it: ``/metrics`` under vLLM's names, agreeing with the engine's own
records; the shipped Grafana dashboard, every expression of which must resolve; vLLM's extra endpoints
(``/v1/models/{id}``, ``/tokenize``, ``/detokenize``, ``/version``); 405 answers; the ``model`` field's rule; an
aborted stream's last events; a second Ctrl+C.

One short load on the tiny random model (module fixture ``loaded``) serves the metric tests: concurrent
requests sharing a prefix, on a pool small enough that some are preempted.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_serve import make_engine, one_thread, wait_until_up  # noqa: F401  (one_thread: test_serve's autouse fixture, here too)

import minfer
from minfer import LLMEngine
from minfer.serve import ServerThread
from minfer.serve.prometheus import TTFT_BUCKETS, one_two_five
from minfer.serve.scrape import (
    Scrape,
    bucket_increase,
    histogram_quantile,
    over_time,
    promql_labels,
    promql_metrics,
    rate,
)

pytestmark = pytest.mark.needs_exercise("E3.1", "E4.1", "E5.1", "E6.1", "E8.1")
DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana" / "minfer.json"
GREEDY = dict(temperature=0, ignore_eos=True)

# issue 39's list: name → type (counters are served with _total)
REQUIRED = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter", "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:iteration_tokens_total": "histogram", "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram", "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram", "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram", "vllm:request_params_max_tokens": "histogram",
}




def base(server: ServerThread) -> str:
    return server.url.removesuffix("/v1")


class Loaded:
    """What one short load left: the engine's records, the scrape after it, and what a hook saw on the way."""

    def __init__(self, server: ServerThread, engine: LLMEngine, max_tokens: list[int]) -> None:
        self.server, self.engine, self.max_tokens = server, engine, max_tokens
        self.steps_with_outputs = 0
        self.gauges_off: list[tuple] = []  # steps whose gauges did not read the step's own StepTrace
        self.ahead = {"ttft": 0.0, "prompt": 0.0}  # observed at the first token, before the request finishes
        self.gauge_peaks = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0,
                            "vllm:kv_cache_usage_perc": 0.0}
        self.scrape: Scrape

    def hook(self, engine, outputs) -> None:  # after the metrics' own hook: what a scrape would read now
        self.steps_with_outputs += bool(outputs)
        now = Scrape.parse(self.server.server.config.app.state.metrics.text().decode())
        for name in self.gauge_peaks:
            self.gauge_peaks[name] = max(self.gauge_peaks[name], now.value(name))
        t = engine.trace[-1]
        read = (now.value("vllm:num_requests_running"), now.value("vllm:num_requests_waiting"),
                now.value("vllm:kv_cache_usage_perc"))
        if read != (t.num_running, t.num_waiting, 1 - t.num_free_blocks / t.num_blocks):
            self.gauges_off.append((t.step, read))
        finished = now.value("vllm:request_success_total")
        self.ahead["ttft"] = max(self.ahead["ttft"], now.value("vllm:time_to_first_token_seconds_count") - finished)
        self.ahead["prompt"] = max(self.ahead["prompt"], now.value("vllm:prompt_tokens_total")
                                   - now.value("vllm:request_prompt_tokens_sum"))


@pytest.fixture(scope="module")
def loaded(tiny):
    # 30 blocks of 16 tokens for 16 requests of ~70 + ~40 tokens: some wait, some are preempted; a 17th stops
    # at its first token (any token is a stop token), well before its max_tokens
    engine = make_engine(tiny, num_blocks=30, max_num_seqs=16, enable_prefix_caching=True)
    prefix = "a prefix every request shares, two blocks long at least!! "
    max_tokens = [20 + 3 * i for i in range(17)]
    with ServerThread(engine) as server:
        record = Loaded(server, engine, max_tokens)
        server.loop.step_hooks.append(record.hook)

        async def load() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                return await asyncio.gather(*(client.post("/completions", json={
                    "prompt": f"{prefix}request {i}", "max_tokens": n, **GREEDY,
                    **({"stop_token_ids": list(range(320))} if i == 16 else {})}) for i, n in enumerate(max_tokens)))

        answers = asyncio.run(load())
        assert [r.status_code for r in answers] == [200] * 17
        deadline = time.monotonic() + 10
        while engine.has_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        record.scrape = Scrape.get(base(server) + "/metrics")
        yield record
    assert server.loop.errors == []


# ---- /metrics ----------------------------------------------------------------------------------------------
def test_every_metric_of_the_issue_is_served_with_vllms_type_and_labels(loaded):
    s = loaded.scrape
    for name, kind in REQUIRED.items():
        assert s.types.get(name) == kind, (name, s.types.get(name))
        sample = {"counter": name + "_total", "histogram": name + "_count", "gauge": name}[kind]
        assert sample in s.names, sample
        assert {"model_name", "engine"} <= s.labels(sample), (sample, s.labels(sample))
        assert s.value(sample, model_name="tiny-random") == s.value(sample)
    assert "finished_reason" in s.labels("vllm:request_success_total")
    assert not any(n.startswith("minfer_") for n in s.names - {"minfer_engine_steps_total",
                                                               "minfer_engine_steps_created"}), \
        "minfer's own names only where vLLM has no equivalent"


def test_every_metric_moves_under_load(loaded):
    s = loaded.scrape
    for name, kind in REQUIRED.items():
        if kind == "gauge":
            assert loaded.gauge_peaks[name] > 0, name
        else:
            assert s.value(name + ("_total" if kind == "counter" else "_count")) > 0, name
    assert loaded.gauge_peaks["vllm:kv_cache_usage_perc"] <= 1


def test_the_served_numbers_agree_with_the_engines_records(loaded):
    """Counts equal; sums of seconds equal to rounding (the same float values, added in another order)."""
    s, engine = loaded.scrape, loaded.engine
    done = list(engine.finished)
    ms = [r.metrics for r in done]
    assert len(done) == 17 and sorted(r.finish_reason for r in done) == ["length"] * 16 + ["stop"]
    assert s.value("vllm:request_success_total", finished_reason="length") == 16
    assert s.value("vllm:request_success_total", finished_reason="stop") == 1
    assert s.value("vllm:request_success_total") == 17
    # counted at a request's first token, not at its end: a dashboard sees a long answer's TTFT while it streams
    assert loaded.ahead["ttft"] > 0 and loaded.ahead["prompt"] > 0

    prompt = sum(r.num_prompt_tokens for r in done)
    generated = sum(r.num_output_tokens for r in done)
    assert s.value("vllm:prompt_tokens_total") == prompt == s.value("vllm:request_prompt_tokens_sum")
    assert s.value("vllm:generation_tokens_total") == generated == s.value("vllm:request_generation_tokens_sum")
    assert s.value("vllm:request_max_num_generation_tokens_sum") == generated
    assert s.value("vllm:request_params_max_tokens_sum") == sum(loaded.max_tokens) > generated
    assert s.value("vllm:prefix_cache_queries_total") == prompt
    hits = sum(m.num_cached_tokens for m in ms)
    assert s.value("vllm:prefix_cache_hits_total") == hits > 0, "the shared prefix was found in the cache"
    preempted = sum(len(t.preempted) for t in engine.trace)
    assert s.value("vllm:num_preemptions_total") == preempted == sum(m.num_preemptions for m in ms) > 0

    # per step: the prompts whose first token came in it, plus its generated tokens
    assert s.value("vllm:iteration_tokens_total_count") == loaded.steps_with_outputs
    assert s.value("vllm:iteration_tokens_total_sum") == prompt + generated
    assert s.value("minfer_engine_steps_total") == len(engine.trace)

    def agree(name: str, values: list[float]) -> None:
        assert s.value(name + "_count") == len(values), name
        assert math.isclose(s.value(name + "_sum"), sum(values), rel_tol=1e-9, abs_tol=1e-9), name

    agree("vllm:time_to_first_token_seconds", [m.ttft for m in ms])
    gaps = [x for m in ms for x in m.itl]  # no speculative decoding: one token per output
    agree("vllm:inter_token_latency_seconds", gaps)
    agree("vllm:time_per_output_token_seconds", gaps)
    agree("vllm:request_time_per_output_token_seconds", [m.tpot or 0.0 for m in ms])  # 0 for one token
    agree("vllm:e2e_request_latency_seconds", [m.e2e for m in ms])
    agree("vllm:request_queue_time_seconds", [m.queue_time for m in ms])
    agree("vllm:request_prefill_time_seconds", [m.first_token_time - m.first_scheduled_time for m in ms])
    agree("vllm:request_decode_time_seconds", [m.token_times[-1] - m.first_token_time for m in ms])
    agree("vllm:request_inference_time_seconds", [m.token_times[-1] - m.first_scheduled_time for m in ms])

    # the buckets are vLLM's, cumulative, each counting the observations <= its bound
    assert s.buckets("vllm:time_to_first_token_seconds") == \
        [(le, sum(m.ttft <= le for m in ms)) for le in TTFT_BUCKETS] + [(math.inf, 17)]
    lengths = [r.num_prompt_tokens for r in done]
    assert s.buckets("vllm:request_prompt_tokens") == \
        [(le, sum(x <= le for x in lengths)) for le in one_two_five(engine.max_model_len)] + [(math.inf, 17)]

    assert loaded.gauges_off == [], "after every step the gauges read that step's StepTrace"


def test_one_two_five_and_histogram_quantile():
    assert one_two_five(100) == [1, 2, 5, 10, 20, 50, 100] and one_two_five(2048)[-1] == 2000
    # PromQL: linear inside the bucket holding the rank; the first bucket starts at 0; +Inf gives the last bound
    buckets = [(1.0, 2.0), (2.0, 6.0), (4.0, 8.0), (math.inf, 10.0)]
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.5)
    assert histogram_quantile(0.4, buckets) == pytest.approx(1.5)
    assert histogram_quantile(0.7, buckets) == pytest.approx(3.0)
    assert histogram_quantile(0.99, buckets) == 4.0
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))


def test_rate_and_quantile_over_time_from_scrapes():
    """A panel's line from scrapes, as PromQL computes it over a range: counter growth per second within the
    window; the quantile of the buckets' growth."""
    def scrape(t: float, tokens: float, fast: float, slow: float) -> Scrape:
        return Scrape.parse(f"""# TYPE gen counter
gen_total{{model_name="m"}} {tokens}
# TYPE ttft histogram
ttft_bucket{{le="0.1"}} {fast}
ttft_bucket{{le="1.0"}} {fast + slow}
ttft_bucket{{le="+Inf"}} {fast + slow}
ttft_sum 0
ttft_count {fast + slow}
""", at=t)

    scrapes = [scrape(0.0, 0, 0, 0), scrape(0.5, 10, 4, 0), scrape(1.0, 30, 4, 4), scrape(1.5, 30, 4, 4)]
    t, v = over_time(scrapes, lambda a, b: rate(a, b, "gen_total", model_name="m"), window=1.0)
    assert t == [0.5, 1.0, 1.5] and v == [20.0, 30.0, 20.0]  # (10-0)/0.5, (30-0)/1, (30-10)/1
    t, v = over_time(scrapes, lambda a, b: histogram_quantile(0.5, bucket_increase(a, b, "ttft")), window=0.5)
    assert v[0] == pytest.approx(0.05) and v[1] == pytest.approx(0.55) and math.isnan(v[2])


# ---- the Grafana dashboard --------------------------------------------------------------------------------
def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL ``expr`` of every panel, and the template variables' queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard.get("templating", {}).get("list", ()):
        q = var.get("query")
        if isinstance(q, dict):
            exprs.append(q["query"])
    return exprs


def unresolved(exprs: list[str], scrape: Scrape) -> list[str]:
    """What the expressions read that the scrape does not serve: metric names, and labels a metric lacks;
    ``_bucket``/``_sum``/``_count`` only on histograms. ``label_values(metric, label)`` is Grafana's, not PromQL."""
    problems = []
    for expr in exprs:
        m = re.fullmatch(r"\s*label_values\(\s*([^,\s]+)\s*,\s*(\w+)\s*\)\s*", expr)
        metrics, labels = ({m[1]}, {m[2]}) if m else (promql_metrics(expr), promql_labels(expr))
        for name in metrics:
            if name not in scrape.names:
                problems.append(f"{name} is not served ({expr!r})")
                continue
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            if family != name and scrape.types.get(family) != "histogram":
                problems.append(f"{name}: {family} is not a histogram")
            missing = labels - scrape.labels(name)
            if missing:
                problems.append(f"{name} has no label {sorted(missing)} ({expr!r})")
    return problems


def test_every_dashboard_expression_resolves(loaded):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_queries(dashboard)
    assert len(dashboard["panels"]) >= 13 and len(exprs) > 30
    assert unresolved(exprs, loaded.scrape) == []
    read = set().union(*(promql_metrics(e) for e in exprs))
    for name in REQUIRED:  # the dashboard shows every metric of the issue but vLLM's former name
        if name != "vllm:time_per_output_token_seconds":
            assert any(r.startswith(name) for r in read), name


@pytest.mark.parametrize("wrong", [
    'rate(vllm:e2e_request_latency_second_sum{model_name="$model_name"}[$__rate_interval])',  # a typo
    'histogram_quantile(0.5, sum by(le) (rate(vllm:num_requests_running_bucket[5m])))',  # a gauge's buckets
    'sum by(finish_reason) (increase(vllm:request_success_total[5m]))',  # vLLM's label is finished_reason
    'rate(vllm:prompt_tokens{model_name="$model_name"}[5m])',  # a counter without _total
    'minfer_kv_blocks_used{model_name="x"}',  # a name minfer served before issue 39
    'label_values(vllm:num_requests_running, model)',
])
def test_the_dashboard_check_rejects_a_wrong_expression(loaded, wrong):
    assert unresolved([wrong], loaded.scrape)


# ---- endpoints -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aliased(tiny):
    with ServerThread(make_engine(tiny), served_model=["tiny-random", "tiny-alias"]) as server:
        yield server
        assert server.loop.errors == []


def test_models_by_id_and_the_model_field_rule(aliased):
    url = aliased.url
    with httpx.Client(base_url=url, timeout=60) as http:
        assert [m["id"] for m in http.get("/models").json()["data"]] == ["tiny-random", "tiny-alias"]
        card = http.get("/models/tiny-alias").json()
        assert card["id"] == "tiny-alias" and card["object"] == "model" and card["root"] == "tiny-random"
        r = http.get("/models/gpt-4")
        assert r.status_code == 404
        assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                      "param": "model", "code": "model_not_found"}}
        # vLLM's rule: no model (or "") means the first served name; a served name is echoed; others are 404
        body = {"prompt": "hi", "max_tokens": 2}
        assert http.post("/completions", json=body).json()["model"] == "tiny-random"
        assert http.post("/completions", json={**body, "model": ""}).json()["model"] == "tiny-random"
        assert http.post("/completions", json={**body, "model": "tiny-alias"}).json()["model"] == "tiny-alias"
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        with http.stream("POST", "/chat/completions", json={**chat, "model": "tiny-alias"}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert events and {e["model"] for e in events} == {"tiny-alias"}
        r = http.post("/completions", json={**body, "model": "tiny"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_models_and_model_rule_with_the_openai_client(aliased):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=aliased.url, api_key="unused", max_retries=0)
    assert client.models.retrieve("tiny-alias").id == "tiny-alias"
    assert [m.id for m in client.models.list()] == ["tiny-random", "tiny-alias"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and e.value.body["type"] == "invalid_request_error"
    answer = client.completions.create(model="tiny-alias", prompt="hi", max_tokens=2)
    assert answer.model == "tiny-alias"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)


def test_tokenize_and_detokenize(aliased, tiny):
    tok = tiny[1]
    with httpx.Client(base_url=base(aliased), timeout=60) as http:
        r = http.post("/tokenize", json={"model": "tiny-alias", "prompt": "héllo"}).json()
        assert r == {"count": len(tok.encode("héllo")), "max_model_len": 2048, "tokens": tok.encode("héllo"),
                     "token_strs": None}
        strs = http.post("/tokenize", json={"prompt": "ab", "return_token_strs": True}).json()["token_strs"]
        assert strs == ["a", "b"]
        messages = [{"role": "user", "content": "hi"}]
        r = http.post("/tokenize", json={"messages": messages}).json()
        assert r["tokens"] == tok.apply_chat_template(messages) and r["count"] == len(r["tokens"])
        assert http.post("/detokenize", json={"tokens": tok.encode("héllo")}).json() == {"prompt": "héllo"}
        for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                                  ("/tokenize", {"messages": []}, "messages"),
                                  ("/detokenize", {"tokens": [1, 99999]}, "tokens"),
                                  ("/detokenize", {"tokens": "hi"}, "tokens")]:
            r = http.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
        r = http.post("/tokenize", json={"model": "gpt-4", "prompt": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_version_health_and_wrong_methods(aliased):
    with httpx.Client(base_url=base(aliased), timeout=60) as http:
        assert http.get("/version").json() == {"version": minfer.__version__}
        assert http.get("/health").status_code == 200
        for method, path, allow in [("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                    ("POST", "/v1/models", "GET"), ("GET", "/tokenize", "POST"),
                                    ("POST", "/metrics", "GET"), ("DELETE", "/health", "GET")]:
            r = http.request(method, path)
            assert r.status_code == 405, (method, path)
            assert set(r.headers["allow"].replace(" ", "").split(",")) >= {allow}, r.headers
            assert r.json()["error"]["type"] == "invalid_request_error", r.json()


# ---- streams and shutdown --------------------------------------------------------------------------------------
def test_an_aborted_stream_ends_with_one_finish_event_and_done(tiny):
    """One event per output that carried tokens, then one event with finish_reason "abort" (its held-back text, if
    any), then [DONE]: no empty event in between, none after."""
    engine = make_engine(tiny)
    with ServerThread(engine) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for endpoint, body in [("/completions", {"prompt": "hi"}),
                               ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]:
            lines = []
            with http.stream("POST", endpoint, json={**body, "max_tokens": 1000, "stream": True, **GREEDY}) as r:
                rid = r.headers["x-request-id"]
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        if len(lines) == 5:
                            server.loop.abort(rid)
            assert lines[-1] == "[DONE]"
            events = [json.loads(x)["choices"][0] for x in lines[:-1]]
            reasons = [e["finish_reason"] for e in events]
            assert reasons == [None] * (len(events) - 1) + ["abort"]
            request = next(r for r in engine.finished if r.request_id == rid)
            assert len(events) == request.num_output_tokens + 1, "one event per token, and the finish event"
        assert server.loop.errors == []


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_ctrl_c_exits_at_once_with_130():
    """The first Ctrl+C drains (here: a stream of 2,040 tokens, given 60 s); the second ends the process within
    seconds, exit status 130, no traceback."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minfer.serve", "--model", "tiny-random", "--port", str(port),
                             "--threads", "1", "--num-blocks", "256", "--shutdown-timeout", "60",
                             "--no-access-log"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(proc, url)
        with httpx.Client(timeout=60) as http, http.stream(
                "POST", f"{url}/v1/completions",
                json={"prompt": "hi", "max_tokens": 2040, "stream": True, **GREEDY}) as r:
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: ")
                if n == 3:
                    proc.send_signal(signal.SIGINT)
                    time.sleep(0.3)
                    assert proc.poll() is None, "the first Ctrl+C drains: the stream goes on"
                    t0 = time.monotonic()
                    proc.send_signal(signal.SIGINT)
                    rc = proc.wait(timeout=15)
                    took = time.monotonic() - t0
                    break
        out = proc.stdout.read()
        assert rc == 130, out
        assert took < 10 and "Traceback" not in out and "second Ctrl+C" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
