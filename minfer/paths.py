"""Where minfer keeps what it makes once and reuses: converted checkpoints and compiled kernels.

``$MINFER_CACHE`` if set, else ``$XDG_CACHE_HOME/minfer``, else ``~/.cache/minfer``. It lives at the
bottom of the package because both the model loader and the kernel builder write there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where converted checkpoints and compiled kernels live."""
    if env := os.environ.get("MINFER_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minfer"
