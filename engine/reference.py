"""Reference clips of cloned voices: decoding, and a bounded cache of the voices made from them.

A registered clone reaches an engine as the bytes of an audio file plus its transcript (gateway/voices.py,
which also decodes the clip once at registration, so a bad file is refused there). Turning a clip into an
engine's voice (for Qwen3 Base: the speaker encoder's x-vector, with the codec encoder the ICL reference
frames) is slow torch work, so `VoiceMaker` does it on a thread of its own, once per clip, and keeps
the most recently used voices by the digest of (audio, transcript).
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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


class VoiceMaker(Generic[V]):
    """Makes voices from reference clips on its own thread, once per clip, and keeps the `max_entries`
    most recently used (failures too: a clip that cannot be made fails the same way every time).

    `get` is for one thread (the engine's); it never waits: it returns the voice's future, and
    `on_done` is called from the maker's thread when one completes. Making a voice can take long (a
    speaker encoder, a codec encoder, priming a decoder with the reference), and the engine thread
    must not stall every other stream meanwhile."""

    def __init__(self, make: Callable[[np.ndarray, int, str | None], V], max_entries: int = 64,
                 on_done: Callable[[], None] | None = None) -> None:
        self.make, self.max_entries, self.on_done = make, max_entries, on_done
        self._voices: OrderedDict[str, Future[V]] = OrderedDict()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voice-maker")

    def get(self, data: bytes, text: str | None) -> Future[V]:
        key = reference_key(data, text)
        voice = self._voices.get(key)
        if voice is None:
            voice = self._voices[key] = self._executor.submit(self._make, data, text)
            if self.on_done is not None:
                on_done = self.on_done
                voice.add_done_callback(lambda _: on_done())
            while len(self._voices) > self.max_entries:  # streams waiting on an evicted one keep their future
                self._voices.popitem(last=False)
        self._voices.move_to_end(key)
        return voice

    def _make(self, data: bytes, text: str | None) -> V:
        return self.make(*decode_reference(data), text)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self._voices)
