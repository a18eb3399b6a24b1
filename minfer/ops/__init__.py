"""Paged-attention operations: the contract (``attention.py``), the PyTorch reference
(``paged_attention.py``), a compiled CPU kernel and Triton kernels, registered by name in ``backends.py``.

Every kernel has a reference of the same signature in ``paged_attention.py``; tests compare them.
"""

from minfer.ops.attention import Attention, AttentionBackend, AttentionMetadata, AttentionOps

__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "AttentionOps"]
