"""Reference clips of cloned voices: decoding, and a bounded cache of the voices made from them.

A registered clone reaches an engine as the bytes of an audio file plus its transcript. gateway/voices.py
decodes the clip once at registration (a bad file is refused there) and stores it compactly
(`compact_reference`: mono, at most 24 kHz, 16-bit FLAC). A compressed file can decode to far more than
its size (two hours of silence are a 0.2 MB FLAC and 1.4 GB of float32), so decoding never trusts it: the
length the header declares is checked before anything is decoded, and decoding goes in blocks that stop
at the 30 s limit, for headers that declare no length (or the wrong one). Turning a clip into an
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
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from engine.resample import resample
from engine.types import EngineError

V = TypeVar("V")

MIN_SECONDS, MAX_SECONDS = 1.0, 30.0  # the reference recommends 3–10 s; longer only costs prompt rows
MIN_RATE, MAX_RATE = 8000, 96000
MAX_CHANNELS = 8
STORED_RATE = 24000  # Qwen3's rate: a stored clip needs no resampling at use, and more would be wasted
_BLOCK_FRAMES = 8192  # what one read decodes: memory goes to the mono result, not to a whole file's frames


def _refuse(message: str) -> EngineError:
    return EngineError("invalid_reference_audio", message)


def decode_reference(data: bytes) -> tuple[np.ndarray, int]:
    """An audio file's bytes (wav, flac, mp3, ogg vorbis/opus: what libsndfile reads) → (mono float32,
    sample rate). Never decodes more than `MAX_SECONDS` (plus one block) of it, whatever its header says.
    Resampling is the engine's: Qwen3 resamples exactly as the official speech tokenizer does."""
    import soundfile

    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except Exception as exc:  # libsndfile says why in its message
        raise _refuse(f"reference audio could not be decoded: {exc}") from None
    with f:
        rate, channels = int(f.samplerate), int(f.channels)
        if not MIN_RATE <= rate <= MAX_RATE:
            raise _refuse(f"reference audio must be sampled at {MIN_RATE}–{MAX_RATE} Hz, got {rate} Hz")
        if not 1 <= channels <= MAX_CHANNELS:
            raise _refuse(f"reference audio must have 1–{MAX_CHANNELS} channels, got {channels}")
        limit = int(MAX_SECONDS * rate)
        # libsndfile reports a length it does not know (a FLAC header with no total) as a huge number.
        if limit < f.frames < 1 << 40:
            raise _refuse(f"reference audio must last {MIN_SECONDS:g}–{MAX_SECONDS:g} s; its header says "
                          f"{f.frames / rate:.2f} s")  # fmt: skip
        blocks, frames = [], 0
        try:
            while frames <= limit:
                block = f.read(min(_BLOCK_FRAMES, limit + 1 - frames), dtype="float32", always_2d=True)
                if not len(block):
                    break
                blocks.append(block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0].copy())
                frames += len(block)
        except Exception as exc:  # a stream broken after a sound header
            raise _refuse(f"reference audio could not be decoded: {exc}") from None
    if frames > limit:
        raise _refuse(f"reference audio must last {MIN_SECONDS:g}–{MAX_SECONDS:g} s; it goes on past "
                      f"{MAX_SECONDS:g} s")  # fmt: skip
    seconds = frames / rate
    if seconds < MIN_SECONDS:
        raise _refuse(f"reference audio must last {MIN_SECONDS:g}–{MAX_SECONDS:g} s, got {seconds:.2f} s")
    mono = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32), rate


@dataclass(frozen=True)
class CompactClip:
    data: bytes  # a mono 16-bit FLAC file
    sample_rate: int
    seconds: float


def compact_reference(data: bytes) -> CompactClip:
    """A reference clip as it is worth keeping: decoded (bounded, as `decode_reference`), mixed to mono,
    resampled down to `STORED_RATE` when above it (soxr HQ, as the engine would), as 16-bit FLAC. A 30 s
    clip is at most 1.44 MB of samples before FLAC compresses it; `decode_reference` reads it back."""
    import soundfile

    mono, rate = decode_reference(data)
    if rate > STORED_RATE:
        mono = resample(mono, rate, STORED_RATE)
        rate = STORED_RATE
    buf = io.BytesIO()
    soundfile.write(buf, np.clip(mono, -1.0, 1.0), rate, format="FLAC", subtype="PCM_16")
    return CompactClip(buf.getvalue(), rate, round(mono.size / rate, 3))


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
