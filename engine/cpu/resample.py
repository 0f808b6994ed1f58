"""Streaming resampling to a stream's output rate with soxr, float audio → int16 PCM."""

from __future__ import annotations

import numpy as np


class SegmentResampler:
    """Resamples one segment's pieces as they arrive; `flush()` returns the filter's tail.

    One soxr stream per segment keeps the pieces of a segment seamless (no clicks between
    sentences) while segments that switch voice, and so input rate, each get their own.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._stream = None
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        if self._stream is None:
            return to_int16(audio)
        return to_int16(self._stream.resample_chunk(audio, last=False))

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.int16)
        return to_int16(self._stream.resample_chunk(np.zeros(0, np.float32), last=True))


def to_int16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def trim_silence(
    audio: np.ndarray, rate: int, lead_ms: float = 30.0, tail_ms: float = 120.0, threshold: float = 0.01
) -> np.ndarray:
    """Cut leading/trailing near-silence to short pads: leading silence is pure time-to-first-audio."""
    idx = np.flatnonzero(np.abs(audio) > threshold)
    if idx.size == 0:
        return audio[:0]
    start = max(0, int(idx[0]) - int(lead_ms * rate / 1000))
    end = min(audio.size, int(idx[-1]) + int(tail_ms * rate / 1000))
    return audio[start:end]
