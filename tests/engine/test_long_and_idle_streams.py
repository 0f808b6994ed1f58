"""Streams that outlast one request: parked streams that give their slot to a waiting one (issue 13,
finding 2) and utterances longer than a slot's KV context (finding 8). The real tiny checkpoint through
`load_engine`, small contexts so the caps come quickly; the one fault injected is a model saying EOS
early, which the tiny model cannot be made to do."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from support.streams import collect

from engine import AudioChunk, CodecFrames, EngineError, Waiting, load_engine
from engine.qwen3.serving.qwen3_engine import Qwen3Engine, Qwen3Stream

FRAME = 1920
SLOTS = 4
PIECES = [f"Sentence number {n} is spoken here. " for n in range(8)]  # ~7 tokens each: ~56 in all


def engine_with(cache: Path, **options: Any) -> Qwen3Engine:
    eng = load_engine("tiny", cache_dir=cache, frames_per_token=2.0, min_frames=6, queue_size=4, **options)
    assert isinstance(eng, Qwen3Engine)
    return eng


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def short_context(cache: Path) -> Iterator[Qwen3Engine]:
    """64 KV positions: a 10-row prompt leaves one request room for 24 tokens (about 3 pieces)."""
    eng = engine_with(cache, max_streams=SLOTS, max_context=64, greedy=True)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def crowded(cache: Path) -> Iterator[Qwen3Engine]:
    eng = engine_with(cache, max_streams=SLOTS, park_evict_s=0.3)
    yield eng
    eng.close()


async def wait_for(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def parked(eng: Qwen3Engine, s: Qwen3Stream) -> bool:
    req = eng.core._streams.get(s.rid)
    return req is not None and req.record.parked


async def feed(s: Qwen3Stream, pieces: list[str], pause: float = 0.0) -> None:
    for p in pieces:
        s.append(p)
        await asyncio.sleep(pause)
    s.finish()


# ---- finding 2: parked streams and a stream waiting for a slot ------------------------------------------

async def test_parked_streams_give_a_waiting_stream_their_slot_and_resume_without_losing_text(
        crowded: Qwen3Engine) -> None:
    core = crowded.core
    idle = [crowded.open_stream("ryan", "en", seed=i) for i in range(SLOTS)]
    readers = [asyncio.create_task(collect(s, 60, waiting=True)) for s in idle]
    for s in idle:
        s.append("Hello there. ")  # then nothing: an open utterance, its request parked in its slot
    await wait_for(lambda: all(parked(crowded, s) for s in idle))
    assert core.free_slots == 0
    evictions = core.stats.evictions

    newcomer = crowded.open_stream("ryan", "en", seed=99)
    newcomer.append("I need a slot now. ")
    newcomer.finish()
    events, end = await collect(newcomer, 30, waiting=True)
    assert end.reason == "done", end.message
    assert events[0] == Waiting("capacity", 0)  # told at once why its audio is late, then audio
    assert [e for e in events if isinstance(e, Waiting)] == [events[0]]  # once per wait
    audio = [e for e in events if isinstance(e, AudioChunk)]
    assert audio and sum(c.pcm.size for c in audio) == core.stats.finished_frames[newcomer.rid] * FRAME
    assert core.stats.evictions == evictions + 1  # one waited: one parked request gave its slot up

    for s in idle:  # the parked ones get their text later: every one speaks all of it
        s.append("And now the rest of what I had to say. ")
        s.finish()
    for s, reader in zip(idle, readers, strict=True):
        events, end = await reader
        assert end.reason == "done", end.message
        audio = [e for e in events if isinstance(e, AudioChunk)]
        assert sum(c.pcm.size for c in audio) == core.stats.finished_frames[s.rid] * FRAME
        assert [c.first_frame for c in audio] == list(np.cumsum([0] + [c.pcm.size for c in audio[:-1]]))
        assert audio[-1].segment == 1
        segments = core.stats.finished_text[s.rid][1]
        assert segments == 2  # both pieces consumed, in one request or two
    assert sum(core.stats.finished_text[s.rid][0] == 2 for s in idle) == 1  # only the evicted one needed a second
    await wait_for(lambda: core.free_slots == SLOTS and not core._streams)


async def test_without_pressure_a_parked_stream_keeps_its_slot(crowded: Qwen3Engine) -> None:
    core = crowded.core
    s = crowded.open_stream("ryan", "en", seed=1)
    reader = asyncio.create_task(collect(s, 30, waiting=True))
    s.append("Hello there. ")
    await wait_for(lambda: parked(crowded, s))
    await asyncio.sleep(1.0)  # well past park_evict_s, nobody waiting
    assert core._streams[s.rid].slot is not None
    s.append("Still here. ")
    s.finish()
    events, end = await reader
    assert end.reason == "done"
    assert not any(isinstance(e, Waiting) for e in events)
    assert core.stats.finished_text[s.rid][:2] == (1, 2)


# ---- finding 8: past the KV context ---------------------------------------------------------------------

def total_frames(events: list[Any]) -> int:
    return sum(e.pcm.size // FRAME if isinstance(e, AudioChunk) else e.codes.shape[0] for e in events)


@pytest.mark.parametrize("output", ["pcm", "codec_tokens"])
async def test_a_stream_past_its_kv_context_speaks_every_piece_in_fresh_requests(
        short_context: Qwen3Engine, output: str) -> None:
    core = short_context.core
    s = short_context.open_stream("ryan", "en", output=output)
    reader = asyncio.create_task(collect(s, 60))
    for p in PIECES[:5]:  # before its first request: split between requests at admission
        s.append(p)
    await feed(s, PIECES[5:], pause=0.05)  # the rest while it speaks: each request ends at a piece boundary
    events, end = await reader
    assert end.reason == "done", end.message
    requests, segments, _ = core.stats.finished_text[s.rid]
    assert segments == len(PIECES)  # every piece's tokens reached the talker
    assert requests >= 3  # ~56 tokens, 24 a request
    frames = core.stats.finished_frames[s.rid]
    assert frames > short_context.config.max_context  # one request could never have said it all
    assert total_frames(events) == frames
    if output == "pcm":
        assert [c.first_frame for c in events] == list(np.cumsum([0] + [c.pcm.size for c in events[:-1]]))
    else:
        assert [c.first_frame for c in events] == list(range(frames))  # one numbering across requests
    segs = [e.segment for e in events]
    assert segs == sorted(segs) and segs[-1] == len(PIECES) - 1


async def test_across_requests_the_decoder_state_carries_on(short_context: Qwen3Engine) -> None:
    """Greedy, the same text in pcm and codec_tokens: the pcm stream's audio is the codec stream's
    frames decoded in one go, across every request boundary (no reset, no gap)."""
    text = PIECES[:5]
    pcm_stream = short_context.open_stream("ryan", "en")
    codec_stream = short_context.open_stream("ryan", "en", output="codec_tokens")
    for st in (pcm_stream, codec_stream):
        for p in text:
            st.append(p)
        st.finish()
    (pcm_events, e1), (codec_events, e2) = await asyncio.gather(collect(pcm_stream), collect(codec_stream))
    assert e1.reason == e2.reason == "done"
    assert short_context.core.stats.finished_text[pcm_stream.rid][0] >= 2
    codes = np.concatenate([e.codes for e in codec_events]).astype(np.int64)
    model = short_context.model
    expected = (np.clip(model.decode(codes), -1, 1) * 32767.0).astype(np.int16)
    got = np.concatenate([c.pcm for c in pcm_events])
    assert got.size == expected.size
    assert np.abs(got.astype(np.int32) - expected).max() <= 2


async def test_one_piece_longer_than_a_request_is_cut_at_word_boundaries(short_context: Qwen3Engine) -> None:
    core = short_context.core
    words = " ".join(f"word{n}" for n in range(40))  # one append, ~80 tokens: five requests' worth
    s = short_context.open_stream("ryan", "en")
    s.append(words + " ")
    s.finish()
    events, end = await collect(s)
    assert end.reason == "done", end.message
    requests, segments, tokens = core.stats.finished_text[s.rid]
    assert requests >= 4 and segments == 1
    whole = len(short_context.model.tokenizer.content_ids(words))
    assert abs(tokens - whole) <= requests  # cut between words, each cut may re-tokenize one space
    assert {e.segment for e in events} == {0}
    cjk = short_context.open_stream("ryan", "zh")
    cjk.append("你好今天天气很好我们去公园散步吧" * 2)  # no spaces: cut between tokens
    cjk.finish()
    _, end = await collect(cjk)
    assert end.reason == "done", end.message
    assert core.stats.finished_text[cjk.rid][0] >= 2


async def test_text_the_model_skipped_with_an_early_eos_goes_to_the_next_request(
        short_context: Qwen3Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    core = short_context.core
    talker = core.talker
    assert talker is not None
    real = talker.step
    said: list[int] = []

    def eos_once(slots: Any, rows: Any, params: Any, bucket: int) -> list[int]:
        out = real(slots, rows, params, bucket)
        if not said and any(p.seed == 4242 for p in params):
            i = next(i for i, p in enumerate(params) if p.seed == 4242)
            req = next(r for r in core._streams.values() if r.slot == slots[i])
            if req.frames >= 4:  # a few tokens in, long before its text ends
                said.append(req.frames)
                out[i] = talker.eos_id
        return out

    async def speak() -> tuple[list[Any], tuple[int, int, int]]:
        s = short_context.open_stream("ryan", "en", seed=4242)
        for p in PIECES[:3]:
            s.append(p)
        s.finish()
        events, end = await collect(s)
        assert end.reason == "done", end.message
        return events, core.stats.finished_text[s.rid]

    _, (plain_requests, _, plain_tokens) = await speak()  # without the fault
    monkeypatch.setattr(talker, "step", eos_once)
    events, (requests, segments, tokens) = await speak()
    assert said  # the model "said" EOS a few frames in
    assert segments == 3 and events[-1].segment == 2  # every piece spoken all the same
    assert requests > plain_requests  # the skipped text went to another request
    assert abs(tokens - plain_tokens) <= 1  # (decoded and tokenized again: a space may move)


async def test_a_prompt_with_no_room_for_text_ends_with_an_error_naming_the_text(cache: Path) -> None:
    eng = engine_with(cache, max_streams=1, max_context=20, warm_up=False)  # 10 rows + min_frames 6: 2 tokens
    try:
        s = eng.open_stream("ryan", "en")
        s.append("Hello there. ")
        s.append("This second piece does not fit the first request. ")
        s.finish()
        _, end = await collect(s)
        assert end.reason == "done"  # pieces of ≤ 2 tokens each: spoken in many tiny requests
        tight = engine_with(cache, max_streams=1, max_context=16, warm_up=False)  # no room at all
        try:
            t = tight.open_stream("ryan", "en")
            t.append("Nothing of this can be spoken. ")
            t.finish()
            _, end = await collect(t)
            assert end.reason == "error"
            assert "no room left for text" in end.message and "Nothing of this" in end.message
        finally:
            tight.close()
    finally:
        eng.close()


async def test_an_ended_stream_keeps_nothing_per_utterance(short_context: Qwen3Engine) -> None:
    """What a stream holds is bounded by one request: its ids and track shrink back at each boundary."""
    core = short_context.core
    s = short_context.open_stream("ryan", "en")
    reader = asyncio.create_task(collect(s, 60))
    longest = 0
    for p in PIECES:
        s.append(p)
        await asyncio.sleep(0.03)
        req = core._streams.get(s.rid)
        talk = req.talk if req is not None else None
        if talk is not None:
            longest = max(longest, len(talk.ids), len(talk.token_segments))
    s.finish()
    _, end = await reader
    assert end.reason == "done"
    assert longest <= 24  # one request's budget, not the utterance's ~56 tokens


def clip(seconds: float = 1.2, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 170 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.mark.parametrize("output", ["pcm", "codec_tokens"])
async def test_an_icl_clone_past_its_kv_context_goes_on_with_the_reference_taking_room(
        cache: Path, output: str) -> None:
    """The reference's 16 frames are prompt rows of every request: one has room for 16 tokens, and each
    request's text must cover the reference (13 tokens) before it starts, as the first one's does."""
    eng = load_engine("tiny-base", cache_dir=cache, max_streams=2, max_context=64, frames_per_token=2.0,
                      min_frames=6, greedy=True)
    assert isinstance(eng, Qwen3Engine)
    try:
        s = eng.open_stream(None, "en", ref_audio=clip(), ref_text="Good morning.", output=output)
        reader = asyncio.create_task(collect(s, 60))
        await feed(s, PIECES[:8], pause=0.05)
        events, end = await reader
        assert end.reason == "done", end.message
        requests, segments, _ = eng.core.stats.finished_text[s.rid]
        assert requests >= 3 and segments == 8
        frames = eng.core.stats.finished_frames[s.rid]
        assert frames > 64 - 16
        if output == "codec_tokens":
            primes = [e for e in events if isinstance(e, CodecFrames) and e.prime]
            assert len(primes) == 1 and events[0] is primes[0]  # the reference primes the decoder once
            spoken = [e for e in events if isinstance(e, CodecFrames) and not e.prime]
            assert [e.first_frame for e in spoken] == list(range(frames))
        else:
            assert total_frames(events) == frames
        assert events[-1].segment == 7
    finally:
        eng.close()


async def test_text_past_max_pending_chars_is_refused_and_the_rest_keeps_its_segments(cache: Path) -> None:
    eng = engine_with(cache, max_streams=1, max_context=64, max_pending_chars=100, park_evict_s=60.0,
                      warm_up=False)
    try:
        holder = eng.open_stream("ryan", "en")
        holder.append("Hello there. ")  # holds the only slot: the next stream's text stays pending
        await wait_for(lambda: parked(eng, holder))
        s = eng.open_stream("ryan", "en")
        piece = "This piece is thirty-seven characters "
        s.append(piece)
        s.append(piece)
        with pytest.raises(EngineError) as err:
            s.append(piece)  # 3 × 38 > 100
        assert err.value.code == "queue_full" and "segment 2" in str(err.value)
        s.append("Short. ")  # segment 3
        s.finish()
        holder.finish()
        events, end = await collect(s)
        assert end.reason == "done", end.message
        assert {e.segment for e in events} <= {0, 1, 3}  # the refused one is nowhere, the others keep theirs
        assert eng.core.stats.finished_text[s.rid][1] == 3  # three segments spoken
        await collect(holder)
    finally:
        eng.close()
