"""The ecosystem's load generators drive minfer's server (``minfer.loadtools``): ``vllm bench serve`` and GuideLLM, each
run as its documented command for a few requests against a server in this process, and minfer's own ``--endpoint``
client beside them.

vLLM and GuideLLM live in environments of their own (``make load-tools``: ``.venv-peers``, ``.venv-guidellm``); where
one is absent its test is skipped, saying how to install it -- or fails, under ``MINFER_REQUIRE_LOAD_TOOLS=1``
(``make test-load-tools``, which CI runs after ``make test``: both tools install from the registry in about 3
minutes). minfer's own client always runs. Each tool's row must show what the server itself counted: every request
served, with the workload's prompt and output lengths -- so a tool that sent something else (other lengths, fewer
requests, an error the tool swallowed) fails here.
"""

from __future__ import annotations

import pytest
from test_serve import make_engine, one_thread  # noqa: F401  (one_thread: test_serve's autouse fixture, here too)

from conftest import skip_unless_required
from minfer import EngineConfig, LLMEngine
from minfer.loadtools import MISSING, Row, Setup, Shape, default_tokenizer, find_guidellm, find_vllm, run_all, table
from minfer.serve import ServerThread

pytestmark = [pytest.mark.needs_exercise("E3.1", "E4.1", "E5.1", "E6.1", "E8.1"), pytest.mark.long]

SHAPE = Shape(requests=4, rate=4.0, prompt_len=24, output_len=6, seed=0)


def absent(tool: str) -> None:
    """Skip a test whose tool is not installed, saying how to install it; fail instead where CI requires the tools."""
    skip_unless_required(f"{tool} is absent -- {MISSING[tool]}", "MINFER_REQUIRE_LOAD_TOOLS")


def base(server: ServerThread) -> str:
    return server.url.removesuffix("/v1")


def assert_served_as_asked(row: Row, shape: Shape = SHAPE) -> None:
    """The tool reports every request and figures that make sense, and the server saw the workload's shape."""
    assert row.error is None, row.error
    assert row.ok_requests == row.served_requests == shape.requests, row
    assert row.served_prompt_tokens == shape.prompt_len and row.served_output_tokens == shape.output_len, row
    assert row.ttft_p50 is not None and row.itl_p50 is not None and row.ttft_p99 is not None
    assert 0 < row.ttft_p50 <= row.ttft_p99 < 60 and 0 < row.itl_p50 < 10, row


@pytest.fixture(scope="module")
def tiny_server(tiny):
    with ServerThread(make_engine(tiny)) as s:
        yield s


@pytest.fixture(scope="module")
def real_server(smollm2):
    """SmolLM2 served under its alias, so the tools' prompts (cut to length by its tokenizer) are the lengths the
    server counts."""
    model, tok = smollm2
    engine = LLMEngine(EngineConfig(model="smollm2-135m", num_blocks=256, max_num_seqs=16), model=model, tokenizer=tok)
    with ServerThread(engine) as s:
        yield s


def test_minfer_client_row_and_what_the_server_counted(tiny_server, tmp_path):
    """minfer's own client, run as ``python -m minfer.bench --endpoint ... --workload workload.jsonl``: the workload
    file holds the shape exactly, and the table shows the row."""
    rows = run_all(base(tiny_server), "tiny-random", SHAPE, tmp_path, Setup(), tools=["minfer"], warmup=1)
    assert [r.tool for r in rows] == ["minfer"]
    assert rows[0].command[1:4] == ["-m", "minfer.bench", "--endpoint"]
    assert_served_as_asked(rows[0])
    assert "| minfer | 4 / 4 | 24.0 / 6.0 |" in table(rows, SHAPE)


def test_a_tool_that_is_absent_gets_a_row_that_says_so_and_no_number(tmp_path):
    rows = run_all("http://127.0.0.1:9", "m", SHAPE, tmp_path, Setup(), tools=["vllm", "guidellm"], warmup=0)
    assert [(r.tool, r.error) for r in rows] == [("vllm", MISSING["vllm"]), ("guidellm", MISSING["guidellm"])]
    assert all(r.ttft_p50 is None and r.itl_p50 is None and r.ok_requests is None for r in rows)
    assert "not installed: make load-tools" in table(rows, SHAPE)


def test_shape_is_validated_and_its_workload_is_exact():
    items = SHAPE.workload()
    assert len(items) == 4 and {(w.prompt_len, w.output_len) for w in items} == {(24, 6)}
    assert all(a.arrival_time < b.arrival_time for a, b in zip(items, items[1:]))
    with pytest.raises(ValueError, match="rate > 0"):
        Shape(rate=0)


@pytest.mark.slow
def test_vllm_bench_serve_drives_minfer_serve(request, tmp_path):
    prefix = find_vllm()
    if prefix is None:  # before the server is built: a skip costs nothing
        absent("vllm")
    rows = run_all(base(request.getfixturevalue("real_server")), "smollm2-135m", SHAPE, tmp_path,
                   Setup(vllm=prefix, tokenizer=default_tokenizer("smollm2-135m")), tools=["vllm"], warmup=0)
    assert rows[0].command[len(prefix):len(prefix) + 2] == ["--backend", "openai"]
    assert_served_as_asked(rows[0])


@pytest.mark.slow
def test_guidellm_drives_minfer_serve(request, tmp_path):
    prefix = find_guidellm()
    if prefix is None:
        absent("guidellm")
    rows = run_all(base(request.getfixturevalue("real_server")), "smollm2-135m", SHAPE, tmp_path,
                   Setup(guidellm=prefix, tokenizer=default_tokenizer("smollm2-135m")), tools=["guidellm"], warmup=0)
    assert rows[0].command[:3] == prefix and rows[0].command[3] == "run"
    assert_served_as_asked(rows[0])


# GuideLLM's end-of-run race (minfer.loadtools), lost every time: the callback that sets shutdown_event for the last
# request's update returns only after the main loop's 0.1 s poll has timed out, so that loop leaves before the update
# is buffered. GuideLLM alone then reports 3 of 4 requests; GUIDELLM_RUN must hand the fourth on.
LAST_UPDATE_LATE = """\
import time
from guidellm.scheduler.worker_group import WorkerGroupState

received_callback = WorkerGroupState.received_callback

def late_once_shut_down(self, update):
    out = received_callback(self, update)
    if self.shutdown_event.is_set():
        time.sleep(0.5)
    return out

WorkerGroupState.received_callback = late_once_shut_down
"""


@pytest.mark.slow
def test_guidellm_reports_the_last_request_when_its_run_ends_before_that_update_is_buffered(request, tmp_path):
    prefix = find_guidellm()
    if prefix is None:
        absent("guidellm")
    python, flag, run = prefix
    rows = run_all(base(request.getfixturevalue("real_server")), "smollm2-135m", SHAPE, tmp_path,
                   Setup(guidellm=[python, flag, LAST_UPDATE_LATE + run], tokenizer=default_tokenizer("smollm2-135m")),
                   tools=["guidellm"], warmup=0)
    assert_served_as_asked(rows[0])
