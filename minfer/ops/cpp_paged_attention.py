"""Paged attention on the CPU with a compiled kernel for the decodes (``attention_backend="cpp"``).

Why a kernel at all on the CPU: a decode step is bound by memory traffic. The reference gathers each
request's K and V out of their scattered blocks into a padded copy, and SDPA then reads that copy: the
cache is crossed three times. ``csrc/paged_attention_cpu.cpp`` walks the block tables instead and reads
every key and value once, where it lies -- what the Triton kernel does on a GPU (chapter 07).

Prefill chunks still go through the reference: a chunk has hundreds of queries per request, so its
attention is a matrix product that SDPA's blocked kernel does well; the copy is small next to it.

The kernel is compiled by PyTorch's C++ extension loader on first use (about 30 s; it needs a C++
compiler, and OpenMP to use every core) and kept under minfer's cache folder, so later processes
load it in well under a second. It is the CPU's default (``attention_backend="auto"``) wherever it builds;
``available()`` says whether it does.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path

import torch
from torch import Tensor

from minfer.ops.attention import AttentionMetadata
from minfer.ops.backends import have_compiler
from minfer.ops.paged_attention import attend, step_groups
from minfer.paths import cache_root

SOURCE = Path(__file__).with_name("csrc") / "paged_attention_cpu.cpp"
NAME = "minfer_paged_attention_cpu"


def compiler_flags() -> list[str]:
    """Optimize for this very CPU (the build is per machine) and let OpenMP share the tasks among the cores.
    Apple's clang has no OpenMP: there the kernel builds, and runs on one core."""
    if os.name == "nt":
        return ["/O2", "/openmp"]
    flags = ["-O3"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")
    if sys.platform != "darwin":
        flags.append("-fopenmp")
    return flags


def build_folder() -> Path:
    """One folder per PyTorch installation and kernel source, under minfer's cache folder.

    Per installation: two environments with the same torch version compile against different header paths,
    and sharing a folder would make each rebuild (and overwrite) the other's module. Per source, by content
    and not by path: the build rule names the file it compiles, so two checkouts of the same kernel (a
    student copy beside the repository) would each rebuild the other's module if they compiled their own
    file; they compile the folder's copy instead, once. An edited kernel gets a folder of its own."""
    where = hashlib.sha1(str(Path(torch.__file__).resolve().parent).encode()).hexdigest()[:8]
    kernel_hash = hashlib.sha1(SOURCE.read_bytes()).hexdigest()[:8]
    build = cache_root() / "extensions" / f"torch-{torch.__version__}-{where}" / f"kernel-{kernel_hash}"
    build.mkdir(parents=True, exist_ok=True)
    return build


@functools.cache
def kernel():
    """The compiled extension module (built once per machine and PyTorch version, then loaded)."""
    from torch.utils.cpp_extension import load

    if not have_compiler():
        raise RuntimeError("attention_backend='cpp' compiles a C++ kernel, but no C++ compiler was found "
                           "(install g++ or clang, or set CXX); attention_backend='torch' needs none")
    build = build_folder()
    source = build / SOURCE.name
    if not source.exists():  # compiled from a copy in the folder: see build_folder
        partial = source.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(SOURCE.read_bytes())
        partial.replace(source)  # atomic: a process starting beside this one reads the whole file or none
    if not any(build.glob(f"{NAME}*.so")) and not any(build.glob(f"{NAME}*.pyd")):
        print(f"minfer: compiling the CPU paged-attention kernel into {build} (once, about 30 s)", file=sys.stderr)
    flags = compiler_flags()
    try:
        return load(NAME, [str(source)], extra_cflags=flags, build_directory=str(build),
                    extra_ldflags=["-fopenmp"] if "-fopenmp" in flags else [])  # MSVC links OpenMP by itself
    except Exception as e:  # the compiler's own log is above; say what to do instead
        raise RuntimeError(f"could not build the CPU paged-attention kernel ({e}); "
                           "attention_backend='torch' runs the same attention without compiling") from e


def cpp_paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Same contract as the reference ``paged_attention``: decodes by the kernel, prefill chunks by SDPA."""
    out = torch.empty_like(q)
    nd = meta.num_decodes  # the runner puts the one-token requests first
    if nd:
        kernel().decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                                  q.shape[-1] ** -0.5, out[:nd])
    attend(q, k_cache, v_cache, step_groups(meta, k_cache.shape[1], q.device, decodes=False), out)
    return out
