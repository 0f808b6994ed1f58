"""The synthetic engine (`load_engine("synthetic")`, engine/synthetic.py) keeps the engine contract: speech-
shaped audio at its configured pace and first-audio delay, capacity, cancel, word timings, refusals.

Pace and delay are judged as ratios with generous bounds (the box is shared), never as tight timings."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.streams import collect

from engine import AudioChunk, CodecFrames, EngineError, StreamEnd, Waiting, Words, load_engine
from engine.synthetic import SyntheticEngine
from engine.words import words as words_of

TEXT = ["Hello there, how are you today? ", "The quick brown fox jumps over the lazy dog. ", "你好世界。"]


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[SyntheticEngine]:
    options: dict[str, Any] = getattr(request, "param", {})
    engine = load_engine("synthetic", **options)
    assert isinstance(engine, SyntheticEngine)
    yield engine
    engine.close()


def pcm_of(events: list[Any]) -> np.ndarray:
    return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])


async def timed(engine: Any, texts: list[str], **options: Any) -> tuple[list[tuple[float, Any]], StreamEnd, float]:
    """Every event with when it came (seconds after the text went in), the end, and the whole wall time."""
    stream = engine.open_stream(None, "auto", **options)
    t0 = time.monotonic()
    for text in texts:
        stream.append(text)
    stream.finish()
    got: list[tuple[float, Any]] = []
    async for ev in stream.events():
        if isinstance(ev, StreamEnd):
            return got, ev, time.monotonic() - t0
        got.append((time.monotonic() - t0, ev))
    raise AssertionError("no StreamEnd")


def test_it_is_an_engine_with_its_options_checked() -> None:
    with pytest.raises(EngineError) as e:
        load_engine("synthetic", speed=0)
    assert e.value.code == "model_unavailable" and "speed" in str(e.value)
    with pytest.raises(EngineError) as e:
        load_engine("synthetic", capacity="many")
    assert "capacity" in str(e.value)
    with pytest.raises(EngineError) as e:
        load_engine("synthetic", step_s=2)
    assert "step_s" in str(e.value)
    with pytest.raises(EngineError) as e:
        load_engine("synthetic", warp=9)
    assert "warp" in str(e.value)
    engine = load_engine("synthetic", talker="vllm")  # a gateway-wide talker choice is not its business
    try:
        assert [v.name for v in engine.voices()] == ["synthetic"]
        assert {"auto", "en", "zh"} <= set(engine.languages())
        assert engine.codec_info() == {"codebooks": 16, "codebook_size": 2048, "frame_rate_hz": 12.5,
                                       "sample_rate": 24000, "decoder_id": "synthetic"}
        assert engine.sample_rate == 24000
    finally:
        engine.close()


async def test_the_audio_is_speech_shaped(engine: SyntheticEngine) -> None:
    events, end = await collect(_spoken(engine, TEXT))
    assert end == StreamEnd("done")
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    frame = 0
    for c in chunks:  # in order, contiguous, int16 mono at the engine's rate
        assert c.first_frame == frame and c.sample_rate == 24000 and c.pcm.dtype == np.int16 and c.pcm.ndim == 1
        frame += c.pcm.size
    assert {c.segment for c in chunks} == {0, 1, 2}
    audio = pcm_of(events).astype(np.float64) / 32768
    assert 4.0 < audio.size / 24000 < 20.0  # about four syllables a second of 22 words
    assert np.sqrt(np.mean(audio**2)) > 0.03  # not silence
    # Syllables and pauses: the 20 ms frame level rises and falls (steady noise or a tone would not).
    frames = audio[: audio.size // 480 * 480].reshape(-1, 480)
    level = np.sqrt(np.mean(frames**2, axis=1))
    assert level.std() / level.mean() > 0.5
    assert np.mean(level < 0.1 * level.max()) > 0.05  # some pauses
    # Voiced and band-limited like speech: most energy between 80 Hz and 4 kHz, pitched low.
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(audio.size, 1 / 24000)
    assert spectrum[(freqs > 80) & (freqs < 4000)].sum() / spectrum.sum() > 0.9
    loud = frames[level > 0.5 * level.max()]
    crossings = np.mean(np.abs(np.diff(np.sign(loud), axis=1)) > 0) * 24000
    assert 80 < crossings < 3000  # zero crossings per second of voiced frames: far below noise's ~12000


def _spoken(engine: SyntheticEngine, texts: list[str], **options: Any) -> Any:
    stream = engine.open_stream(None, "auto", **options)
    for text in texts:
        stream.append(text)
    stream.finish()
    return stream


@pytest.mark.parametrize("engine", [{"speed": 8.0, "first_audio_s": 0.3}, {"speed": 2.0, "first_audio_s": 0.05},
                                    {"speed": 4.0, "first_audio_s": 0.05, "step_s": 0.1}],
                         indirect=True, ids=["8x", "2x", "4x-in-steps"])  # fmt: skip
async def test_it_keeps_its_pace_and_first_audio_delay(engine: SyntheticEngine) -> None:
    got, end, wall = await timed(engine, TEXT)
    assert end == StreamEnd("done")
    chunks = [(t, e) for t, e in got if isinstance(e, AudioChunk)]
    first, last = chunks[0][0], chunks[-1][0]
    # The first audio: after first_audio_s, and not long after (a loaded box's scheduling slack; in steps,
    # up to a step later).
    late = engine.options.first_audio_s + engine.options.step_s + 0.5
    assert engine.options.first_audio_s * 0.9 <= first <= late
    # The pace: audio after the first chunk over the wall time it took, as a ratio of `speed`.
    audio_s = sum(e.pcm.size for _, e in chunks[1:]) / 24000
    pace = audio_s / (last - first)
    assert 0.6 * engine.options.speed < pace < 1.1 * engine.options.speed
    assert wall >= first + audio_s / engine.options.speed * 0.9  # it sleeps out its pace: never all at once


@pytest.mark.parametrize("engine", [{"capacity": 2}], indirect=True)
async def test_past_capacity_a_stream_waits_and_past_as_many_waiting_it_is_refused(engine: SyntheticEngine) -> None:
    held = [_spoken_open(engine) for _ in range(2)]
    assert engine.capacity().streams == 2 and engine.capacity().active == 2
    third = engine.open_stream(None, "en")
    third.append("I waited for a slot. ")
    third.finish()
    _spoken_open(engine)  # a fourth waits too (as many waiting as the capacity)
    with pytest.raises(EngineError) as e:
        engine.open_stream(None, "en")
    assert e.value.code == "queue_full"
    events = third.events()
    first = await asyncio.wait_for(anext(events), 5)
    assert first == Waiting("capacity", 0)
    await asyncio.sleep(0.3)
    assert engine.capacity().active == 2  # no audio while both slots are held
    held[0].cancel()  # a slot frees: the first waiting stream takes it and speaks
    rest = [ev async for ev in events]
    assert rest[-1] == StreamEnd("done") and any(isinstance(ev, AudioChunk) for ev in rest)


def _spoken_open(engine: SyntheticEngine) -> Any:
    stream = engine.open_stream(None, "en")
    stream.append("I hold my slot. ")  # not finished: it holds its slot until cancelled
    return stream


@pytest.mark.parametrize("engine", [{"speed": 1.0}], indirect=True)
async def test_cancel_ends_with_cancelled_and_frees_the_slot(engine: SyntheticEngine) -> None:
    stream = engine.open_stream(None, "en")
    stream.append("A long sentence that would take many seconds to speak at real time pace. " * 4)
    events = stream.events()
    while not isinstance(await asyncio.wait_for(anext(events), 5), AudioChunk):
        pass
    assert engine.capacity().active == 1
    stream.cancel()
    rest = [ev async for ev in events]
    assert rest == [StreamEnd("cancelled")]
    assert engine.capacity().active == 0
    stream.append("more text after a cancel is dropped, not an error")


async def test_word_timings_are_monotonic_and_cover_the_text(engine: SyntheticEngine) -> None:
    events, end = await collect(_spoken(engine, TEXT, word_timings=True))
    assert end == StreamEnd("done")
    frames = pcm_of(events).size
    for segment, text in enumerate(TEXT):
        timed = [w for e in events if isinstance(e, Words) and e.segment == segment for w in e.words]
        assert [w.word for w in timed] == words_of(text)
        first_audio = next(e.first_frame for e in events if isinstance(e, AudioChunk) and e.segment == segment)
        assert timed[0].start == first_audio  # its words come before its audio, from where it starts
    timed = [w for e in events if isinstance(e, Words) for w in e.words]
    assert all(w.start < w.end for w in timed)
    assert all(a.end <= b.start for a, b in itertools.pairwise(timed))
    assert timed[-1].end <= frames
    # Each Words event comes before the audio that holds its words.
    seen = 0
    for e in events:
        if isinstance(e, Words):
            assert e.words[0].start >= seen
        elif isinstance(e, AudioChunk):
            seen = e.first_frame + e.pcm.size


async def test_it_refuses_what_it_cannot_make(engine: SyntheticEngine) -> None:
    for options, code in (({"ref_audio": b"RIFF"}, "voice_cloning_unsupported"),
                          ({"speed": 9.0}, "invalid_option")):
        with pytest.raises(EngineError) as e:
            engine.open_stream(None, "en", **options)
        assert e.value.code == code
    with pytest.raises(EngineError) as e:
        engine.open_stream("nobody", "en")
    assert e.value.code == "unknown_voice"
    with pytest.raises(EngineError) as e:
        engine.open_stream(None, "klingon")
    assert e.value.code == "unsupported_language"
    stream = engine.open_stream("synthetic", "en", sample_rate=16000, seed=3, instructions="cheerful")
    stream.append("Sixteen kilohertz. ")
    stream.finish()
    with pytest.raises(EngineError) as e:
        stream.append("after finish")
    assert e.value.code == "invalid_state"
    events, end = await collect(stream)
    assert end == StreamEnd("done") and all(e.sample_rate == 16000 for e in events if isinstance(e, AudioChunk))


@pytest.mark.parametrize("engine", [{"speed": 50.0, "queue_size": 2, "first_audio_s": 0.0}], indirect=True)
async def test_a_slow_reader_holds_back_its_stream_only(engine: SyntheticEngine) -> None:
    """A consumer that stops reading stops its stream's audio at its queue's bound; another stream goes on."""
    slow = _spoken(engine, ["A reader that does not read. " * 8])
    await asyncio.sleep(0.5)  # 50x: its whole text would be made by now
    assert len(slow._bridge._items) == 2  # the bound, not the text's audio
    _, end = await collect(_spoken(engine, ["Another stream is not held back. "]), timeout=5)
    assert end == StreamEnd("done")
    rest, end = await collect(slow, timeout=10)  # and the slow one, read at last, says it all
    assert end == StreamEnd("done") and len(rest) > 2


async def test_it_runs_in_a_child_process_as_every_served_engine_does() -> None:
    """The gateway runs it as it runs any engine (engine/process): the same events, capacity and cancel."""
    from engine.process import start_engine

    child = start_engine("synthetic", speed=20.0, first_audio_s=0.0, capacity=3)
    try:
        await asyncio.to_thread(child.wait_ready, 60)
        events, end = await collect(_spoken(child, TEXT, word_timings=True))  # type: ignore[arg-type]
        assert end == StreamEnd("done")
        assert [w.word for e in events if isinstance(e, Words) for w in e.words] == words_of("".join(TEXT))
        assert np.sqrt(np.mean((pcm_of(events) / 32768) ** 2)) > 0.03
        capacity = child.capacity()
        assert capacity is not None and capacity.streams == 3
        stream = child.open_stream(None, "en")
        stream.append("Cancelled before it is done, across the process boundary. " * 10)
        events_of = stream.events()
        while not isinstance(await asyncio.wait_for(anext(events_of), 10), AudioChunk):
            pass
        stream.cancel()
        assert [ev async for ev in events_of][-1] == StreamEnd("cancelled")
    finally:
        child.close()


@pytest.mark.parametrize("engine", [{"speed": 20.0, "first_audio_s": 0.0}], indirect=True)
async def test_codec_tokens_are_frames_of_the_same_plan_as_its_audio(engine: SyntheticEngine) -> None:
    """`output="codec_tokens"`: CodecFrames of Qwen3's shape, numbered contiguously, one frame per 80 ms of
    the audio the same text makes in PCM, voiced frames apart from silence, and a cancel as in PCM."""
    pcm_events, _ = await collect(_spoken(engine, TEXT))
    events, end = await collect(_spoken(engine, TEXT, output="codec_tokens"))
    assert end == StreamEnd("done")
    frames = [e for e in events if isinstance(e, CodecFrames)]
    assert frames and not any(isinstance(e, AudioChunk) for e in events)
    at = 0
    for f in frames:
        assert f.first_frame == at and not f.prime and f.codes.dtype == np.int16 and f.codes.shape[1] == 16
        at += f.codes.shape[0]
    codes = np.concatenate([f.codes for f in frames])
    assert codes.min() >= 0 and codes.max() < 2048
    assert {f.segment for f in frames} == {0, 1, 2}
    # Each segment's last frame is padded out: at most one frame per segment more than the audio's length.
    audio_frames = pcm_of(pcm_events).size / 1920
    assert audio_frames <= codes.shape[0] <= audio_frames + len(TEXT)
    assert len(np.unique(codes[:, 0])) > 3  # syllables and silence, not one row repeated
    stream = engine.open_stream(None, "en", output="codec_tokens")
    stream.append("A codec stream cancelled before it is done. " * 20)
    events_of = stream.events()
    while not isinstance(await asyncio.wait_for(anext(events_of), 5), CodecFrames):
        pass
    stream.cancel()
    assert [ev async for ev in events_of][-1] == StreamEnd("cancelled")
    assert engine.capacity().active == 0
