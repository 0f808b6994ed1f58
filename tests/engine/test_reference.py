"""Reference clips of cloned voices: decoding real audio files, refusing bad ones, caching voices."""

from __future__ import annotations

import io
import threading
import tracemalloc

import numpy as np
import pytest
import soundfile

from engine import EngineError
from engine.reference import VoiceMaker, compact_reference, decode_reference


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


# Decompression bombs (issue 13, finding 5): a compressed file of silence decodes to far more than its
# size. `bomb_clip` (bench/attack.py) writes one a minute at a time, so the test itself stays small.
@pytest.mark.parametrize(("fmt", "seconds"), [("flac", 7200), ("opus", 120), ("vorbis", 600), ("mp3", 600),
                                              ("wav", 600)])  # fmt: skip
def test_a_long_clip_is_refused_from_its_header_before_decoding(fmt: str, seconds: int) -> None:
    from attack import bomb_clip

    data = bomb_clip(fmt, seconds)
    tracemalloc.start()
    try:
        with pytest.raises(EngineError, match="its header says") as err:
            decode_reference(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code == "invalid_reference_audio"
    assert peak < 1 << 20, peak  # nothing decoded (numpy's buffers are traced too)


def test_a_flac_that_declares_no_length_is_decoded_only_up_to_the_limit() -> None:
    from attack import bomb_clip

    data = bomb_clip("flac", 7200, header="unknown")  # 2 h: 230 MB of float32 at 8 kHz
    tracemalloc.start()
    try:
        with pytest.raises(EngineError, match="goes on past 30 s"):
            decode_reference(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 30 * 8000 * 4, peak  # about the 30 s it may keep, not the 2 h it holds


def test_a_header_that_declares_less_than_the_file_holds_is_what_is_decoded() -> None:
    from attack import bomb_clip

    audio, rate = decode_reference(bomb_clip("flac", 7200, header="short"))  # declares 2 s of 2 h
    assert (audio.size, rate) == (16000, 8000)


def test_an_mp3_without_a_length_header_is_refused_from_its_estimate() -> None:
    from attack import bomb_clip

    data = bomb_clip("mp3", 600)
    stripped = data[data.find(b"\xff\xe3", 4):]  # drop the first frame, the LAME/Xing one with the length
    with pytest.raises(EngineError, match="its header says"):
        decode_reference(stripped)


@pytest.mark.parametrize(("rate", "channels", "needle"), [(4000, 1, "sampled at"), (192000, 1, "sampled at"),
                                                          (16000, 9, "channels")])  # fmt: skip
def test_rates_and_channels_are_bounded(rate: int, channels: int, needle: str) -> None:
    with pytest.raises(EngineError, match=needle):
        decode_reference(clip(1.5, rate, channels))


@pytest.mark.parametrize(("rate", "channels", "fmt", "stored_rate"), [
    (44100, 2, "WAV", 24000), (48000, 1, "FLAC", 24000), (16000, 1, "WAV", 16000), (24000, 2, "OGG", 24000),
])  # fmt: skip
def test_a_compact_clip_is_mono_16_bit_flac_at_most_24_khz(rate: int, channels: int, fmt: str,
                                                           stored_rate: int) -> None:
    compact = compact_reference(clip(2.0, rate, channels, fmt))
    assert (compact.sample_rate, compact.seconds) == (stored_rate, 2.0)
    with soundfile.SoundFile(io.BytesIO(compact.data)) as f:
        assert (f.format, f.subtype, f.channels, f.samplerate) == ("FLAC", "PCM_16", 1, stored_rate)
    audio, got_rate = decode_reference(compact.data)  # what the engine reads back
    assert got_rate == stored_rate and audio.size == 2 * stored_rate
    assert 0.28 < np.abs(audio).max() < 0.32  # the tone survives (Vorbis is lossy)


def test_thirty_seconds_of_noise_stay_within_the_stored_bound() -> None:
    noise = np.random.default_rng(0).uniform(-0.9, 0.9, (30 * 48000, 2)).astype(np.float32)  # FLAC cannot shrink it
    buf = io.BytesIO()
    soundfile.write(buf, noise, 48000, format="WAV", subtype="FLOAT")  # 11.5 MB uploaded
    compact = compact_reference(buf.getvalue())
    assert len(compact.data) <= 30 * 24000 * 2 + 65536, len(compact.data)  # 16-bit mono 24 kHz, plus framing
