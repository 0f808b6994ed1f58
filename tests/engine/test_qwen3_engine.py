"""The Qwen3 engine end to end on the real tiny checkpoint, loaded through `load_engine` (no mocks of
the model; the one fault injection is the "exception in one stream" case)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.streams import collect

from engine import AudioChunk, Engine, EngineError, Stream, StreamEnd, Waiting, load_engine
from engine.options import stream_request
from engine.qwen3.serving.core_stream import CoreStream
from engine.qwen3.serving.qwen3_engine import Qwen3Engine, Qwen3Stream

FRAME = 1920
MAX_STREAMS = 6
TEXTS = [
    "Hello there, how are you doing today? ",
    "The quick brown fox jumps over the lazy dog. ",
    "Streaming speech should start quickly. ",
    "你好，今天天气很好。",
    "Numbers like 42 are read aloud. ",
    "Thank you for asking. ",
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Qwen3Engine]:
    # A low frame cap keeps each utterance short; the tiny model rarely says EOS by itself.
    eng = load_engine("tiny", cache_dir=tmp_path_factory.mktemp("cache"), max_streams=MAX_STREAMS,
                      frames_per_token=2.0, min_frames=6, queue_size=4)
    assert isinstance(eng, Qwen3Engine)
    yield eng
    eng.close()


def pcm(chunks: list[AudioChunk]) -> np.ndarray:
    return np.concatenate([c.pcm for c in chunks]) if chunks else np.zeros(0, np.int16)


async def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def reference_pcm(eng: Qwen3Engine, text: str, voice: str = "ryan", language: str = "english") -> np.ndarray:
    """The model's own one-shot greedy generation and full decode, with the engine's frame cap."""
    model = eng.model
    n_tokens = len(model.tokenizer.content_ids(text.rstrip()))
    cap = eng.config.min_frames + int(np.ceil(eng.config.frames_per_token * n_tokens))
    out: list[np.ndarray] = []

    def run() -> None:
        # One intra-op thread, as the engine core runs: tiny ops on 2 busy cores are far slower with 2.
        torch.set_num_threads(1)
        codes = model.generate(text.rstrip(), voice=voice, language=language, greedy=True, max_frames=cap)
        out.append((np.clip(model.decode(codes), -1, 1) * 32767.0).astype(np.int16))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return out[0]


def assert_same_audio(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float summation order (chunked vs. full decode): one wrong code moves thousands of LSBs."""
    assert got.size == expected.size
    assert np.abs(got.astype(np.int32) - expected).max() <= 2


async def request_of(eng: Qwen3Engine, stream: Qwen3Stream) -> CoreStream:
    await wait_for(lambda: stream.rid in eng.core._streams)
    return eng.core._streams[stream.rid]


async def speak(eng: Qwen3Engine, text: str, seed: int | None = None, voice: str = "ryan") -> np.ndarray:
    s = eng.open_stream(voice, "en", seed=seed)
    s.append(text)
    s.finish()
    chunks, end = await collect(s)
    assert end.reason == "done", end.message
    return pcm(chunks)


async def test_engine_audio_equals_the_models_reference_generation(tmp_path: Path) -> None:
    # Greedy: the reference runs one row at a time, the engine pads to >= 4 rows, and the tiny model's
    # argmax has no near-ties, so the codes must be identical (a sampled id could flip on 1e-6 noise).
    eng = load_engine("tiny", cache_dir=tmp_path, max_streams=4, frames_per_token=2.0, min_frames=6, greedy=True)
    try:
        expected = reference_pcm(eng, TEXTS[0])
        alone = await speak(eng, TEXTS[0])
        batched = await asyncio.gather(*[speak(eng, t) for t in TEXTS[:4]])
    finally:
        eng.close()
    # Streaming decode with carried state equals the full decode up to float summation order.
    assert_same_audio(alone, expected)
    assert_same_audio(batched[0], expected)


async def test_a_seeded_stream_is_reproducible_alone_and_batched(engine: Qwen3Engine) -> None:
    alone = await speak(engine, TEXTS[0], seed=7)
    batched = await asyncio.gather(speak(engine, TEXTS[1], seed=8), speak(engine, TEXTS[0], seed=7),
                                   *[speak(engine, t, seed=100 + i) for i, t in enumerate(TEXTS[2:6])])
    # Same codes; chunk boundaries may differ with timing, which moves float rounding by an LSB at most.
    assert_same_audio(batched[1], alone)
    other = await speak(engine, TEXTS[0], seed=9)
    assert not np.array_equal(other[: alone.size], alone[: other.size])  # another seed, other audio


async def test_many_streams_with_text_in_random_pieces_finish_with_audio_matching_their_frames(
        engine: Qwen3Engine) -> None:
    rng = random.Random(4)

    async def speak(i: int) -> tuple[int, list[AudioChunk], StreamEnd, int]:
        text = TEXTS[i % len(TEXTS)] + TEXTS[(i + 1) % len(TEXTS)]
        cuts = sorted(rng.sample(range(1, len(text)), 3))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        s = engine.open_stream(None, "auto", seed=i)
        consumer = asyncio.create_task(collect(s))
        for p in pieces:
            s.append(p)
            await asyncio.sleep(rng.uniform(0, 0.05))
        s.finish()
        chunks, end = await consumer
        return s.rid, chunks, end, len(pieces)

    results = await asyncio.gather(*[speak(i) for i in range(MAX_STREAMS + 4)])  # more streams than slots
    for rid, chunks, end, n_pieces in results:
        assert end.reason == "done", end.message
        audio = pcm(chunks)
        assert audio.size == engine.core.stats.finished_frames[rid] * FRAME > 0
        assert [c.first_frame for c in chunks] == list(np.cumsum([0] + [c.pcm.size for c in chunks[:-1]]))
        segments = [c.segment for c in chunks]
        assert segments == sorted(segments) and segments[0] >= 0 and segments[-1] < n_pieces
        ramp = engine.config.ramp
        # code2wav chunks follow the ramp (smaller when a listener would run dry or the text did)
        assert all(c.pcm.size // FRAME <= ramp[min(i, len(ramp) - 1)] for i, c in enumerate(chunks))
    await wait_for(lambda: engine.core.free_slots == MAX_STREAMS)


async def test_a_request_parks_when_its_text_runs_dry_and_resumes_on_append(engine: Qwen3Engine) -> None:
    s = engine.open_stream("ryan", "en", seed=3)
    consumer = asyncio.create_task(collect(s))
    s.append("Hello there. ")
    n_tokens = len(engine.model.tokenizer.encode("Hello there."))
    req = await request_of(engine, s)
    await wait_for(lambda: req.record.parked)
    frames_parked = req.frames
    rows_parked = engine.core.stats.talker_rows
    await asyncio.sleep(0.3)
    # Parked: not fed padding, not stepped; one frame per text token at most.
    assert req.frames == frames_parked == n_tokens
    assert engine.core.stats.talker_rows == rows_parked
    s.append("How are you doing today? ")
    s.finish()
    chunks, end = await consumer
    assert end.reason == "done"
    assert engine.core.stats.finished_frames[s.rid] > frames_parked
    assert pcm(chunks).size == engine.core.stats.finished_frames[s.rid] * FRAME
    assert chunks[-1].segment == 1


@pytest.mark.parametrize("stage", ["before_text", "before_first_audio", "mid_stream", "after_finish"])
async def test_cancel_at_every_stage_ends_the_stream_and_frees_its_slot(engine: Qwen3Engine, stage: str) -> None:
    others = [engine.open_stream("ryan", "en", seed=50 + i) for i in range(2)]
    for o in others:
        o.append(TEXTS[1])
        o.finish()
    other_results = asyncio.gather(*[collect(o) for o in others])
    s = engine.open_stream("ryan", "en", seed=9)
    chunks: list[AudioChunk] = []
    ends: list[StreamEnd] = []

    async def consume() -> None:
        async for ev in s.events():
            (ends if isinstance(ev, StreamEnd) else chunks).append(ev)  # type: ignore[arg-type]

    task = asyncio.create_task(consume())
    if stage != "before_text":
        s.append(TEXTS[0] * 3)
    if stage == "before_first_audio":
        await wait_for(lambda: s.rid in engine.core._streams and engine.core._streams[s.rid].slot is not None)
    if stage == "mid_stream":
        await wait_for(lambda: len(chunks) >= 2)
    if stage == "after_finish":
        s.finish()
        await wait_for(lambda: len(chunks) >= 1)
    n_before = len(chunks)
    s.cancel()
    await asyncio.wait_for(task, 10)
    assert ends == [StreamEnd("cancelled")]
    assert len(chunks) == n_before  # no audio after the cancel
    for _, end in await other_results:
        assert end.reason == "done"  # the others are unaffected
    await wait_for(lambda: engine.core.free_slots == MAX_STREAMS and s.rid not in engine.core._streams)


async def test_an_exception_in_one_stream_ends_only_that_stream(engine: Qwen3Engine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    expected = dict(zip((21, 22), await asyncio.gather(speak(engine, TEXTS[0], 21), speak(engine, TEXTS[0], 22)),
                        strict=True))
    talker = engine.core.talker
    real = talker.complete

    def faulty(slots: Any, params: Any, bucket: int) -> Any:
        if any(p.seed == 666 for p in params):
            raise RuntimeError("injected fault")  # before any work: like a bad row's shape error
        return real(slots, params, bucket)

    monkeypatch.setattr(talker, "complete", faulty)
    streams = {seed: engine.open_stream("ryan", "en", seed=seed) for seed in (21, 666, 22)}
    for st in streams.values():
        st.append(TEXTS[0])
        st.finish()
    results = dict(zip(streams, await asyncio.gather(*[collect(st) for st in streams.values()]), strict=True))
    assert results[666][1].reason == "error"
    assert "injected fault" in results[666][1].message
    for seed in (21, 22):
        chunks, end = results[seed]
        assert end.reason == "done"
        assert_same_audio(pcm(chunks), expected[seed])  # as if the faulty stream never was
    assert engine.core._thread.is_alive()
    await wait_for(lambda: engine.core.free_slots == MAX_STREAMS)


async def test_a_consumer_that_stops_reading_pauses_its_stream(engine: Qwen3Engine) -> None:
    s = engine.open_stream("ryan", "en", seed=5)
    # Well past what the queue (4) and the outbox (1) hold, whatever sizes the chunk ramp gives its chunks
    # (3 sentences paused in most runs, not in all: the stream could end before it filled them).
    s.append(TEXTS[1] * 8)
    s.finish()
    req = await request_of(engine, s)
    await wait_for(lambda: req.record.paused)
    frames = req.frames
    await asyncio.sleep(0.3)
    assert req.frames == frames  # not advanced while nobody reads
    assert req.record.generating
    chunks, end = await collect(s)
    assert end.reason == "done"
    assert pcm(chunks).size == engine.core.stats.finished_frames[s.rid] * FRAME


async def test_audio_is_resampled_to_the_requested_rate(engine: Qwen3Engine) -> None:
    s = engine.open_stream("ryan", "en", seed=1, sample_rate=16000)
    s.append(TEXTS[4])
    s.finish()
    chunks, end = await collect(s)
    assert end.reason == "done"
    assert {c.sample_rate for c in chunks} == {16000}
    assert abs(pcm(chunks).size - engine.core.stats.finished_frames[s.rid] * FRAME * 2 // 3) <= 2


async def test_finish_without_text_ends_at_once_without_audio(engine: Qwen3Engine) -> None:
    s = engine.open_stream("ryan", "en")
    s.append("   ")
    s.finish()
    chunks, end = await collect(s, timeout=5)
    assert (chunks, end) == ([], StreamEnd("done"))


@pytest.mark.parametrize(("voice", "language", "options", "code"), [
    ("ryan", "en", {"volume": 2}, "invalid_option"),
    ("ryan", "en", {"speed": 1.5}, "invalid_option"),
    ("ryan", "en", {"sample_rate": 1000}, "invalid_option"),
    ("ryan", "en", {"seed": -1}, "invalid_option"),
    ("ryan", "en", {"seed": 2**64}, "invalid_option"),  # was a ValueError deep in torch
    ("ryan", "en", {"seed": 2**63}, "invalid_option"),
    ("ryan", "en", {"seed": "7"}, "invalid_option"),
    ("ryan", "en", {"seed": True}, "invalid_option"),
    ("ryan", "en", {"seed": 7.0}, "invalid_option"),
    ("ryan", "en", {"speed": float("nan")}, "invalid_option"),
    ("ryan", "en", {"speed": float("inf")}, "invalid_option"),
    ("ryan", "en", {"speed": "1.0"}, "invalid_option"),
    ("ryan", "en", {"speed": True}, "invalid_option"),
    ("ryan", "en", {"speed": 10**400}, "invalid_option"),
    ("ryan", "en", {"sample_rate": 16000.5}, "invalid_option"),
    ("ryan", "en", {"sample_rate": "16000"}, "invalid_option"),
    ("ryan", "en", {"sample_rate": True}, "invalid_option"),
    ("ryan", "en", {"sample_rate": 10**30}, "invalid_option"),
    ("ryan", "en", {"instructions": 42}, "invalid_option"),
    ("ryan", "en", {"instructions": "x" * 5000}, "invalid_option"),
    ("ryan", "en", {"output": "wav"}, "invalid_option"),
    ("ryan", "en", {"output": ["pcm"]}, "invalid_option"),
    ("ryan", "en", {"ref_audio": b"RIFF"}, "voice_cloning_unsupported"),
    ("nobody", "en", {}, "unknown_voice"),
    (42, "en", {}, "unknown_voice"),
    ("ryan", "klingon", {}, "unsupported_language"),
    ("ryan", 42, {}, "unsupported_language"),
])
def test_open_stream_rejects_what_it_cannot_serve(engine: Qwen3Engine, voice: str, language: str,
                                                  options: dict[str, Any], code: str) -> None:
    with pytest.raises(EngineError) as err:
        engine.open_stream(voice, language, **options)
    assert err.value.code == code
    if isinstance(voice, str) and isinstance(language, str) and "volume" not in options:
        try:
            request = stream_request(voice, language, options)
        except EngineError as bad:  # refused by StreamRequest's bounds, before any engine sees it
            assert bad.code == code
        else:  # refused by this engine: check() says the same without opening a stream
            with pytest.raises(EngineError) as checked:
                engine.check(request)
            assert checked.value.code == code


def test_the_qwen3_engine_declares_its_capabilities(engine: Qwen3Engine) -> None:
    assert engine.supports_cloning is False  # a CustomVoice checkpoint: named speakers only
    assert engine.codec_info() is not None and engine.codec_info()["codebooks"] == 16
    engine.check(stream_request("ryan", "en", {"output": "codec_tokens", "seed": 7, "sample_rate": 16000}))


def test_a_lexicons_ipa_is_refused_by_qwen3_and_its_respelling_said_instead(engine: Qwen3Engine) -> None:
    """The talker reads text: an IPA entry is spoken by its `say`, or refused naming it (gateway/lexicons.py)."""
    from gateway.lexicons import spoken_with
    from sessions.lexicon import Entry, Lexicon

    request = stream_request("ryan", "en", {})
    with pytest.raises(EngineError) as err:
        engine.check(stream_request("ryan", "en", {"phonemes": {"voxgate": "vˈɑksɡeɪt"}}))
    assert err.value.code == "phonemes_unsupported"
    both = Lexicon({"voxgate": Entry(ipa="vˈɑksɡeɪt", say="vocks gate"), "hi": "hello"})
    checked, pronunciations = spoken_with(engine, request, both)
    assert checked.phonemes is None and pronunciations.apply("hi voxgate") == "hello vocks gate"
    with pytest.raises(EngineError) as err:
        spoken_with(engine, request, Lexicon({"voxgate": Entry(ipa="vˈɑksɡeɪt"), "hi": "hello"}))
    assert err.value.code == "phonemes_unsupported" and "'voxgate'" in str(err.value), err.value


@pytest.mark.parametrize("options", [{"speed": "fast" * 10**5}, {"x" * 10**5: 1}, {"output": "o" * 10**5},
                                     {"seed": 10**5000}, {"instructions": ["a"] * 10**5}])
def test_an_option_error_never_echoes_unbounded_input(engine: Qwen3Engine, options: dict[str, Any]) -> None:
    with pytest.raises(EngineError) as err:
        engine.open_stream("ryan", "en", **options)
    assert err.value.code == "invalid_option"
    assert len(str(err.value)) < 300


def test_options_in_range_open_a_stream(engine: Qwen3Engine) -> None:
    for options in ({"seed": 2**63 - 1, "speed": 1, "sample_rate": 8000}, {"instructions": "", "seed": 0},
                    {"speed": 1.0, "sample_rate": 48000, "output": "codec_tokens"}):
        engine.open_stream("ryan", "en", **options).cancel()
    stream = engine.open_stream("ryan", "en")
    with pytest.raises(EngineError) as err:
        stream.append(b"bytes")  # type: ignore[arg-type]
    assert err.value.code == "invalid_text"
    stream.cancel()


def test_engine_options_out_of_range_fail_as_invalid_option(tmp_path: Path) -> None:
    for options in ({"frames_per_token": 0.5}, {"park_evict_s": float("nan")}, {"max_batch": 0}):
        with pytest.raises(EngineError) as err:
            load_engine("tiny", cache_dir=tmp_path, warm_up=False, **options)
        assert err.value.code == "invalid_option"


def test_the_engine_and_its_streams_meet_the_contract(engine: Qwen3Engine) -> None:
    assert isinstance(engine, Engine)
    stream = engine.open_stream(None, "auto")
    assert isinstance(stream, Stream)
    stream.cancel()


def test_voices_and_languages_come_from_the_checkpoint(engine: Qwen3Engine) -> None:
    assert {v.name for v in engine.voices()} == set(engine.model.speakers)
    assert engine.languages()[0] == "auto"
    assert {"en", "zh"} <= set(engine.languages())
    assert engine.sample_rate == 24000


def test_a_checkpoint_directory_loads_through_the_loader(engine: Qwen3Engine) -> None:
    from engine.qwen3.serving.qwen3_engine import tiny_checkpoint

    path: Path = tiny_checkpoint(engine_cache(engine))
    other = load_engine(str(path), max_streams=1, warm_up=False)
    try:
        assert isinstance(other, Qwen3Engine)
        assert other.core.free_slots == 1
    finally:
        other.close()
    with pytest.raises(EngineError) as err:
        load_engine(str(path / "missing"))
    assert err.value.code == "model_unavailable"


def engine_cache(eng: Qwen3Engine) -> Path:
    return Path(eng.model_path).parent


async def test_random_appends_finishes_cancels_and_slow_readers_leave_the_engine_clean(engine: Qwen3Engine) -> None:
    rng = random.Random(11)

    async def life(i: int) -> None:
        s = engine.open_stream(None, "auto", seed=i)
        chunks: list[AudioChunk] = []
        ends: list[StreamEnd] = []
        plan = rng.choice(["finish", "cancel", "cancel_early", "slow_reader"])

        async def consume() -> None:
            async for ev in s.events():
                if isinstance(ev, Waiting):  # more streams than slots: some wait, and are told so
                    continue
                if isinstance(ev, StreamEnd):
                    ends.append(ev)
                else:
                    chunks.append(ev)
                    if plan == "slow_reader":
                        await asyncio.sleep(rng.uniform(0, 0.2))

        task = asyncio.create_task(consume())
        for _ in range(rng.randint(1, 4)):
            s.append(rng.choice(TEXTS))
            await asyncio.sleep(rng.uniform(0, 0.1))
            if plan == "cancel_early":
                break
        if plan in ("cancel", "cancel_early"):
            await asyncio.sleep(rng.uniform(0, 0.3))
            s.cancel()
        else:
            s.finish()
        await asyncio.wait_for(task, 60)
        assert len(ends) == 1  # exactly one end, and it is the last event
        assert ends[0].reason == ("cancelled" if "cancel" in plan else "done")
        assert [c.first_frame for c in chunks] == [sum(c.pcm.size for c in chunks[:k]) for k in range(len(chunks))]
        if plan in ("finish", "slow_reader"):
            assert pcm(chunks).size == engine.core.stats.finished_frames[s.rid] * FRAME

    await asyncio.gather(*[life(i) for i in range(14)])
    await wait_for(lambda: engine.core.free_slots == MAX_STREAMS and not engine.core._streams)
