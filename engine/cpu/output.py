"""A CPU stream's output: its model runs' audio resampled to the stream's rate, cut into chunks and put
on its `EventBridge` with their word timings, on one frame count. Mechanism only; the driver thread of
engine/cpu/stream.py is its one caller."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.resample import Resampler
from engine.stream import EventBridge
from engine.types import AudioChunk, Words, WordTiming


class Output:
    """Puts a stream's audio out in order. `on_put(frames)` runs after each chunk (the frames put so far)."""

    def __init__(self, bridge: EventBridge, sample_rate: int, chunk: int, word_timings: bool,
                 on_put: Callable[[int], None]) -> None:
        self._bridge = bridge
        self._rate = sample_rate
        self._chunk = chunk  # samples per AudioChunk (`chunk_ms`)
        self._word_timings = word_timings
        self._on_put = on_put
        self.frame = 0  # stream-relative index of the next output sample
        self._resampler: Resampler | None = None  # one per segment, across its pieces
        self._seg_frame = 0  # the stream frame the segment's resampler began at
        self._seg_in = 0  # samples it took since

    def run(self, seg: int, pcm: np.ndarray, rate: int, words: list[tuple[str, int, int]] | None) -> bool:
        """One model run's audio of segment `seg` (at `rate`), its words first. False: the stream is over."""
        if self._resampler is None:
            self._resampler, self._seg_frame, self._seg_in = Resampler(rate, self._rate), self.frame, 0
        if words and self._word_timings and not self._put_words(seg, words, rate):
            return False
        self._seg_in += pcm.size
        return self._put(self._resampler.push(pcm), seg)

    def end_segment(self, seg: int) -> bool:
        """The segment's last piece is out: its resampler's tail follows. False: the stream is over."""
        if self._resampler is None:
            return True
        tail, self._resampler = self._resampler.flush(), None
        return self._put(tail, seg)

    def _put_words(self, seg: int, words: list[tuple[str, int, int]], rate: int) -> bool:
        """A run's words as a `Words` event, before its audio, on the stream's frame count: the segment's
        resampler keeps its input and output aligned (soxr compensates its own delay), so an input sample
        maps to the segment's first frame plus its place in the segment's input at the output rate."""
        scale = self._rate / rate

        def frame_of(sample: int) -> int:
            return self._seg_frame + round((self._seg_in + sample) * scale)

        timed = tuple(WordTiming(w, frame_of(s), frame_of(e)) for w, s, e in words)
        return self._bridge.put(Words(seg, self._rate, timed))

    def _put(self, pcm: np.ndarray, seg: int) -> bool:
        """Put `pcm` as chunks. Blocks while the bridge is full: a slow consumer pauses this stream's
        synthesis, bounded by the look-ahead."""
        for start in range(0, pcm.size, self._chunk):
            piece = pcm[start:start + self._chunk]
            if not self._bridge.put(AudioChunk(piece, self._rate, self.frame, seg)):
                return False
            self.frame += piece.size
            self._on_put(self.frame)
        return True
