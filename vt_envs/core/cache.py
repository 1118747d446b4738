"""Where VT keeps what it builds once (databases, indexes, tasks, models)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["vt_cache_root"]


def vt_cache_root() -> Path:
    """``$VT_CACHE_DIR``, or ``~/.cache/vt_envs`` when it is unset or empty; each
    domain keeps its builds in a subdirectory of it."""
    return Path(os.environ.get("VT_CACHE_DIR") or Path.home() / ".cache" / "vt_envs")
