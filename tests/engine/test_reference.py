"""Reference clips of cloned voices: decoding real audio files, refusing bad ones, caching voices."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import soundfile

from engine import EngineError
from engine.reference import VoiceMaker, decode_reference


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


def test_the_maker_makes_each_voice_once_on_its_thread_and_keeps_the_most_recent() -> None:
    made: list[tuple[int, str | None, str]] = []
    done = threading.Semaphore(0)

    def make(audio: np.ndarray, rate: int, text: str | None) -> str:
        made.append((audio.size, text, threading.current_thread().name))
        return f"voice{len(made)}"

    maker: VoiceMaker[str] = VoiceMaker(make, max_entries=2, on_done=done.release)
    try:
        a, b, c = clip(1.0), clip(1.5), clip(2.0)
        assert maker.get(a, "hi").result(10) == "voice1"
        assert maker.get(a, "hi").result(10) == "voice1"  # kept
        assert maker.get(a, "other words").result(10) == "voice2"  # the transcript is part of the voice
        assert maker.get(a, "hi").result(10) == "voice1"  # touched: now the most recent
        assert maker.get(b, None).result(10) == "voice3"  # evicts (a, "other words"), the least recent
        assert len(maker) == 2 and maker.get(a, "hi").result(10) == "voice1"
        assert maker.get(c, None).result(10) == "voice4"
        assert maker.get(a, "other words").result(10) == "voice5"  # was evicted: made again
        assert len(made) == 5 and all(name.startswith("voice-maker") for *_, name in made)
        assert all(done.acquire(timeout=10) for _ in range(5))  # told once per voice made
        bad = maker.get(b"not audio", None)
        with pytest.raises(EngineError, match="could not be decoded"):
            bad.result(10)
        assert maker.get(b"not audio", None) is bad  # a failure is kept too: it would fail again
    finally:
        maker.close()
