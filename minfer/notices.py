"""One line to the user, once per process.

When minfer makes a choice for the user that they may not expect -- ``"auto"`` skips a kernel that does not build
here, the fast engine keeps float32 on a CPU that has a faster dtype -- it says so, on stderr, in one line. Every
engine, model or layer built afterwards makes the same choice for the same reason: saying it again would only bury
the first line under copies of itself, so each distinct line is printed once per process.
"""

from __future__ import annotations

import functools
import sys


@functools.cache
def say_once(line: str) -> None:
    """Print ``line`` to stderr unless this process printed it already (tests reset it with ``cache_clear``)."""
    print(line, file=sys.stderr)
