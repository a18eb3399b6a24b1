"""A Llama-family decoder that runs on a *flattened batch of tokens*.

Hugging Face models take a padded ``[batch, seq]`` rectangle. An inference engine cannot afford the
padding: one step mixes a 512-token prefill chunk of one request with single decode tokens of thirty
others. So this model takes one flat list of ``T`` tokens with an explicit position each, and leaves
"which tokens attend to which cached keys" to an ``Attention`` backend passed in per forward
(its contract is ``minfer/ops/attention.py``).
Everything else (norms, projections, MLP) is per token, so it does not care how tokens are grouped.

The backend is the seam where the KV cache plugs in: a contiguous cache (chapter 01), the paged
cache of chapter 03, or the Triton programs of chapter 07 -- the model never changes.

This file is the plain PyTorch model, written as the paper describes it, and nothing else. Faster stand-ins for
some of its modules are a separate layer (``minfer/accelerate.py``), swapped in once when an engine is built;
nothing here knows about them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minfer.model.config import ModelConfig
from minfer.ops.attention import Attention


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 whatever the weights' dtype (as Hugging Face does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # x / sqrt(mean(x^2) + eps), then the learned scale
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


class Linear(nn.Module):
    """``y = x @ W (+ b)`` with ``W`` stored ``[in, out]``, transposed from ``nn.Linear``'s ``[out, in]``.
    Which layout a CPU's BLAS multiplies faster depends on the CPU and the library; chapter 01 measures both
    on your machine. The results are the same up to rounding either way."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


def silu_mul(gate_up: Tensor) -> Tensor:
    """The MLP's gate: ``silu(gate) * up``, from the fused product's two halves."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class GateUp(Linear):
    """The first half of the gated MLP (SwiGLU): ``silu(x @ W_gate) * (x @ W_up)``, ``[rows, inter]``. The gate and
    up weights are fused in one ``[in, 2 * inter]`` matrix (gate's columns, then up's), so one product reads the
    activations once instead of twice."""

    def __init__(self, in_features: int, inter_features: int) -> None:
        super().__init__(in_features, 2 * inter_features)

    def forward(self, x: Tensor) -> Tensor:
        return silu_mul(super().forward(x))


class Embedding(nn.Module):
    """One ``[hidden]`` row per token id: ``nn.Embedding`` without its random initialisation. minfer's weights
    always come from a checkpoint or a seeded generator; the checkpoint loader builds the model on the meta
    device, where ``nn.Embedding``'s initialisation imports PyTorch's compiler (two seconds at every load)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, input_ids: Tensor) -> Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """Final hidden states → float32 logits over the vocabulary: ``h @ E.T``. ``E`` (``[vocab, hidden]``) is passed
    in: the model's own LM head matrix, or its input embedding when the two are tied (SmolLM2 ties them)."""

    def forward(self, hidden: Tensor, weight: Tensor) -> Tensor:
        return F.linear(hidden, weight).float()


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Rotary inverse frequencies, with Llama-3's long-context scaling when the config asks for it."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    s = cfg.rope_scaling
    if s:  # "llama3": stretch low frequencies, keep high ones, blend in between
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_len = s["original_max_position_embeddings"]
        wavelen = 2 * torch.pi / inv
        smooth = (old_len / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, looked up by each token's explicit position."""

    cos: Tensor
    sin: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        with torch.device("cpu"):  # real tables even when the model is built on the meta device (the loader
            pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float)  # does); they move with the model
            freqs = pos[:, None] * rope_inv_freq(cfg)[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)  # [max_pos, head_dim], same layout as Hugging Face
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by each token's angle: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class ApplyRotary(nn.Module):
    """Rotary position embedding applied to a layer's q and k heads (``apply_rotary``), as a module of its own so
    that another module can stand in for it (``minfer/accelerate.py``)."""

    def forward(self, qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return apply_rotary(qk, cos, sin)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        # q, k and v (and gate and up) are fused: one matmul reads the activations once instead of three times
        self.qkv_proj = Linear(cfg.hidden_size, sum(self.split), bias=cfg.attention_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.gate_up_proj = GateUp(cfg.hidden_size, cfg.intermediate_size)  # returns silu(gate) * up
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotate = ApplyRotary()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: Attention) -> Tensor:
        t, nh, nkv = x.shape[0], self.num_heads, self.num_kv_heads
        q_size, kv_size, _ = self.split
        qk, v = self.qkv_proj(self.input_layernorm(x)).split([q_size + kv_size, kv_size], dim=-1)
        qk = qk.view(t, nh + nkv, self.head_dim)  # the heads of q, then those of k
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: q and k heads normalized before rotary
            qk = torch.cat([self.q_norm(qk[:, :nh]), self.k_norm(qk[:, nh:])], dim=1)
        q, k = self.rotate(qk, cos, sin).split([nh, nkv], dim=1)  # q and k rotate in one pass
        attn = attention(self.index, q, k, v.view(t, nkv, self.head_dim))  # the only place requests' tokens meet
        x = x + self.o_proj(attn.reshape(t, -1))
        return x + self.down_proj(self.gate_up_proj(self.post_attention_layernorm(x)))  # the MLP


class LlamaModel(nn.Module):
    """Embedding → N decoder layers → final norm; ``compute_logits`` applies the LM head on demand."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)
        # the LM head keeps the embedding's [vocab, hidden] layout, so a tied head is the embedding itself
        self.lm_head = None if cfg.tie_word_embeddings else Embedding(cfg.vocab_size, cfg.hidden_size)
        self.logits = LMHead()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor, attention: Attention) -> Tensor:
        """``input_ids``, ``positions``: ``[T]`` → final hidden states ``[T, hidden]``."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attention)
        return self.norm(x)

    @property
    def lm_head_weight(self) -> Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Float32 logits for the rows given. The engine passes only rows it samples from: with a
        49k-word vocabulary, the LM head is the largest matmul, and a prefill chunk needs it once."""
        return self.logits(hidden, self.lm_head_weight)


def fuse_hf_state_dict(cfg: ModelConfig, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map Hugging Face parameter names onto minfer's: fuse q/k/v and gate/up, store matrices ``[in, out]``."""

    def cat_t(*names: str) -> Tensor:  # [out, in] pieces → one [in, sum(out)] matrix
        return torch.cat([sd[n] for n in names]).t().contiguous()

    out: dict[str, Tensor] = {"embed_tokens.weight": sd["model.embed_tokens.weight"],
                              "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        o = f"layers.{i}."
        out[o + "qkv_proj.weight"] = cat_t(*(a + f"{n}_proj.weight" for n in "qkv"))
        if cfg.attention_bias:
            out[o + "qkv_proj.bias"] = torch.cat([sd[a + f"{n}_proj.bias"] for n in "qkv"])
        if cfg.qk_norm:
            out[o + "q_norm.weight"] = sd[a + "q_norm.weight"]
            out[o + "k_norm.weight"] = sd[a + "k_norm.weight"]
        out[o + "o_proj.weight"] = cat_t(a + "o_proj.weight")
        out[o + "gate_up_proj.weight"] = cat_t(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        out[o + "down_proj.weight"] = cat_t(p + "mlp.down_proj.weight")
        out[o + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[o + "post_attention_layernorm.weight"] = sd[p + "post_attention_layernorm.weight"]
    return out
