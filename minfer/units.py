"""The engine counts in tokens, blocks and bytes; these are the two conversions between them.

``ceil_div`` is how many blocks (or pages, or rows) hold a number of items when the last one may be
partly filled -- the arithmetic behind every block table. ``parse_bytes`` reads a memory budget the way a
user writes it (``"512MiB"``, ``"2 GB"``, ``1e9``).
"""

from __future__ import annotations

import re


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``, in integers: the blocks of size ``b`` that hold ``a`` items."""
    return -(-a // b)


def parse_bytes(value: int | float | str) -> int:
    """``"512MiB"``, ``"2 GB"``, ``1e9`` → bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"kv_cache_memory must be a number of bytes or a size such as '512MiB', got {value!r}")
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", value, re.IGNORECASE)
    if not m:
        raise ValueError(f"kv_cache_memory: cannot read {value!r} as a size (examples: '512MiB', '2GB')")
    num, unit, binary = float(m[1]), m[2].upper(), m[3]
    base = 1024 if binary or not unit else 1000
    return int(num * base ** " KMGT".index(unit or " "))
