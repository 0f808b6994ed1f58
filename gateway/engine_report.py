"""What a model holds and does, as the admin plane and /metrics report it, asked of each engine through
two optional methods and read cheaply (no engine call waits for its work):

- `engine.memory() -> dict[str, int | None]`: bytes it knows of itself — `torch_allocated_bytes`,
  `cuda_allocated_bytes`, `cuda_reserved_bytes`, `weights_bytes`, `kv_bytes`, `slot_bytes` (an engine
  in a child process reports its own process's numbers, and its `pid`);
- `engine.telemetry() -> dict[str, float]`: its own measures — `cycle_seconds` (the last cycle's time),
  `batch_size`, `queue_depth`, `slots_in_use`, `slots_total`, `restarts`.

An engine lacking one gets the defaults here: the process it runs in (`engine.pid`, else this one), that
process's resident memory from /proc, CUDA memory when torch is loaded and a GPU is there, and
`Capacity` (engine/types.py) as its telemetry.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger("voxgate.models")

TELEMETRY_KEYS = ("cycle_seconds", "batch_size", "queue_depth", "slots_in_use", "slots_total", "restarts")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (one small /proc read); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _cuda() -> dict[str, int | None]:
    torch = sys.modules.get("torch")  # never imported here: a CPU-voices gateway has no torch
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"cuda_allocated_bytes": None, "cuda_reserved_bytes": None}
    return {"cuda_allocated_bytes": int(torch.cuda.memory_allocated()),
            "cuda_reserved_bytes": int(torch.cuda.memory_reserved())}  # fmt: skip


def engine_pid(engine: Any) -> int:
    """The process the engine runs in: its own (a child) or the gateway's."""
    pid = getattr(engine, "pid", None)
    return pid if isinstance(pid, int) and pid > 0 else os.getpid()


def _asked(engine: Any, method: str) -> dict[str, Any]:
    probe = getattr(engine, method, None)
    if probe is None:
        return {}
    try:
        found = probe()
    except Exception:  # a report must not fail with one engine's numbers
        log.exception("engine.%s() failed", method)
        return {}
    return dict(found) if isinstance(found, dict) else {}


def memory(engine: Any) -> dict[str, Any]:
    """The engine's memory report: the defaults, overridden by what the engine says of itself."""
    pid = engine_pid(engine)
    report: dict[str, Any] = {"pid": pid, "rss_bytes": rss_bytes(pid), "shared_process": pid == os.getpid(),
                              "torch_allocated_bytes": None, "weights_bytes": None, "kv_bytes": None,
                              "slot_bytes": None, **_cuda()}  # fmt: skip
    report.update(_asked(engine, "memory"))
    return report


def telemetry(engine: Any) -> dict[str, float]:
    """The engine's own measures (TELEMETRY_KEYS, numbers only), with capacity's where it says none."""
    found = {k: float(v) for k, v in _asked(engine, "telemetry").items()
             if k in TELEMETRY_KEYS and isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
    probe = getattr(engine, "capacity", None)
    try:
        capacity = None if probe is None else probe()
    except Exception:
        capacity = None
    if capacity is not None:
        found.setdefault("slots_in_use", float(capacity.active))
    restarts = getattr(engine, "restarts", None)  # an engine process's supervisor counts them
    if isinstance(restarts, int) and not isinstance(restarts, bool):
        found.setdefault("restarts", float(restarts))
    return found
