"""The work of one pool job: a bounded piece of a segment, in one voice (`Piece`), and its synthesis in
flight (`PieceJob`). Plain records; the stream that owns a job guards it with its lock."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from engine.cpu.policy import PieceSnapshot
from engine.cpu.text import estimate_seconds, pieces
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

    def split(self, limit: int) -> list[Piece]:
        """It cut as `pieces` cuts text to at most `limit` (text.cost units), each part a piece with its
        own estimated length; only the last part of a segment's last piece is last (the ramp's cut)."""
        parts = list(pieces(self.text, limit))  # bounded: one piece's text
        return [Piece(self.segment, text, self.voice, self.lang, self.last and i == len(parts) - 1,
                      estimate_seconds(text)) for i, text in enumerate(parts)]


class PieceJob:
    """One piece's synthesis on the pool. The worker appends its audio to `audio` under the stream's
    condition and the driver takes it from there; `done` is set once the future is over, however."""

    def __init__(self, piece: Piece, queued_at: float) -> None:
        from engine.cpu.onnx import run_options

        self.piece = piece
        self.audio: deque[tuple[np.ndarray, int, list[tuple[str, int, int]] | None]] = deque()
        self.done = False
        self.error: Exception | None = None
        self.queued_at = queued_at  # its stream's clock
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

    def snapshot(self) -> PieceSnapshot:
        """Under its stream's lock: it as the other streams of its listener see it (immutable)."""
        return PieceSnapshot(self.piece.seconds, self.piece.voice.backend, self.started_at,
                             self.audio_s if self.done else None, self.future, self.piece.text, self.audio_s)
