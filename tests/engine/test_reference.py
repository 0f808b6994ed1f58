"""Reference clips of cloned voices: decoding real audio files, refusing bad ones, caching voices."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from engine import EngineError
from engine.reference import CloneCache, decode_reference


def clip(seconds: float, rate: int = 24000, channels: int = 1, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([tone] * channels, axis=1), rate, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(("rate", "channels", "fmt"), [(24000, 1, "WAV"), (16000, 2, "WAV"), (44100, 1, "FLAC")])
def test_a_clip_becomes_mono_float32_at_its_rate(rate: int, channels: int, fmt: str) -> None:
    wav, got_rate = decode_reference(clip(2.0, rate, channels, fmt))
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert got_rate == rate and wav.size == 2 * rate
    assert 0.29 < np.abs(wav).max() < 0.31  # the tone survives the channel mix


@pytest.mark.parametrize(("data", "needle"), [
    (b"not audio at all", "could not be decoded"),
    (clip(0.5), "must last"),
    (clip(31.0, rate=8000), "must last"),
])
def test_bad_clips_are_refused_with_a_code(data: bytes, needle: str) -> None:
    with pytest.raises(EngineError, match=needle) as err:
        decode_reference(data)
    assert err.value.code == "invalid_reference_audio"


def test_the_cache_makes_each_voice_once_and_keeps_the_most_recent() -> None:
    made: list[tuple[int, str | None]] = []

    def make(audio: np.ndarray, rate: int, text: str | None) -> str:
        made.append((audio.size, text))
        return f"voice{len(made)}"

    cache: CloneCache[str] = CloneCache(make, max_entries=2)
    a, b, c = clip(1.0), clip(1.5), clip(2.0)
    assert cache.get(a, "hi") == "voice1"
    assert cache.get(a, "hi") == "voice1"  # cached
    assert cache.get(a, "other words") == "voice2"  # the transcript is part of the voice
    assert cache.get(a, "hi") == "voice1"  # touched: now the most recent
    assert cache.get(b, None) == "voice3"  # evicts (a, "other words"), the least recent
    assert len(cache) == 2 and cache.get(a, "hi") == "voice1"
    assert cache.get(c, None) == "voice4"
    assert cache.get(a, "other words") == "voice5"  # was evicted: made again
    assert len(made) == 5
