"""Codec-token output: the talker's frames leave as they are made, and decoding them on the client
gives the same waveform the engine's own code2wav gives (same seed)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine import AudioChunk, CodecFrames, EngineError, StreamEnd, load_engine
from engine.qwen3.edge import decoder_id, load_stream_decoder
from engine.qwen3.serving.qwen3_engine import Qwen3Engine, tiny_checkpoint

TEXT = ["Hello there, ", "this is a codec token stream. ", "It ends here."]


@pytest.fixture(scope="module")
def tiny() -> Iterator[Qwen3Engine]:
    engine = load_engine("tiny")
    assert isinstance(engine, Qwen3Engine)
    yield engine
    engine.close()


async def collect(engine: Qwen3Engine, **options: object) -> list[object]:
    stream = engine.open_stream(None, "en", seed=11, **options)
    for piece in TEXT:
        stream.append(piece)
    stream.finish()
    return [ev async for ev in stream.events()]


async def test_codec_frames_decode_to_the_engines_own_audio(tiny: Qwen3Engine) -> None:
    pcm_events = await collect(tiny)
    codec_events = await collect(tiny, output="codec_tokens")
    assert pcm_events[-1] == StreamEnd("done") and codec_events[-1] == StreamEnd("done")
    frames = [ev for ev in codec_events if isinstance(ev, CodecFrames)]
    assert frames and not any(isinstance(ev, AudioChunk) for ev in codec_events)
    assert [f.first_frame for f in frames] == list(range(len(frames)))  # one frame per event, in order
    segments = [f.segment for f in frames]
    assert segments == sorted(segments) and segments[-1] == len(TEXT) - 1
    codes = np.concatenate([f.codes for f in frames])
    assert codes.dtype == np.int16 and codes.shape == (len(frames), 16)

    decoder = load_stream_decoder(tiny_checkpoint())  # the client's own decoder and chunk schedule
    wav = np.concatenate([decoder.step(codes[i : i + 3]) for i in range(0, len(codes), 3)])
    local = (np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
    served = np.concatenate([ev.pcm for ev in pcm_events if isinstance(ev, AudioChunk)])
    assert local.shape == served.shape
    assert np.abs(local.astype(np.int32) - served.astype(np.int32)).max() <= 2


def test_codec_info_names_the_decoder(tiny: Qwen3Engine) -> None:
    info = tiny.codec_info()
    assert info["codebooks"] == 16 and info["frame_rate_hz"] == 12.5 and info["sample_rate"] == 24000
    assert info["decoder_id"] == decoder_id(tiny_checkpoint()) != "unknown"


async def test_cancel_ends_a_codec_stream(tiny: Qwen3Engine) -> None:
    stream = tiny.open_stream(None, "en", output="codec_tokens")
    stream.append("A long reply that will be interrupted before it finishes speaking anything useful. ")
    stream.finish()
    events = stream.events()
    first = await anext(events)
    assert isinstance(first, CodecFrames)
    stream.cancel()
    assert [ev async for ev in events] == [StreamEnd("cancelled")]


def test_unknown_output_is_rejected(tiny: Qwen3Engine) -> None:
    with pytest.raises(EngineError, match="output"):
        tiny.open_stream(None, "en", output="mp3")
