"""Keep freed CPU memory for the next step instead of handing it back to the operating system.

Every forward pass allocates the same large activations and frees them moments later: a 512-token
prefill chunk's MLP output alone is 512 x 3,072 floats (6 MB). By default glibc's ``malloc`` serves
blocks that large with fresh ``mmap`` pages and gives them back on ``free`` (and trims the top of its heap
once enough is free), so the next step's tensors are new memory again: the kernel has to fault in and
zero every 4 KiB page before an operator can write it. On the README benchmark that is about 400,000 page
faults per run, and the elementwise operators of a prefill step (``mul``, ``silu``, ``add``) run several
times slower than on warm memory.

On a GPU, PyTorch's caching allocator keeps freed blocks for reuse; on the CPU it has none. CPU serving
stacks preload a caching ``malloc`` (tcmalloc or jemalloc; vLLM's CPU backend recommends it). Raising
glibc's own thresholds does the same in-process, with nothing to install: blocks up to
``mmap_threshold`` come from the heap, and up to ``trim_threshold`` of freed heap stays with the process.
The price is that the process keeps its peak activation memory (tens of MB here) instead of returning it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

# mallopt parameters, from glibc's <malloc.h>
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


@functools.cache
def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 512 << 20,
                      top_pad: int = 64 << 20) -> bool:
    """Tune glibc's ``malloc`` for this process (once; later calls return the first result). Returns
    whether it applied: False where the C library is not glibc (macOS, Windows, musl), which keep their
    own allocators' behaviour. 32 MiB is the largest mmap threshold glibc accepts on 64-bit machines;
    bigger allocations (the KV cache, made once) are still mapped directly, as they should be."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold), (M_TOP_PAD, top_pad))
    return all(mallopt(param, value) == 1 for param, value in settings)
