"""The CPU voices' cache directory is voxgate's own (engine/cache.py)."""

from engine.cache import cache_dir

__all__ = ["cache_dir"]
