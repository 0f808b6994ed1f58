"""What a CPU stream (engine/cpu/stream.py) stands on, apart from the stream itself: its lock, which
publishes the stream's snapshot each time it is let go (`StreamLock`), and the protocol of what it asks
the engine that opened it (`StreamHost`, engine/cpu/engine.py's `CpuEngine`). Kept apart so the stream
module holds the stream's mechanism only, and the engine and the stream are typed against this, not
each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from engine.cpu.espeak import Pinned
from engine.cpu.jobs import Piece, Voice
from engine.cpu.policy import CpuPolicyConfig
from engine.cpu.pool import UrgencyPool


class StreamLock(threading.Condition):
    """A stream's lock (a condition) that publishes the stream's snapshot each time it is let go: every
    change of a stream's state is made under its lock, so the snapshot is never older than the last
    change, with no call to remember at each one.

    Its `bell` is what the stream's driver sleeps on (until its plan's `wake_at`): rung by every
    `notify_all` (the stream's own state changed), by the other streams of its listener (`CpuStream.nudge`:
    theirs changed) and by the pool while the stream's first audio is held (`UrgencyPool.watch`). An
    event, not the lock: ringing it takes no stream's lock."""

    def __init__(self, publish: Callable[[], None]) -> None:
        super().__init__()
        self._publish = publish
        self.bell = threading.Event()

    def notify_all(self) -> None:
        super().notify_all()
        self.bell.set()

    def __exit__(self, *exc: object) -> None:
        try:
            self._publish()
        finally:
            super().__exit__(*exc)


class StreamHost(Protocol):
    """What a stream asks of the engine that opened it (engine/cpu/engine.py's `CpuEngine` is one): the
    stream is typed by this, not by the engine, so the two modules read apart (no import back up)."""

    workers: int  # pieces a stream may have in flight (its look-ahead)
    max_pending_chars: int  # text a stream may hold not yet cut into pieces
    queue_size: int  # AudioChunks its bridge holds for its consumer
    config: CpuPolicyConfig
    pool: UrgencyPool  # the worker pool every stream shares
    clock: Callable[[], float]  # monotonic seconds: the pool's, the policy's and every stream's now

    def cut_pieces(self, chosen: Voice | None, lang: str, index: int, text: str) -> Iterator[Piece]:
        """Segment `index` as bounded pieces, lazily."""
        ...

    def rtf(self, backend: str) -> float:
        """The backend's measured real-time factor."""
        ...

    def hold_error(self, backend: str) -> float:
        """How much longer than predicted the first-audio hold takes a run of `backend` to be."""
        ...

    def hold_errors(self) -> dict[str, float]:
        """`hold_error` of every backend loaded."""
        ...

    def synthesise(self, voice: Voice, lang: str, text: str, speed: float, cancelled: threading.Event,
                   run_options: Any, pinned: Pinned | None = None) -> Iterator[Any]:
        """(audio, rate, words) per model run of one piece."""
        ...

    def measured(self, backend: str, run_s: float, audio_s: float, predicted_s: float = 0.0) -> None:
        """A job's cost, from its worker."""
        ...

    def stream_ended(self, stream: Any) -> None:
        """`stream` (a `CpuStream`) is over. Typed `Any`: naming `CpuStream` here, even for type
        checking only, would import engine/cpu/stream.py back and close a circle."""
        ...
