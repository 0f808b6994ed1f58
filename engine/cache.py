"""voxgate's own cache directory: the one place the engines write (assembled models, tiny checkpoints, jieba's dict)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """`explicit`, else $VOXGATE_CACHE, else $XDG_CACHE_HOME/voxgate (~/.cache/voxgate); created."""
    if explicit is not None:
        base = Path(explicit)
    elif os.environ.get("VOXGATE_CACHE"):
        base = Path(os.environ["VOXGATE_CACHE"])
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = Path(xdg) / "voxgate"
    base.mkdir(parents=True, exist_ok=True)
    return base
