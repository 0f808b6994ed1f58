"""The engine's child process and the policy that restarts it: what the client (engine/process/client.py)
needs to start one, see it die, and wait before the next try."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.process import server, wire

# torch (and onnxruntime's thread pools) are not safe across fork: a child is a fresh interpreter.
_SPAWN = multiprocessing.get_context("spawn")


@dataclass
class Backoff:
    """Seconds to wait before restart n: `first`, doubling up to `cap`; back to `first` once a child has
    stayed warm for `stable_s` (a crash an hour later is not a crash loop)."""

    first: float = 0.5
    cap: float = 30.0
    stable_s: float = 30.0
    failures: int = 0

    def delay(self) -> float:
        return min(self.cap, self.first * 2 ** max(0, self.failures - 1))

    def died(self, warm_for_s: float | None) -> float:
        """A child died after `warm_for_s` warm (None: before it was warm); the wait before the next."""
        if warm_for_s is not None and warm_for_s >= self.stable_s:
            self.failures = 0
        self.failures += 1
        return self.delay()


@dataclass
class Child:
    """One incarnation: the process and the ipc address it connects back to."""

    spec: str
    options: dict[str, Any]
    address: str = field(init=False)
    process: Any = field(init=False, default=None)
    started_at: float = field(init=False, default=0.0)
    ready_at: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"voxgate-engine-{os.getpid()}-{uuid.uuid4().hex[:12]}.sock")
        self.address = f"ipc://{self.path}"

    def start(self) -> None:
        self.process = _SPAWN.Process(target=server.main, args=(self.spec, self.options, self.address, os.getpid()),
                                      name=f"voxgate-engine-{self.spec}", daemon=True)
        self.process.start()
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def exit_reason(self) -> str:
        """Why it ended, in words (it has ended: its sentinel fired)."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is None:
            return "the engine process stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the engine process (pid {self.pid}) was killed by {name}"
        if code == wire.EXIT_UNREADABLE:
            return f"the engine process (pid {self.pid}) could not read a command from the gateway and exited"
        return f"the engine process (pid {self.pid}) exited with status {code}"

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()

    def reap(self, timeout_s: float) -> None:
        """Wait for it to exit (at most `timeout_s`), then kill it; remove its socket file."""
        if self.process is not None:
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5.0)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
