"""The work of one pool job: a bounded piece of a segment, in one voice (`Piece`), and its synthesis in
flight (`PieceJob`). Plain records; the stream that owns a job guards it with its lock."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from engine.types import VoiceInfo


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice the engine offers, and the backend that speaks it."""

    info: VoiceInfo
    backend: str  # "piper" | "kokoro"


@dataclass(frozen=True, slots=True)
class Piece:
    """A bounded part of one segment: the work of one pool job."""

    segment: int
    text: str
    voice: Voice
    lang: str
    last: bool  # the segment's last piece: the segment's resampler tail follows its audio
    seconds: float  # estimated spoken length, for deadlines


class PieceJob:
    """One piece's synthesis on the pool. The worker appends its audio to `audio` under the stream's
    condition and the driver takes it from there; `done` is set once the future is over, however."""

    def __init__(self, piece: Piece) -> None:
        from engine.cpu.onnx import run_options

        self.piece = piece
        self.audio: deque[tuple[np.ndarray, int, list[tuple[str, int, int]] | None]] = deque()
        self.done = False
        self.error: Exception | None = None
        self.queued_at = time.monotonic()
        self.started_at: float | None = None  # when a worker took it
        self.run_options = run_options()
        self.future: Future[None] | None = None
        self.made = 0  # model runs whose audio it has put out (a Piper piece may take several)
        self.preempted = False  # it gives its worker up (`CpuStream.yield_worker`): its run stops, runs again

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def audio_s(self) -> float:
        """Seconds of its audio not yet delivered (read under its stream's lock)."""
        return sum(pcm.size / rate for pcm, rate, _ in self.audio)

    def abort(self) -> None:
        self.run_options.terminate = True  # aborts a model run in progress, from this thread
        if self.future is not None:
            self.future.cancel()
