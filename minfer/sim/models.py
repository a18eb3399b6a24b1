"""Model specs for the simulator: a model's shape without its weights.

The cost model needs only the architecture -- layers, widths, heads, vocabulary -- so a spec is the very
``ModelConfig`` the real engine reads from a checkpoint's ``config.json``, with a name and a source.
From it follow the three quantities that drive serving: parameters (weight bytes read every step, FLOPs
per token), KV bytes per token (how many requests fit), and attention FLOPs per token of context.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minfer.model.config import ModelConfig

# float8: FP8 (e4m3) weights and KV cache, as TensorRT-LLM and vLLM run "FP8" models on Hopper and Ada GPUs
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}


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

    @property
    def activation_bytes_per_token(self) -> int:
        """One pass over a token's activations in every layer -- its hidden vector and its MLP's intermediate
        vector, in 16 bits (FP8 models too keep activations in 16 bits between kernels): the unit of the
        elementwise work (norms, rotary, activation function, residual adds) that the matrix products leave."""
        c = self.config
        return c.num_layers * (c.hidden_size + c.intermediate_size) * 2

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V of one token in every layer: the unit of KV-cache memory and of decode traffic."""
        return self.config.kv_bytes_per_token(DTYPE_BYTES[dtype])

    def weight_bytes(self, dtype: str) -> int:
        return self.num_parameters * DTYPE_BYTES[dtype]


def _spec(name: str, source: str, **shape) -> ModelSpec:
    return ModelSpec(name, ModelConfig(**shape), source)


# meta-llama/Meta-Llama-3-8B config.json
LLAMA_3_8B = _spec("llama-3-8b", "meta-llama/Meta-Llama-3-8B config.json", vocab_size=128256, hidden_size=4096,
                   intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                   max_position_embeddings=8192, tie_word_embeddings=False)

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
        LLAMA_3_8B,
        # meta-llama/Llama-3.1-8B config.json: Llama-3-8B's shape with a 128k context (rope scaling "llama3")
        ModelSpec("llama-3.1-8b", replace(LLAMA_3_8B.config, max_position_embeddings=131072),
                  "meta-llama/Llama-3.1-8B config.json"),
        # mistralai/Mistral-7B-v0.1 config.json (its 4,096-token sliding window is not modelled: the
        # simulator's attention sees the whole context, exact up to 4,096 tokens)
        _spec("mistral-7b", "mistralai/Mistral-7B-v0.1 config.json", vocab_size=32000, hidden_size=4096,
              intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
              max_position_embeddings=32768, tie_word_embeddings=False),
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
