"""Audio at a rate it was not made at: the one resampler (soxr) and the int16 helpers around it.

Every rate change in voxgate goes through here: the engines' output rate (engine/qwen3/serving/core.py, the CPU
voices), a client's rate at the gateway, a reference clip's stored rate, the codec encoder's 24 kHz.
"""

from __future__ import annotations

import numpy as np


class Resampler:
    """A streaming resampler to int16 PCM: soxr keeps its filter state across chunks, so the pieces
    of one stream join without clicks. Takes float audio (±1.0) or int16, whichever comes first fixes
    the stream's type; `flush()` (or `last=True`) returns the filter's tail. One per segment where the
    input rate can change between segments (a mixed-language stream switching voice)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = None
        self._int16 = False

    def __call__(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        if self._stream is None and self.in_rate != self.out_rate and (audio.size or last):
            import soxr

            self._int16 = audio.dtype == np.int16
            self._stream = soxr.ResampleStream(self.in_rate, self.out_rate, 1,
                                               dtype="int16" if self._int16 else "float32", quality="HQ")  # fmt: skip
        if self._stream is None:
            return audio if audio.dtype == np.int16 else to_int16(audio)
        dtype = np.int16 if self._int16 else np.float32
        out = self._stream.resample_chunk(np.ascontiguousarray(audio, dtype=dtype), last=last)
        return out if self._int16 else to_int16(out)

    def push(self, audio: np.ndarray) -> np.ndarray:
        return self(audio)

    def flush(self) -> np.ndarray:
        return self(np.zeros(0, np.int16 if self._int16 else np.float32), last=True)


def resample(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """A whole clip of float audio at `out_rate` (soxr HQ, as librosa's default), float32."""
    audio = np.asarray(audio, dtype=np.float32)
    if in_rate == out_rate:
        return audio
    import soxr

    return soxr.resample(audio, in_rate, out_rate, quality="HQ").astype(np.float32)


#: Float audio at or below this magnitude is near-silence (the trims, and where a run first sounds).
SILENT = 0.01


def to_int16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def trim_silence(
    audio: np.ndarray, rate: int, lead_ms: float = 30.0, tail_ms: float = 120.0, threshold: float = SILENT
) -> np.ndarray:
    """Cut leading/trailing near-silence to short pads: leading silence is pure time-to-first-audio."""
    start, end = trim_bounds(audio, rate, lead_ms, tail_ms, threshold)
    return audio[start:end]


def first_sound(audio: np.ndarray, threshold: float = SILENT) -> int | None:
    """The first sample louder than near-silence (None: silence only)."""
    idx = np.flatnonzero(np.abs(audio) > threshold)
    return int(idx[0]) if idx.size else None


def trim_bounds(
    audio: np.ndarray, rate: int, lead_ms: float = 30.0, tail_ms: float = 120.0, threshold: float = SILENT
) -> tuple[int, int]:
    """The [start, end) `trim_silence` keeps (0, 0 for silence only): word timings shift by `start`."""
    idx = np.flatnonzero(np.abs(audio) > threshold)
    if idx.size == 0:
        return 0, 0
    start = max(0, int(idx[0]) - int(lead_ms * rate / 1000))
    end = min(audio.size, int(idx[-1]) + int(tail_ms * rate / 1000))
    return start, end
