"""Audio levels on int16 PCM: window RMS, the sustained audible onset, the first sample above a level.

One definition of "audible" for the whole project: the gateway's `audible_ttfa_ms` (gateway/timing.py)
and the load harness's audible TTFA (bench/audio_metrics.py re-exports these) use the same rule, so a
server's timing record and a client's measurement of the same audio agree.
"""

from __future__ import annotations

import math

import numpy as np


def window_rms_dbfs(samples: np.ndarray, window: int) -> np.ndarray:
    """RMS level of each complete, non-overlapping window of int16 samples, in dB full scale
    (0 dBFS = a full-scale square wave; digital silence reads -inf)."""
    if window <= 0:
        raise ValueError("window must be positive")
    n = len(samples) // window
    if n == 0:
        return np.empty(0)
    x = samples[: n * window].astype(np.float64).reshape(n, window) / 32768.0
    rms = np.sqrt(np.mean(x * x, axis=1))
    with np.errstate(divide="ignore"):
        return 20.0 * np.log10(rms)


def rms_onset(samples: np.ndarray, rate: int, threshold_dbfs: float = -40.0, window_ms: float = 10.0,
              sustain_ms: float = 50.0) -> int | None:  # fmt: skip
    """Sample index where sound first becomes audible and stays so: the start of the first run of
    consecutive windows, at least `sustain_ms` long, all above `threshold_dbfs`. A click or a
    breath shorter than `sustain_ms` does not count; None if there is no such run."""
    tracker = OnsetTracker(rate, threshold_dbfs, window_ms, sustain_ms)
    tracker.feed(samples)
    return tracker.onset


class OnsetTracker:
    """`rms_onset` fed incrementally, holding only the samples of one incomplete window: audio is fed
    chunk by chunk as it is sent or received, and the onset is known without keeping the audio."""

    def __init__(self, rate: int, threshold_dbfs: float = -40.0, window_ms: float = 10.0,
                 sustain_ms: float = 50.0) -> None:  # fmt: skip
        self.window = max(1, round(rate * window_ms / 1000.0))
        self.needed = max(1, math.ceil(sustain_ms / window_ms))
        self.threshold = threshold_dbfs
        self.onset: int | None = None
        self._pending = np.empty(0, dtype=np.int16)  # samples not yet in a complete window
        self._consumed = 0  # samples in complete windows so far
        self._run_start: int | None = None
        self._run_len = 0

    @property
    def earliest(self) -> int:
        """The first sample an onset not yet found can start at (the current run's start, or the first
        sample not yet judged): a caller keeping per-chunk data may drop what ends before it."""
        if self.onset is not None:
            return self.onset
        return self._run_start if self._run_start is not None else self._consumed

    def feed(self, samples: np.ndarray) -> int | None:
        if self.onset is not None:
            return self.onset
        data = np.concatenate([self._pending, samples.astype(np.int16, copy=False)])
        levels = window_rms_dbfs(data, self.window)
        self._pending = data[len(levels) * self.window :]
        for i, level in enumerate(levels):
            if level > self.threshold:
                if self._run_start is None:
                    self._run_start = self._consumed + i * self.window
                self._run_len += 1
                if self._run_len >= self.needed:
                    self.onset = self._run_start
                    break
            else:
                self._run_start, self._run_len = None, 0
        self._consumed += len(levels) * self.window
        return self.onset


def first_above(samples: np.ndarray, threshold_dbfs: float) -> int | None:
    """Index of the first sample whose magnitude is above `threshold_dbfs` (peak, dB full scale), or None.
    Sample-exact and with no sustain rule: the earliest sign of sound, where a trim must stop."""
    if samples.size == 0:
        return None
    level = 32768.0 * 10 ** (threshold_dbfs / 20.0)
    loud = np.abs(samples.astype(np.int32, copy=False)) > level
    i = int(np.argmax(loud))
    return i if loud[i] else None
