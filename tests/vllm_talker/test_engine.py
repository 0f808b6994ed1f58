"""The whole Qwen3 engine on the vLLM talker equals it on the native one: the same core, prompts, text
tracks, codec and protocol, only the talker differs. Greedy codes frame for frame for 1 and 6 staggered
streams, text whole and streamed in pieces with parking; PCM within 2 LSB; one prefill per streamed
utterance (text appended to the running vLLM request); cancel at four points frees the vLLM request
and its KV (vLLM's own counters)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from engine import AudioChunk, CodecFrames, StreamEnd
from engine.qwen3 import Qwen3TTSModel
from engine.qwen3.serving.qwen3_engine import Qwen3Engine

pytestmark = pytest.mark.vllm

WHOLE = ["Hello there, how are you doing today?"]
PIECES = ["Streaming speech ", "for voice agents ", "should start quickly."]
TEXTS = [["The quick brown fox."], ["Numbers like 42."], ["I am doing well, thank you."],
         ["The weather is nice."], ["This is a test."], ["Never stop in the middle."]]


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def parked(engine: Qwen3Engine) -> bool:
    return any(r.record.parked for r in list(engine.core._streams.values()))


async def speak(engine: Qwen3Engine, pieces: Sequence[str], *, park: bool = False, codec: bool = True,
                start_s: float = 0.0) -> list[Any]:
    """One utterance: `pieces` appended one by one, with `park` each only once the request has run dry
    and parked (not fed padding), then finish."""
    await asyncio.sleep(start_s)
    options = {"output": "codec_tokens"} if codec else {}
    stream = engine.open_stream("ryan", "en", **options)
    events: list[Any] = []

    async def read() -> None:
        async for ev in stream.events():
            events.append(ev)

    reader = asyncio.create_task(read())
    for i, piece in enumerate(pieces):
        if i and park:
            await until(lambda: parked(engine))
        stream.append(piece)
    stream.finish()
    await asyncio.wait_for(reader, 60)
    assert events[-1] == StreamEnd("done"), events[-1]
    return events


def codes(events: list[Any]) -> np.ndarray:
    return np.concatenate([ev.codes for ev in events if isinstance(ev, CodecFrames)])


def pcm(events: list[Any]) -> np.ndarray:
    return np.concatenate([ev.pcm for ev in events if isinstance(ev, AudioChunk)])


async def test_one_stream_gives_the_native_codes_frame_for_frame(native: Qwen3Engine, on_vllm: Qwen3Engine) -> None:
    want, got = codes(await speak(native, WHOLE)), codes(await speak(on_vllm, WHOLE))
    assert want.shape[0] >= 5 and np.array_equal(got, want)


async def test_six_staggered_streams_give_the_native_codes(native: Qwen3Engine, on_vllm: Qwen3Engine) -> None:
    async def all_of(engine: Qwen3Engine) -> list[np.ndarray]:
        runs = [speak(engine, text, start_s=0.15 * i) for i, text in enumerate(TEXTS)]
        return [codes(events) for events in await asyncio.gather(*runs)]

    want, got = await all_of(native), await all_of(on_vllm)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(g, w)


async def test_streamed_text_parks_in_one_vllm_request_and_gives_the_native_codes(
        native: Qwen3Engine, on_vllm: Qwen3Engine, vllm_talker: Any) -> None:
    want = codes(await speak(native, PIECES, park=True))
    prefills = vllm_talker.stats["prefills"]
    got_events = await speak(on_vllm, PIECES, park=True)
    assert np.array_equal(codes(got_events), want)
    assert vllm_talker.stats["prefills"] - prefills == 1  # the appended text joined the running request
    requests, segments, _tokens = on_vllm.core.stats.finished_text[max(on_vllm.core.stats.finished_text)]
    assert requests == 1 and segments == len(PIECES)


async def test_seeded_sampling_gives_the_native_talkers_codes(model: Qwen3TTSModel, talker_factory: Any,
                                                               engine_options: dict[str, Any]) -> None:
    """Codebook 0 is drawn by our sampler from the stream's own generator on both talkers, so a seeded
    sampled stream speaks the same codes (the logits agree to float rounding; the draws are the same)."""
    # Sampling engines of their own; the vLLM one borrows the shared talker, idle between tests.
    sampled = {k: v for k, v in engine_options.items() if k != "greedy"} | {"warm_up": False}
    engines = [Qwen3Engine(model, **sampled), Qwen3Engine(model, talker=talker_factory, **sampled)]
    try:
        runs = []
        for engine in engines:
            stream = engine.open_stream("ryan", "en", output="codec_tokens", seed=1234)
            stream.append(PIECES[0] + PIECES[1])
            stream.finish()
            runs.append(codes([ev async for ev in stream.events()]))
        assert runs[0].shape[0] >= 5 and np.array_equal(runs[1], runs[0])
    finally:
        for engine in engines:
            engine.close()


async def test_pcm_is_within_two_lsb_of_the_native_engines(native: Qwen3Engine, on_vllm: Qwen3Engine) -> None:
    want = pcm(await speak(native, PIECES, codec=False))
    got = pcm(await speak(on_vllm, PIECES, codec=False))
    assert want.shape == got.shape and want.size > 0
    assert np.abs(want.astype(np.int32) - got.astype(np.int32)).max() <= 2


@pytest.mark.parametrize("point", ["before_text", "first_audio", "parked", "after_finish"])
async def test_cancel_frees_the_vllm_request_and_its_kv(on_vllm: Qwen3Engine, vllm_talker: Any, point: str) -> None:
    free = vllm_talker.counters()["blocks"] - 1
    stream = on_vllm.open_stream("ryan", "en")
    events: list[Any] = []

    async def read() -> None:
        async for ev in stream.events():
            events.append(ev)

    reader = asyncio.create_task(read())
    if point != "before_text":
        stream.append(PIECES[0])
        await until(lambda: any(isinstance(ev, AudioChunk) for ev in events))
        assert vllm_talker.counters()["requests"] == 1
    if point == "parked":
        await until(lambda: next(iter(on_vllm.core._streams.values())).record.parked)
    if point == "after_finish":
        stream.append(PIECES[1])
        stream.finish()
    stream.cancel()
    await asyncio.wait_for(reader, 10)
    assert events[-1].reason == "cancelled"
    await until(lambda: vllm_talker.counters()["requests"] == 0 and not vllm_talker.side.slots)
    counters = vllm_talker.counters()
    assert counters["unfinished"] == 0 and counters["free_blocks"] == free and counters["preemptions"] == 0
