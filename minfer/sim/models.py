"""Model specs for the simulator: a model's shape without its weights.

The cost model needs only the architecture -- layers, widths, heads, vocabulary -- so a spec is the very
``ModelConfig`` the real engine reads from a checkpoint's ``config.json``, with a name and a source.
From it follow the three quantities that drive serving: parameters (weight bytes read every step, FLOPs
per token), KV bytes per token (how many requests fit), and attention FLOPs per token of context.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    config: ModelConfig
    source: str = ""

    @property
    def num_parameters(self) -> int:
        return self.config.num_parameters

    @property
    def layer_matmul_parameters(self) -> int:
        """Weights of the matmuls every token goes through (q, k, v, o, gate, up, down), all layers."""
        c = self.config
        h, d = c.hidden_size, c.head_dim
        attention = h * d * (c.num_heads + 2 * c.num_kv_heads) + c.num_heads * d * h
        per_layer = attention + 3 * h * c.intermediate_size
        return c.num_layers * per_layer

    @property
    def lm_head_parameters(self) -> int:
        """The vocabulary projection, run only for tokens that sample."""
        return self.config.vocab_size * self.config.hidden_size

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V of one token in every layer: the unit of KV-cache memory and of decode traffic."""
        return self.config.kv_bytes_per_token(DTYPE_BYTES[dtype])

    def weight_bytes(self, dtype: str) -> int:
        return self.num_parameters * DTYPE_BYTES[dtype]


def _spec(name: str, source: str, **shape) -> ModelSpec:
    return ModelSpec(name, ModelConfig(**shape), source)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        # HuggingFaceTB/SmolLM2-135M-Instruct config.json (the model the course runs)
        _spec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct config.json", vocab_size=49152,
              hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
              head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True),
        # Qwen/Qwen3-0.6B config.json (tied embeddings, q/k RMSNorm)
        _spec("qwen3-0.6b", "Qwen/Qwen3-0.6B config.json", vocab_size=151936, hidden_size=1024,
              intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
              max_position_embeddings=40960, tie_word_embeddings=True, qk_norm=True,
              architecture="Qwen3ForCausalLM"),
        # meta-llama/Meta-Llama-3-8B config.json
        _spec("llama-3-8b", "meta-llama/Meta-Llama-3-8B config.json", vocab_size=128256, hidden_size=4096,
              intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
              max_position_embeddings=8192, tie_word_embeddings=False),
        # meta-llama/Meta-Llama-3-70B config.json
        _spec("llama-3-70b", "meta-llama/Meta-Llama-3-70B config.json", vocab_size=128256, hidden_size=8192,
              intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
              max_position_embeddings=8192, tie_word_embeddings=False),
    ]
}


def get_model_spec(spec: str | ModelSpec) -> ModelSpec:
    """A built-in spec by name (case-insensitive), or your own spec as is."""
    if isinstance(spec, ModelSpec):
        return spec
    name = str(spec).lower()
    if name not in MODELS:
        raise ValueError(f"unknown model spec {spec!r} for the simulator: known specs are "
                         f"{', '.join(MODELS)}, or pass a ModelSpec")
    return MODELS[name]
