"""Audio at the edge: G.711 against the reference codec, resampling, WAV stream header."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from gateway.audio import Resampler, encode_file, encode_frames, wav_stream_header

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_g711_matches_the_reference_codec_on_every_sample(law: str) -> None:
    audioop = pytest.importorskip("audioop")  # in the stdlib up to Python 3.12
    ref = audioop.lin2ulaw if law == "ulaw" else audioop.lin2alaw
    assert encode_frames(ALL_SAMPLES, law) == ref(ALL_SAMPLES.tobytes(), 2)


def test_g711_known_codes() -> None:
    silence = np.zeros(2, np.int16)
    assert encode_frames(silence, "ulaw") == b"\xff\xff"
    assert encode_frames(silence, "alaw") == b"\xd5\xd5"


def test_streaming_resampler_keeps_duration_across_chunks() -> None:
    tone = (np.sin(np.arange(24000) * 2 * np.pi * 440 / 24000) * 8000).astype(np.int16)
    r = Resampler(24000, 8000)
    out = [r(chunk) for chunk in np.array_split(tone, 7)] + [r(np.zeros(0, np.int16), last=True)]
    assert abs(sum(len(o) for o in out) - 8000) <= 2
    assert Resampler(24000, 24000)(tone) is tone


def test_wav_stream_header_parses_as_16_bit_mono() -> None:
    data = wav_stream_header(16000) + np.zeros(160, np.int16).tobytes()
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)


def test_whole_wav_file_round_trips() -> None:
    pcm = (np.arange(2400) % 100).astype(np.int16)
    with wave.open(io.BytesIO(encode_file(pcm, 24000, "wav"))) as w:
        assert np.array_equal(np.frombuffer(w.readframes(w.getnframes()), np.int16), pcm)


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac"])
def test_a_whole_file_written_as_it_comes_is_the_file_encode_file_makes(fmt: str) -> None:
    import soundfile

    from gateway.audio import WholeFile

    rng = np.random.default_rng(7)
    parts = [rng.integers(-20000, 20000, n, dtype=np.int16) for n in (480, 1, 0, 2400)]
    whole = WholeFile(24000, fmt)
    for p in parts:
        whole.add(p)
    data, pcm = whole.finish()
    expected = np.concatenate(parts)
    assert np.array_equal(pcm, expected) and whole.samples == expected.size
    if fmt == "pcm":
        assert data == expected.tobytes()
        return
    decoded, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 24000 and np.array_equal(decoded, expected)
    if fmt == "wav":
        assert data == encode_file(expected, 24000, "wav")  # byte for byte what libsndfile writes
