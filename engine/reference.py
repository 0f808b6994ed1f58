"""Reference clips of cloned voices: decoding, and a bounded cache of the voices made from them.

A registered clone reaches an engine as the bytes of an audio file plus its transcript (gateway/voices.py,
which also decodes the clip once at registration, so a bad file is refused there). Turning a clip into an
engine's voice (for Qwen3 Base: the speaker encoder's x-vector, with the codec encoder the ICL reference
frames) is torch work, so it runs on the engine thread, once per clip: `CloneCache` keeps the most
recently used voices by the digest of (audio, transcript).
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from engine.types import EngineError

V = TypeVar("V")

MIN_SECONDS, MAX_SECONDS = 1.0, 30.0  # the reference recommends 3–10 s; longer only costs prompt rows


def decode_reference(data: bytes) -> tuple[np.ndarray, int]:
    """An audio file's bytes (wav, flac, mp3, ogg: what libsndfile reads) → (mono float32, sample rate).
    Resampling is the engine's: Qwen3 resamples exactly as the official speech tokenizer does."""
    import soundfile

    try:
        audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile says why in its message
        raise EngineError("invalid_reference_audio", f"reference audio could not be decoded: {exc}") from None
    mono = audio.mean(axis=1)
    seconds = mono.size / rate
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise EngineError("invalid_reference_audio",
                          f"reference audio must last {MIN_SECONDS:g}–{MAX_SECONDS:g} s, got {seconds:.2f} s")
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)


def reference_key(data: bytes, text: str | None) -> str:
    h = hashlib.sha256(data)
    h.update(b"\0" + (text or "").encode())
    return h.hexdigest()


class CloneCache(Generic[V]):
    """The `max_entries` most recently used voices, made on first use by `make(audio, rate, transcript)`."""

    def __init__(self, make: Callable[[np.ndarray, int, str | None], V], max_entries: int = 64) -> None:
        self.make, self.max_entries = make, max_entries
        self._voices: OrderedDict[str, V] = OrderedDict()

    def get(self, data: bytes, text: str | None) -> V:
        key = reference_key(data, text)
        voice = self._voices.get(key)
        if voice is None:
            voice = self.make(*decode_reference(data), text)
            self._voices[key] = voice
            while len(self._voices) > self.max_entries:
                self._voices.popitem(last=False)
        self._voices.move_to_end(key)
        return voice

    def __len__(self) -> int:
        return len(self._voices)
