"""Cloned voices on the Qwen3 engine: a tiny Base checkpoint through the real loader, reference clips as
audio-file bytes (what the gateway's voice registry hands over), output compared with the model's own
one-shot generation and full decode."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from support.streams import collect

from engine import AudioChunk, CodecFrames, EngineError, StreamEnd, load_engine
from engine.qwen3.prompt import VoiceClone
from engine.qwen3.serving.qwen3_engine import Qwen3Engine

FRAME = 1920
TRANSCRIPT = "Good morning."
LONG = "Thanks for waiting, I checked your account and the refund went out this morning. It should arrive soon. "


def reference_clip(seconds: float = 1.2, rate: int = 24000) -> tuple[np.ndarray, bytes]:
    t = np.arange(int(seconds * rate)) / rate
    wav = (0.3 * np.sin(2 * np.pi * 170 * t + 3 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, wav, rate, format="WAV", subtype="FLOAT")  # float: the model sees these exact samples
    return wav, buf.getvalue()


@pytest.fixture(scope="module")
def base_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Qwen3Engine]:
    eng = load_engine("tiny-base", cache_dir=tmp_path_factory.mktemp("cache"), max_streams=4, frames_per_token=2.0,
                      min_frames=6, greedy=True)
    assert isinstance(eng, Qwen3Engine) and eng.supports_cloning and eng.model.model_type == "base"
    yield eng
    eng.close()


def in_one_thread(fn):  # type: ignore[no-untyped-def]
    """Run model work as the engine core does: on its own thread with one intra-op thread."""
    out = []

    def run() -> None:
        torch.set_num_threads(1)
        out.append(fn())

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return out[0]


def expected_codes(eng: Qwen3Engine, text: str, voice: VoiceClone) -> np.ndarray:
    """The model's one-shot greedy generation with the whole text, under the engine's frame cap."""
    model = eng.model
    cap = eng.config.min_frames + int(np.ceil(eng.config.frames_per_token * len(model.tokenizer.content_ids(text))))
    return in_one_thread(lambda: model.generate(text, voice=voice, language="english", greedy=True, max_frames=cap))


def as_pcm(wav: np.ndarray) -> np.ndarray:
    return (np.clip(wav, -1, 1) * 32767.0).astype(np.int16)


async def test_an_x_vector_clone_speaks_as_the_model_does(base_engine: Qwen3Engine) -> None:
    wav, clip = reference_clip()
    s = base_engine.open_stream(None, "en", ref_audio=clip)  # no transcript: x-vector only
    s.append("Hello there, how are you? ")
    s.finish()
    events, end = await collect(s)
    assert end.reason == "done", end.message
    got = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    model = base_engine.model
    codes = expected_codes(base_engine, "Hello there, how are you?", model.clone_voice(wav))
    expected = as_pcm(in_one_thread(lambda: model.decode(codes)))
    assert got.size == expected.size and np.abs(got.astype(np.int32) - expected).max() <= 2


async def test_an_icl_clone_starts_before_the_text_ends_and_equals_whole_text_generation(
        base_engine: Qwen3Engine) -> None:
    """Streamed in pieces, the prompt is built once the text covers the reference frames; later text only
    extends the trailing queue, so the codes equal a generation given the whole text at once."""
    wav, clip = reference_clip()
    voice = in_one_thread(lambda: base_engine.model.clone_voice(wav, ref_text=TRANSCRIPT))
    assert voice.icl
    s = base_engine.open_stream(None, "en", ref_audio=clip, ref_text=TRANSCRIPT, output="codec_tokens")
    words = LONG.split(" ")
    for word in words[:-6]:
        s.append(word + " ")
    events = aiter(s.events())
    prime = await asyncio.wait_for(anext(events), 30)  # the reference frames, for the listener's decoder
    assert isinstance(prime, CodecFrames) and prime.prime and voice.ref_codes is not None
    assert np.array_equal(prime.codes, voice.ref_codes.numpy()) and prime.first_frame == -len(prime.codes)
    first = await asyncio.wait_for(anext(events), 30)  # audio before finish(): admitted early
    assert isinstance(first, CodecFrames) and not first.prime and first.first_frame == 0
    s.append(" ".join(words[-6:]))
    s.finish()
    frames = [first.codes.astype(np.int64)]
    async for ev in events:
        if isinstance(ev, StreamEnd):
            assert ev.reason == "done", ev.message
        else:
            assert isinstance(ev, CodecFrames)
            frames.append(ev.codes.astype(np.int64))
    got = np.concatenate(frames)
    assert np.array_equal(got, expected_codes(base_engine, LONG.rstrip(), voice))


async def test_an_icl_clone_continues_the_reference_audio(base_engine: Qwen3Engine) -> None:
    """The codec state starts primed with the reference frames: the stream's PCM is the full decode of
    reference + generated frames with the reference part cut off (the reference's own method)."""
    wav, clip = reference_clip()
    model = base_engine.model
    voice = in_one_thread(lambda: model.clone_voice(wav, ref_text=TRANSCRIPT))
    s = base_engine.open_stream(None, "en", ref_audio=clip, ref_text=TRANSCRIPT)
    s.append("Hi. ")  # shorter than the reference: admitted at finish, the prompt padded as the reference does
    s.finish()
    events, end = await collect(s)
    assert end.reason == "done", end.message
    got = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    codes = expected_codes(base_engine, "Hi.", voice)
    assert voice.ref_codes is not None
    r = voice.ref_codes.shape[0]
    full = in_one_thread(lambda: model.decode(np.concatenate([voice.ref_codes.numpy(), codes])))
    expected = as_pcm(full[r * FRAME:])
    assert got.size == expected.size and np.abs(got.astype(np.int32) - expected).max() <= 2


async def test_each_reference_clip_is_made_into_a_voice_once(base_engine: Qwen3Engine) -> None:
    _, clip = reference_clip(1.5)
    before = len(base_engine.core.voices)
    streams = [base_engine.open_stream(None, "en", ref_audio=clip) for _ in range(3)]
    for s in streams:
        s.append("One more thing. ")
        s.finish()
    for s in streams:
        assert (await collect(s))[1].reason == "done"
    assert len(base_engine.core.voices) == before + 1


async def test_a_clip_that_is_not_audio_ends_its_stream_with_an_error(base_engine: Qwen3Engine) -> None:
    s = base_engine.open_stream(None, "en", ref_audio=b"definitely not a wav file")
    s.append("Hello. ")
    s.finish()
    events, end = await collect(s)
    assert not events and end.reason == "error" and "could not be decoded" in end.message


def test_what_a_base_or_a_custom_voice_checkpoint_refuses(base_engine: Qwen3Engine, tmp_path: Path) -> None:
    with pytest.raises(EngineError) as err:
        base_engine.open_stream(None, "en")
    assert err.value.code == "unknown_voice" and "cloned voices only" in str(err.value)
    with pytest.raises(EngineError) as err:
        base_engine.open_stream(None, "en", ref_audio="base64 text is the gateway's business")
    assert err.value.code == "invalid_option"
    custom = load_engine("tiny", cache_dir=tmp_path, max_streams=1, warm_up=False)
    try:
        assert isinstance(custom, Qwen3Engine) and not custom.supports_cloning
        with pytest.raises(EngineError) as err:
            custom.open_stream("ryan", "en", ref_audio=reference_clip()[1], ref_text=TRANSCRIPT)
        assert err.value.code == "voice_cloning_unsupported"
    finally:
        custom.close()


async def test_a_slow_first_use_of_a_clip_does_not_stall_other_streams(base_engine: Qwen3Engine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a voice runs on the voice maker's thread: while a new clip takes a whole second (slowed on
    purpose: a real speaker encoder, codec encoder and priming take that long on a CPU), a stream with
    a ready voice keeps getting audio, and the new stream starts once its voice is made."""
    model = base_engine.model
    real = model.clone_voice

    def slow_clone(*args: object, **kwargs: object) -> VoiceClone:
        time.sleep(1.0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    _, ready_clip = reference_clip(1.1)
    warm = base_engine.open_stream(None, "en", ref_audio=ready_clip)  # made before the slow one
    warm.append("Warming up. ")
    warm.finish()
    assert (await collect(warm))[1].reason == "done"
    monkeypatch.setattr(model, "clone_voice", slow_clone)
    talking = base_engine.open_stream(None, "en", ref_audio=ready_clip)
    talking.append(LONG * 2)
    talking.finish()
    arrivals: list[float] = []  # read as they come, so they say when the core made them

    async def listen() -> None:
        async for ev in talking.events():
            if isinstance(ev, AudioChunk):
                arrivals.append(time.monotonic())

    listener = asyncio.create_task(listen())
    while not arrivals:
        await asyncio.sleep(0.005)
    _, new_clip = reference_clip(1.3)
    t0 = time.monotonic()
    waiting = base_engine.open_stream(None, "en", ref_audio=new_clip)
    waiting.append("Hello there. ")
    waiting.finish()
    _, end = await collect(waiting)
    assert end.reason == "done", end.message
    await asyncio.wait_for(listener, 30)
    during = [t - t0 for t in arrivals if t0 < t < t0 + 0.9]
    assert len(during) >= 2, [t - t0 for t in arrivals]  # audio kept coming while the voice was made
