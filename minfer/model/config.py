"""The shape of a Llama-family decoder, read from a Hugging Face ``config.json``.

One dataclass covers SmolLM2/Llama, Qwen2 (biases on q/k/v) and Qwen3 (RMSNorm on q and k):
the three differ only in these switches, so one model class serves all of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # only Llama-3 style ("llama3") scaling is supported
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before rotary
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V of one token in every layer: the unit of KV-cache memory (a block holds ``block_size`` of
        them) and of a decode's attention traffic. The real cache and the simulator both price it here."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    @property
    def num_parameters(self) -> int:
        """Parameter count, counting a tied embedding once."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        if self.attention_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * h * i + 2 * h + (2 * d if self.qk_norm else 0)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face config dict (transformers 4.x or 5.x layout)."""
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}: minfer runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {rope_type!r}: minfer supports 'default' and 'llama3'")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            rope_theta=rope_theta,
            rope_scaling=dict(rope) if rope_type == "llama3" else None,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            architecture=arch,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The inverse of ``from_hf_dict``, so a tiny random model can be saved as a real HF checkpoint."""
        d = asdict(self)
        out = {
            "architectures": [self.architecture],
            "model_type": {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                           "Qwen3ForCausalLM": "qwen3"}[self.architecture],
            "vocab_size": d["vocab_size"],
            "hidden_size": d["hidden_size"],
            "intermediate_size": d["intermediate_size"],
            "num_hidden_layers": d["num_layers"],
            "num_attention_heads": d["num_heads"],
            "num_key_value_heads": d["num_kv_heads"],
            "head_dim": d["head_dim"],
            "max_position_embeddings": d["max_position_embeddings"],
            "rope_theta": d["rope_theta"],
            "rms_norm_eps": d["rms_norm_eps"],
            "tie_word_embeddings": d["tie_word_embeddings"],
            "attention_bias": d["attention_bias"],
            "hidden_act": "silu",
        }
        if self.eos_token_ids:
            out["eos_token_id"] = list(self.eos_token_ids)
        return out
