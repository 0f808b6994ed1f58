"""One response's timing record, and the trim of its leading silence.

Every response (a WebSocket utterance, an HTTP speech request) is timed from the moment its first
text went to the engine (`start`: after any admission wait, which is counted apart as `queue_wait_ms`)
to each piece of audio handed to the socket. The record goes to the client (`timing` in `audio.done`,
`session.done`, `codec.done`; headers or the SSE done event on HTTP) and to Prometheus, labelled by
model and tenant (both bounded: one model per process, tenants from the key configuration).

`LeadingTrim` drops the near-silence a voice puts before its first sound, once per response, bounded
(`trim_max_ms`) and never into the onset: it stops `trim_preroll_ms` before the first sample above
`trim_threshold_dbfs`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

import msgspec
import numpy as np

from engine.audio import OnsetTracker, first_above
from gateway import metrics

# The audible onset: bench/load.py's rule (engine/audio.py), so the server and the load harness judge
# "audible" alike. The time is when a player starting at the first audio plays that sample: leading
# silence is heard as a wait, which is what the trim takes away.
SPEECH_DBFS = -40.0


class Timing(msgspec.Struct, frozen=True):
    """Milliseconds, rounded. None: it did not happen (no audio; no PCM to judge in codec mode)."""

    queue_wait_ms: int  # admission held the response this long before its first text went to the engine
    ttfa_ms: int | None  # first text to the engine → first audio handed to the socket
    audible_ttfa_ms: int | None  # … → when a player starting at the first audio plays the first audible sample
    synthesis_ms: int | None  # … → the last audio handed to the socket
    audio_ms: int  # the audio sent: samples / sample rate (codec mode: frames / frame rate)
    rtf: float | None  # synthesis_ms / audio_ms: below 1, made faster than it plays
    trimmed_ms: int  # leading silence dropped before the first audio

    def headers(self, *, whole: bool) -> dict[str, str]:
        """HTTP headers: before a streamed body only queue wait and TTFA are known; a body assembled
        whole (mp3, flac, opus) can carry every field."""
        fields = {"X-Queue-Wait-Ms": self.queue_wait_ms, "X-TTFA-Ms": self.ttfa_ms}
        if whole:
            fields |= {"X-Audible-TTFA-Ms": self.audible_ttfa_ms, "X-Synthesis-Ms": self.synthesis_ms,
                       "X-Audio-Ms": self.audio_ms, "X-RTF": self.rtf, "X-Trimmed-Ms": self.trimmed_ms}  # fmt: skip
        return {k: str(v) for k, v in fields.items() if v is not None}


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


class ResponseClock:
    """Collects one response's timing as its audio is handed to the socket.

    Holds O(1) memory: the onset tracker keeps one window of samples, and of the chunks sent only
    those that may still hold the onset (their end and when they went)."""

    def __init__(self, rate: int, start: float | None, queue_wait_s: float = 0.0) -> None:
        self.rate = rate
        self.start = start  # None: no text went to the engine (nothing to say)
        self.queue_wait_s = queue_wait_s
        self.samples = 0  # PCM samples sent
        self.seconds = 0.0  # codec mode: seconds of frames sent
        self.trimmed = 0  # samples
        self.first_at: float | None = None
        self.audible_at: float | None = None
        self.last_at: float | None = None
        self._onset = OnsetTracker(rate, SPEECH_DBFS)
        self._chunks: deque[tuple[int, float]] = deque()  # (end sample, when sent), onset not yet found

    def _sent(self, now: float | None) -> float:
        now = time.monotonic() if now is None else now
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        return now

    def audio(self, pcm: np.ndarray, now: float | None = None) -> None:
        """PCM handed to the socket (or, for a file, the whole file's PCM when the file goes)."""
        if pcm.size == 0:
            return
        now = self._sent(now)
        self.samples += pcm.size
        if self.audible_at is not None:
            return
        self._chunks.append((self.samples, now))
        onset = self._onset.feed(pcm)
        if onset is None:
            while self._chunks and self._chunks[0][0] <= self._onset.earliest:
                self._chunks.popleft()  # ends before any onset still possible
            return
        # A player that starts with the first audio reaches the onset `onset` samples later, unless the
        # audio holding it was sent later still (the player would have run dry and waited for it).
        assert self.first_at is not None
        sent = next(t for end, t in self._chunks if end > onset)
        self.audible_at = max(sent, self.first_at + onset / self.rate)
        self._chunks.clear()

    def codec(self, seconds: float, now: float | None = None) -> None:
        """Codec frames handed to the socket: audio, but no PCM to find an onset in."""
        self._sent(now)
        self.seconds += seconds

    def record(self) -> Timing:
        def since(t: float | None) -> float | None:
            return None if t is None or self.start is None else max(0.0, t - self.start)

        audio_s = self.samples / self.rate + self.seconds
        synthesis = since(self.last_at)
        audio_ms = round(audio_s * 1000)
        rtf = round(synthesis / audio_s, 3) if synthesis is not None and audio_s > 0 else None
        return Timing(
            queue_wait_ms=round(self.queue_wait_s * 1000), ttfa_ms=_ms(since(self.first_at)),
            audible_ttfa_ms=_ms(since(self.audible_at)), synthesis_ms=_ms(synthesis), audio_ms=audio_ms,
            rtf=rtf, trimmed_ms=round(self.trimmed * 1000 / self.rate),
        )  # fmt: skip


def observe(timing: Timing, model: str, tenant: str) -> None:
    """The record into the labelled histograms (seconds, as Prometheus has it)."""
    labels = {"model": model, "tenant": tenant}
    metrics.QUEUE_WAIT.labels(**labels).observe(timing.queue_wait_ms / 1000)
    if timing.ttfa_ms is not None:
        metrics.RESPONSE_TTFA.labels(**labels).observe(timing.ttfa_ms / 1000)
    if timing.audible_ttfa_ms is not None:
        metrics.AUDIBLE_TTFA.labels(**labels).observe(timing.audible_ttfa_ms / 1000)
    if timing.rtf is not None:
        metrics.RTF.labels(**labels).observe(timing.rtf)


class LeadingTrim:
    """Drops the leading near-silence of a response's first audio.

    The start of the response is held (at most `max_ms + preroll_ms` of audio) until the first sample
    above `threshold_dbfs` is seen; then everything up to `preroll_ms` before that sample is dropped,
    never more than `max_ms`, and the audio flows untouched from there on. Marks and offsets after the
    trim shift by `trimmed` samples. Disabled, it passes audio through and trims nothing.
    """

    def __init__(self, rate: int, *, enabled: bool = True, max_ms: int = 300, threshold_dbfs: float = -45.0,
                 preroll_ms: int = 15) -> None:  # fmt: skip
        self.pending = enabled and max_ms > 0  # still holding the start, the cut not yet decided
        self.trimmed = 0  # samples dropped
        self.threshold = threshold_dbfs
        self._max = rate * max_ms // 1000
        self._preroll = rate * preroll_ms // 1000
        self._held: list[np.ndarray] = []
        self._held_n = 0

    def feed(self, pcm: np.ndarray) -> np.ndarray:
        """The audio to send now: empty while the start is held."""
        if not self.pending:
            return pcm
        found = first_above(pcm, self.threshold)
        self._held.append(pcm)
        self._held_n += pcm.size
        if found is not None:
            return self._cut(self._held_n - pcm.size + found)
        if self._held_n >= self._max + self._preroll:  # no sound within the bound: cut the most allowed
            return self._cut(self._held_n)
        return pcm[:0]

    def flush(self) -> np.ndarray:
        """The response ended while its start was held (all near-silence): what is left of it."""
        if not self.pending:
            return np.zeros(0, np.int16)
        return self._cut(self._held_n)

    def _cut(self, onset: int) -> np.ndarray:
        self.trimmed = min(max(0, onset - self._preroll), self._max)
        held = np.concatenate(self._held) if self._held else np.zeros(0, np.int16)
        self._held, self._held_n, self.pending = [], 0, False
        return held[self.trimmed :]


class TrimLimits(Protocol):
    """The trim's settings (gateway.connection.Limits has them)."""

    trim_leading_silence: bool
    trim_max_ms: int
    trim_threshold_dbfs: float
    trim_preroll_ms: int


def trim_for(rate: int, limits: TrimLimits) -> LeadingTrim:
    """A response's trim, as the settings configure it."""
    return LeadingTrim(rate, enabled=limits.trim_leading_silence, max_ms=limits.trim_max_ms,
                       threshold_dbfs=limits.trim_threshold_dbfs, preroll_ms=limits.trim_preroll_ms)  # fmt: skip
