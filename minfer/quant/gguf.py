"""A GGUF file's own quantized blocks, as minfer's formats, under minfer's parameter names.

minfer loads a GGUF by converting it once to float32 (``minfer/model/loader.py``): the float32 weights are the
file's *exact* dequantization. ``weights="q4"`` wants the blocks themselves instead: the very scales, minimums and
4-bit values the file holds, multiplied as they are. This module reads them.

A GGUF stores a matrix ``[out, in]`` as rows of blocks, each row's ``in`` weights cut into blocks of 32:

* **Q4_1**, 20 bytes: scale ``d`` (float16), minimum ``m`` (float16), then 16 bytes of 4-bit values -- byte ``j``
  holds weight ``j`` of the block in its low four bits and weight ``j + 16`` in its high four; ``w = d * q + m``.
* **Q8_0**, 34 bytes: scale ``d`` (float16), then 32 signed bytes; ``w = d * q``.

SmolLM2's GGUF keeps every layer's matrices in Q4_1 and its token embedding (the tied LM head) in Q8_0. Two more
steps give minfer's layout: the rows of the query and key matrices are put back in Hugging Face's order (the GGUF
converter interleaves each head's two rotary halves; ``transformers`` undoes it the same way when it loads a GGUF),
and q/k/v and gate/up are fused along the output dimension and stored ``[in, out]`` -- exactly as
``minfer/model/llama.py``'s ``fuse_hf_state_dict`` does with the float32 weights.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from minfer.quant.formats import GROUP, Int8Weight, Q4Weight, QuantizedWeight

Q4_1_BYTES, Q8_0_BYTES = 20, 34  # bytes a block of 32 weights


class ModelShape(Protocol):
    """What the reader needs of a model's configuration (``minfer.model.config.ModelConfig`` has it; named here
    rather than imported, so that this package stays below the model's)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    tie_word_embeddings: bool


def q4_1_rows(raw: np.ndarray) -> Q4Weight:
    """A Q4_1 matrix's raw bytes (``[out, blocks * 20]``) as a ``Q4Weight``, still ``[out, in]`` (``q`` and the
    per-block numbers row by row; ``transpose`` gives minfer's ``[in, out]``)."""
    blocks = torch.from_numpy(np.array(raw)).view(raw.shape[0], -1, Q4_1_BYTES)
    d, m, qs = blocks[..., 0:2], blocks[..., 2:4], blocks[..., 4:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1)  # weights 0..15 of a block, then 16..31
    return Q4Weight(q.flatten(1), half(d), half(m), GROUP)


def q8_0_rows(raw: np.ndarray) -> Int8Weight:
    """A Q8_0 matrix's raw bytes (``[out, blocks * 34]``) as an ``Int8Weight``, still ``[out, in]``."""
    blocks = torch.from_numpy(np.array(raw)).view(raw.shape[0], -1, Q8_0_BYTES)
    return Int8Weight(blocks[..., 2:].contiguous().view(torch.int8).flatten(1), half(blocks[..., 0:2]), GROUP)


def half(two_bytes: Tensor) -> Tensor:
    """``[..., blocks, 2]`` bytes → ``[..., blocks]`` float16 (little-endian, as GGUF files are)."""
    return two_bytes.contiguous().view(torch.float16).squeeze(-1)


def map_rows(w: QuantizedWeight, order: Tensor) -> QuantizedWeight:
    """``w`` (still ``[out, in]``) with its output rows in ``order``."""
    if isinstance(w, Q4Weight):
        return Q4Weight(w.q[order], w.scales[order], w.mins[order], w.group)
    return Int8Weight(w.q[order], w.scales[order], w.group)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Matrices of one format stacked along the output dimension (q, k, v → qkv)."""
    if all(isinstance(p, Q4Weight) for p in parts):
        q4 = [p for p in parts if isinstance(p, Q4Weight)]
        return Q4Weight(torch.cat([p.q for p in q4]), torch.cat([p.scales for p in q4]),
                        torch.cat([p.mins for p in q4]), GROUP)
    if all(isinstance(p, Int8Weight) for p in parts):
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]), GROUP)
    raise ValueError("fused matrices must share one format")


def transpose(w: QuantizedWeight) -> QuantizedWeight:
    """``[out, in]`` rows of blocks → minfer's ``[in, out]`` (values ``[in, out]``, per-group numbers
    ``[groups, out]``)."""
    if isinstance(w, Q4Weight):
        return Q4Weight(w.q.t().contiguous(), w.scales.t().contiguous(), w.mins.t().contiguous(), w.group)
    return Int8Weight(w.q.t().contiguous(), w.scales.t().contiguous(), w.group)


def unpermute_order(rows: int, heads: int) -> Tensor:
    """The row order that undoes the GGUF converter's rotary interleave of a query or key matrix: within each head,
    rows ``(pair, half)`` go back to ``(half, pair)`` (``transformers``' ``_reverse_permute_weights``)."""
    dim = rows // heads // 2
    return torch.arange(rows).view(heads, dim, 2).transpose(1, 2).flatten()


# ---- the file ---------------------------------------------------------------------------------------------------
# A GGUF file: "GGUF", a version, the tensor and metadata counts; the metadata (key, type, value); each tensor's
# name, shape, type and offset; then the tensors' bytes, aligned. Only the tensors' places and one metadata value
# (the architecture) matter here, so the metadata -- mostly the tokenizer's 49,152 words -- is stepped over, not
# decoded (``gguf.GGUFReader`` decodes it all: seconds, for nothing).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}  # GGML type ids (the ones minfer names)
BLOCK_BYTES = {"Q4_1": Q4_1_BYTES, "Q8_0": Q8_0_BYTES}


class Cursor:
    """Reads little-endian values front to back."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def read(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.read("<Q")
        self.at += n
        return bytes(self.data[self.at - n:self.at]).decode()

    def value(self, kind: int) -> Any:
        """A metadata value of type ``kind`` (an array's items are stepped over: None)."""
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            return self.read(SCALARS[kind])
        item, count = self.read("<I"), self.read("<Q")
        if item in SCALARS:
            self.at += count * struct.calcsize(SCALARS[item])
        else:
            for _ in range(count):
                self.value(item)
        return None


def quantized_tensors(path: Path) -> tuple[str, dict[str, tuple[str, np.ndarray]]]:
    """The architecture a GGUF file names, and its Q4_1 and Q8_0 tensors: name -> (type, raw bytes
    ``[rows, blocks * block bytes]``), read from the file in place (a memory map)."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    c = Cursor(memoryview(raw.data))
    if bytes(raw[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    c.at = 4
    _version, n_tensors, n_meta = c.read("<I"), c.read("<Q"), c.read("<Q")
    meta = {}
    for _ in range(n_meta):
        key = c.string()
        meta[key] = c.value(c.read("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        shape = [c.read("<Q") for _ in range(c.read("<I"))]  # innermost first: [in, out]
        infos.append((name, shape, TYPES.get(c.read("<I"), "other"), c.read("<Q")))
    align = meta.get("general.alignment") or 32
    start = -(-c.at // align) * align
    tensors = {}
    for name, shape, kind, offset in infos:
        if kind in BLOCK_BYTES and len(shape) == 2:
            row = shape[0] // GROUP * BLOCK_BYTES[kind]
            at = start + offset
            tensors[name] = (kind, raw[at:at + row * shape[1]].reshape(shape[1], row))
    return str(meta.get("general.architecture")), tensors


def read_blocks(path: Path, cfg: ModelShape) -> dict[str, QuantizedWeight]:
    """The Q4_1 and Q8_0 matrices of the GGUF at ``path`` as minfer's weights, keyed by minfer's parameter names
    (``layers.3.qkv_proj.weight``, ``embed_tokens.weight``, ...), each ``[in, out]``. Matrices in other formats are
    left out (the speed-up layer quantizes those itself); so is every matrix of a file that is not a Llama."""
    architecture, tensors = quantized_tensors(path)
    if architecture != "llama":
        return {}
    raw = {name: (q4_1_rows if kind == "Q4_1" else q8_0_rows)(data) for name, (kind, data) in tensors.items()}

    def rows(name: str, heads: int | None = None) -> QuantizedWeight | None:
        w = raw.get(name)
        if w is None or heads is None:
            return w
        return map_rows(w, unpermute_order(w.q.shape[0], heads))

    out: dict[str, QuantizedWeight] = {}

    def put(name: str, parts: list[QuantizedWeight | None]) -> None:
        if all(p is not None for p in parts):
            try:
                out[name] = transpose(concat_rows([p for p in parts if p is not None]))
            except ValueError:  # q, k and v stored in different formats: quantized by the speed-up layer
                pass

    put("embed_tokens.weight", [rows("token_embd.weight")])
    if not cfg.tie_word_embeddings:
        put("lm_head.weight", [rows("output.weight")])
    for i in range(cfg.num_layers):
        b, o = f"blk.{i}.", f"layers.{i}."
        put(o + "qkv_proj.weight", [rows(b + "attn_q.weight", cfg.num_heads), rows(b + "attn_k.weight",
                                    cfg.num_kv_heads), rows(b + "attn_v.weight")])
        put(o + "o_proj.weight", [rows(b + "attn_output.weight")])
        put(o + "gate_up_proj.weight", [rows(b + "ffn_gate.weight"), rows(b + "ffn_up.weight")])
        put(o + "down_proj.weight", [rows(b + "ffn_down.weight")])
    return out
