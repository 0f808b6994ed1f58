"""Stopping a child process the benches and test fixtures started (a server, a redis-server): shared by
bench/ and tests/ (both have bench/ on their import path), plain stdlib so the clients venv can use it."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(proc: subprocess.Popen[Any], grace_s: float, kill_wait_s: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL once `grace_s` passes without an exit (a server draining its sessions is given
    that long; one stuck must not hang the caller); its exit status (None: not reaped in `kill_wait_s`)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        return proc.wait(kill_wait_s)
    except subprocess.TimeoutExpired:
        return None
