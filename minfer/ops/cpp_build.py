"""Compiling minfer's C++ CPU kernels: one extension module per source file, built once per machine.

PyTorch's C++ extension loader compiles a source on first use (about 30 s; it needs a C++ compiler, and OpenMP
to use every core) into a folder under minfer's cache, so later processes load the module in well under a
second. Three sources use it: ``csrc/paged_attention_cpu.cpp`` (decode attention, ``cpp_paged_attention.py``),
``csrc/pointwise_cpu.cpp`` (RMSNorm, rotary, SiLU-and-mul, ``pointwise.py``), both of which include
``csrc/vector_math.h`` (sums in vector lanes, a vectorizable ``exp``), and ``csrc/linear_cpu.cpp`` (the matrix
products, ``linear.py``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from minfer.paths import cache_root


def have_compiler() -> bool:
    """Whether a C++ compiler is on the PATH (``$CXX``, else ``c++``); on Windows the loader finds MSVC."""
    import shutil

    return os.name == "nt" or shutil.which(os.environ.get("CXX", "c++")) is not None


def compiler_flags() -> list[str]:
    """Optimize for this very CPU (the build is per machine) and let OpenMP share the tasks among the cores.
    Apple's clang has no OpenMP: there the kernels build, and run on one core.

    On x86 the compiler is also told to prefer AVX-512's full 16-float vectors where the CPU has them: for a loop
    it vectorizes by itself, GCC otherwise picks 8-float (AVX2-width) vectors on most AVX-512 CPUs, a choice made
    for Intel chips of 2017 that slowed down under 512-bit instructions. The decode-attention kernel ran 1.9x as fast
    in float32 with it (1.35x in bfloat16) on a Xeon with AMX; a CPU without AVX-512 ignores it."""
    if os.name == "nt":
        return ["/O2", "/openmp"]
    flags = ["-O3"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags += ["-march=native", "-mprefer-vector-width=512"]
    if sys.platform != "darwin":
        flags.append("-fopenmp")
    return flags


def build_folder(source: Path) -> Path:
    """One folder per PyTorch installation and kernel source, under minfer's cache folder.

    Per installation: two environments with the same torch version compile against different header paths,
    and sharing a folder would make each rebuild (and overwrite) the other's module. Per source, by content
    and not by path: the build rule names the file it compiles, so two checkouts of the same kernel (a
    student copy beside the repository) would each rebuild the other's module if they compiled their own
    file; they compile the folder's copy instead, once. The headers beside the source (``csrc/*.h``, shared by
    the kernels) are copied with it and count in its content, as do the compiler's flags. An edited kernel or
    header, or new flags, get a folder of their own."""
    where = hashlib.sha1(str(Path(torch.__file__).resolve().parent).encode()).hexdigest()[:8]
    files = {source.name: source.read_bytes()} | {h.name: h.read_bytes() for h in sorted(source.parent.glob("*.h"))}
    content = hashlib.sha1(" ".join(compiler_flags()).encode())  # new flags: a new build, not last one's module
    for name, text in files.items():
        content.update(name.encode() + b"\0" + text)
    build = (cache_root() / "extensions" / f"torch-{torch.__version__}-{where}"
             / f"{source.stem}-{content.hexdigest()[:8]}")
    build.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():  # compiled from copies in the folder (see above)
        copy = build / name
        if not copy.exists():
            partial = copy.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(text)
            partial.replace(copy)  # atomic: a process starting beside this one reads the whole file or none
    return build


def load_extension(name: str, source: Path, what: str, instead: str) -> ModuleType:
    """The module compiled from ``source`` (built once per machine and PyTorch version, then loaded); ``what``
    names it in messages, e.g. "the CPU paged-attention kernel", and ``instead`` says what runs without it, e.g.
    "attention_backend='torch' runs the same attention without compiling". Callers keep the module
    (``functools.cache``)."""
    try:
        return _load(name, source, what)
    except RuntimeError as e:
        raise RuntimeError(f"{e}; {instead}") from e


def build_problem(kernels: Callable[[], object]) -> str | None:
    """Why ``kernels()`` (a module's cached loader, which builds on first use) fails here -- its error, which says
    what runs instead -- or None when it loads. The backends' ``"auto"`` asks this before choosing a kernel."""
    try:
        kernels()
    except RuntimeError as e:
        return str(e)
    return None


STALE_LOCK_SECONDS = 600  # a build takes about 30 s, a few minutes on a loaded machine: a lock this old is orphaned


def clear_stale_lock(build: Path, what: str) -> None:
    """PyTorch's loader holds a ``lock`` file in the build folder while it compiles, and every other process waits
    for it to go -- forever, without a word. A build that was killed (Ctrl+C, a timeout) leaves it behind, and every
    later process then hangs. A lock older than any build is removed, with a notice."""
    lock = build / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        print(f"minfer: removing a lock left {age / 60:.0f} minutes ago by an interrupted build of {what} ({lock})",
              file=sys.stderr)
        lock.unlink(missing_ok=True)
    else:  # another process is building it (or was killed doing so): say why this one waits
        print(f"minfer: waiting for another process's build of {what} ({lock}, {age:.0f} s old; one older than "
              f"{STALE_LOCK_SECONDS // 60} minutes is taken for an interrupted build and removed)", file=sys.stderr)


def _load(name: str, source: Path, what: str) -> ModuleType:
    from torch.utils.cpp_extension import load

    if not have_compiler():
        raise RuntimeError(f"{what} is C++ compiled on first use, but no C++ compiler was found "
                           "(install g++ or clang, or set CXX)")
    build = build_folder(source)
    clear_stale_lock(build, what)
    if not any(build.glob(f"{name}*.so")) and not any(build.glob(f"{name}*.pyd")):
        print(f"minfer: compiling {what} into {build} (once, about 30 s)", file=sys.stderr)
    flags = compiler_flags()
    try:
        return load(name, [str(build / source.name)], extra_cflags=flags, build_directory=str(build),
                    extra_ldflags=["-fopenmp"] if "-fopenmp" in flags else [])  # MSVC links OpenMP by itself
    except Exception as e:  # the compiler's own log is above
        raise RuntimeError(f"could not build {what} ({e})") from e
