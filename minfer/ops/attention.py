"""The attention contract: what a model layer asks of the KV cache, and what one step tells the kernels.

Attention is the only place where the tokens of one request meet: every other operation of the model
works on each token on its own. So the model takes an :class:`Attention` callable per forward pass and
never knows how keys are stored -- a contiguous cache (chapter 01), paged blocks (chapter 03), a Triton
kernel (chapter 07). A *backend* is the pair of functions that implement paged attention:

* ``store_kv(k, v, k_cache, v_cache, slot_mapping)``: write each new token's key and value into its slot;
* ``paged_attention(q, k_cache, v_cache, meta)``: each query's output over its own request's cached keys,
  read through the request's block table.

Both read the step's :class:`AttentionMetadata`, built once per step by the ``ModelRunner``. A backend is
described by an :class:`AttentionBackend` record -- where its two functions live, and what it can do -- and
registered by name in ``minfer.ops.backends``; every one is tested against the PyTorch reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from minfer.types import DeviceType


class Attention(Protocol):
    """What a layer needs from the KV cache for one forward pass.

    ``q``: ``[T, num_heads, head_dim]``; ``k``, ``v``: ``[T, num_kv_heads, head_dim]`` for the step's new
    tokens (rotary already applied). The backend stores ``k``/``v`` in layer ``layer``'s cache, then returns
    each query's attention output ``[T, num_heads, head_dim]`` over its own request's cached tokens.
    """

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


@dataclass(slots=True)
class AttentionMetadata:
    """Where one step's tokens come from and where their keys go; built by the ModelRunner."""

    slot_mapping: Tensor  # [T] cache slot of each new token
    query_start_loc: Tensor  # [B+1] offsets of each request's tokens in the flat batch
    seq_lens: Tensor  # [B] tokens of each request in the cache after this step (context + new)
    block_tables: Tensor  # [B, max_blocks] int32, padded with 0 (padding is masked by seq_lens)
    num_decodes: int  # the first num_decodes requests decode: one new token each, the one sampled last step
    max_query_len: int
    max_seq_len: int
    memo: dict[str, Any] = field(default_factory=dict)  # what a backend derives once per step, not per layer


StoreKV = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
PagedAttention = Callable[[Tensor, Tensor, Tensor, AttentionMetadata], Tensor]


@dataclass(frozen=True, slots=True)
class AttentionBackend:
    """A backend's record. Capabilities are fields, so no code ever asks "is this the Triton kernel?": CUDA
    graphs ask ``graph_safe``, the engine asks ``devices``, ``attention_backend="auto"`` asks ``auto_on``."""

    name: str
    store_kv: str  # "module:function", imported only when an engine chooses the backend
    attend: str  # "module:function": its paged_attention
    devices: tuple[DeviceType, ...]  # where it runs
    auto_on: tuple[DeviceType, ...] = ()  # where attention_backend="auto" picks it (the first such in the registry)
    graph_safe: bool = False  # reads every length on the device, never on the host: a CUDA graph can capture it
    needs_compiler: bool = False  # builds native code on the user's machine when first loaded
    cpu_interpreter: bool = False  # on the CPU it runs only through Triton's interpreter
    prepare: str | None = None  # "module:function" run when an engine loads it (e.g. compile a kernel now)
    summary: str = ""


@dataclass(frozen=True, slots=True)
class AttentionOps:
    """A loaded backend: its record and its two functions, as the KV cache calls them."""

    backend: AttentionBackend
    store_kv: StoreKV
    paged_attention: PagedAttention
