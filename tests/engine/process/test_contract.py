"""The engine contract (docs/architecture.md, Contracts) against an engine in a child process, beside the same engine
in-process: the tiny Qwen3 model and Piper, real model code on both sides of the socket."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.streams import collect

from engine import AudioChunk, CodecFrames, Engine, EngineError, Stream, StreamEnd
from engine.options import stream_request
from engine.process import ProcessEngine, wire
from engine.types import Words

SIDES = ["inproc", "process"]


@pytest.fixture(params=SIDES)
def tiny(request: pytest.FixtureRequest, tiny_pair: dict[str, Any]) -> Any:
    return tiny_pair[request.param]


@pytest.fixture(params=SIDES)
def piper(request: pytest.FixtureRequest, piper_pair: dict[str, Any]) -> Any:
    return piper_pair[request.param]


async def eventually(cond: Callable[[], bool], timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached"
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


def assert_continuous(chunks: list[AudioChunk], rate: int) -> None:
    frame, seg = 0, 0
    for c in chunks:
        assert c.first_frame == frame and c.segment >= seg
        assert c.sample_rate == rate and c.pcm.dtype == np.int16 and c.pcm.ndim == 1 and c.pcm.size > 0
        frame, seg = frame + c.pcm.size, c.segment


def pcm(chunks: list[AudioChunk]) -> np.ndarray:
    return np.concatenate([c.pcm for c in chunks]) if chunks else np.zeros(0, np.int16)


async def speak(engine: Any, texts: list[str], voice: str | None, **options: Any) -> tuple[list[Any], StreamEnd]:
    stream = engine.open_stream(voice, "en", **options)
    for text in texts:
        stream.append(text)
    stream.finish()
    return await collect(stream)


def active(engine: Any) -> int:
    capacity = engine.capacity()
    return -1 if capacity is None else capacity.active


# ---- tiny Qwen3 ----


async def test_a_stream_speaks_its_segments_in_order(tiny: Any) -> None:
    chunks, end = await speak(tiny, ["Hello there. ", "How are you today? "], "ryan", seed=4)
    assert end == StreamEnd("done")
    assert_continuous(chunks, 24000)
    assert {c.segment for c in chunks} == {0, 1}


async def test_a_seeded_stream_sounds_the_same_in_a_child_process(tiny_pair: dict[str, Any]) -> None:
    results = [await speak(tiny_pair[side], ["The quick brown fox jumps over the lazy dog. "], "ryan", seed=11)
               for side in SIDES]
    (a, end_a), (b, end_b) = results
    assert end_a == end_b == StreamEnd("done")
    assert pcm(a).size == pcm(b).size > 0
    assert np.abs(pcm(a).astype(np.int32) - pcm(b)).max() <= 2  # float summation order at most


async def test_codec_tokens_come_as_codec_frames(tiny: Any) -> None:
    events, end = await speak(tiny, ["Numbers like 42 are read aloud. "], "ryan", seed=2, output="codec_tokens")
    assert end == StreamEnd("done") and events
    frame = 0
    for ev in events:
        assert isinstance(ev, CodecFrames) and ev.codes.dtype == np.int16 and ev.codes.shape[1] == 16
        assert ev.first_frame == frame
        frame += ev.codes.shape[0]


async def test_the_child_declares_what_the_engine_declares(tiny_pair: dict[str, Any],
                                                           piper_pair: dict[str, Any]) -> None:
    for pair in (tiny_pair, piper_pair):
        inproc, child = pair["inproc"], pair["process"]
        assert child.voices() == inproc.voices()
        assert child.languages() == inproc.languages()
        assert child.sample_rate == inproc.sample_rate
        assert child.supports_cloning == inproc.supports_cloning
        assert child.codec_info() == inproc.codec_info()
        assert isinstance(child, Engine) and child.state == "ready" and child.pid != os.getpid()
        await eventually(lambda c=child: c.memory()["rss_bytes"] is not None)  # the first beat after ready
        assert child.memory()["rss_bytes"] > 10 * 2**20
    # What admission weighs a stream by crosses too: the CPU voices' cost per language and their budget.
    inproc, child = piper_pair["inproc"], piper_pair["process"]
    own, told = inproc.capacity(), child.capacity()
    assert told is not None and told.follows_listener and told.budget == own.budget
    assert [lang for lang, _ in told.costs] == ["en"] and [name for name, _ in told.voice_costs] == ["joe"]
    assert all(isinstance(c, float) for _, c in told.costs + told.voice_costs)
    # And the class of voice each stream's first audio is forecast by, with the engine's word on it.
    assert [c for c, _ in told.first_audio_s] == ["piper"] and told.voice_classes == (("joe", "piper"),)
    assert told.language_classes == (("en", "piper"),) and told.first_audio_s[0][1] > 0


@pytest.mark.parametrize(("voice", "language", "options", "code"), [
    ("nobody", "en", {}, "unknown_voice"),
    ("ryan", "klingon", {}, "unsupported_language"),
    ("ryan", "en", {"speed": 2.0}, "invalid_option"),
    ("ryan", "en", {"seed": 7.0}, "invalid_option"),
    ("ryan", "en", {"ref_audio": b"RIFF"}, "voice_cloning_unsupported"),
])
def test_open_stream_and_check_refuse_with_the_engines_code(tiny: Any, voice: str, language: str,
                                                            options: dict[str, Any], code: str) -> None:
    with pytest.raises(EngineError) as err:
        tiny.open_stream(voice, language, **options)
    assert err.value.code == code
    try:
        request = stream_request(voice, language, options)
    except EngineError:
        return
    with pytest.raises(EngineError) as checked:
        tiny.check(request)
    assert checked.value.code == code


async def test_an_unchecked_request_opened_on_the_loop_ends_with_the_engines_code(tiny_pair: dict[str, Any]) -> None:
    """On an event loop a request not yet checked is not waited for: the child's open refuses it, the stream
    ends with the engine's code, and the verdict is cached, so the next open raises at once."""
    child: ProcessEngine = tiny_pair["process"]
    stream = child.open_stream("nobody-on-a-loop", "en")
    stream.append("Never spoken.")
    events, end = await asyncio.wait_for(collect(stream), 10)
    assert events == [] and end.reason == "error" and end.code == "unknown_voice", end
    await eventually(lambda: child._verdicts._cached(stream_request("nobody-on-a-loop", "en", {}))[1] is not None, 5)
    with pytest.raises(EngineError) as err:
        child.open_stream("nobody-on-a-loop", "en")
    assert err.value.code == "unknown_voice"


def test_append_refuses_what_is_not_text_and_text_after_finish(tiny: Any) -> None:
    stream = tiny.open_stream("ryan", "en")
    assert isinstance(stream, Stream)
    with pytest.raises(EngineError) as err:
        stream.append(b"bytes")  # type: ignore[arg-type]
    assert err.value.code == "invalid_text"
    stream.finish()
    with pytest.raises(EngineError) as err:
        stream.append("more")
    assert err.value.code == "invalid_state"
    stream.cancel()


async def test_cancel_mid_stream_ends_cancelled_and_frees_the_slot(tiny: Any) -> None:
    stream = tiny.open_stream("ryan", "en", seed=9)
    stream.append("The quick brown fox jumps over the lazy dog. " * 4)
    events = stream.events()
    got = [await asyncio.wait_for(anext(events), 30) for _ in range(2)]
    assert all(isinstance(ev, AudioChunk) for ev in got)
    stream.cancel()
    assert [ev async for ev in events] == [StreamEnd("cancelled")]  # no audio after a cancel
    await eventually(lambda: active(tiny) == 0, 5)  # the child's slot is free (its next heartbeat says so)


async def test_concurrent_streams_all_finish(tiny: Any) -> None:
    results = await asyncio.gather(*[speak(tiny, [f"Stream {i} says hello. "], "ryan", seed=30 + i) for i in range(3)])
    for chunks, end in results:
        assert end == StreamEnd("done")
        assert_continuous(chunks, 24000)


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


async def test_the_qwen3_engines_memory_and_telemetry_cross_the_process(tiny_pair: dict[str, Any]) -> None:
    """The admin report and /metrics say the same fields of the tiny engine in a child as in-process: its KV
    and slot bytes, and a stream nobody reads holds a slot that slots_in_use counts."""
    import json

    from support.servers import serve

    from gateway import engine_report

    inproc, child = tiny_pair["inproc"], tiny_pair["process"]
    stream = child.open_stream("ryan", "en", seed=11)
    stream.append("The quick brown fox jumps over the lazy dog. " * 8)  # nobody reads: it pauses on its slot
    try:
        await eventually(lambda: child.telemetry().get("slots_in_use", 0) >= 1, 30)
        for addr in serve(child, model="tiny"):
            record = json.loads(await asyncio.to_thread(_get, f"http://{addr}/v1/admin/models/tiny"))
            metrics = (await asyncio.to_thread(_get, f"http://{addr}/metrics")).decode()
    finally:
        stream.cancel()
    memory, ours = record["memory"], engine_report.memory(inproc)
    assert set(memory) == set(ours), (memory, ours)
    assert {k for k, v in memory.items() if v is not None} == {k for k, v in ours.items() if v is not None}
    assert memory["pid"] == child.pid and not memory["shared_process"] and memory["rss_bytes"] > 50 * 2**20
    assert memory["kv_bytes"] == ours["kv_bytes"] > 0 and memory["slot_bytes"] == ours["slot_bytes"] >= ours["kv_bytes"]
    assert memory["weights_bytes"] == ours["weights_bytes"] > 0
    telemetry = record["telemetry"]
    assert set(engine_report.telemetry(inproc)) <= set(telemetry), telemetry
    assert telemetry["slots_total"] == 4 and 1 <= telemetry["slots_in_use"] <= 4, telemetry
    assert telemetry["cycle_seconds"] > 0 and telemetry["batch_size"] >= 0 and telemetry["restarts"] == 0, telemetry
    assert 'voxgate_engine_slots{model="tiny"} 4.0' in metrics
    in_use = next(line for line in metrics.splitlines() if line.startswith('voxgate_engine_slots_in_use{model="tiny"}'))
    assert float(in_use.rsplit(" ", 1)[1]) >= 1, in_use


async def test_leaving_the_events_early_cancels_the_child_stream(tiny_pair: dict[str, Any]) -> None:
    child: ProcessEngine = tiny_pair["process"]
    stream = child.open_stream("ryan", "en", seed=5)
    stream.append("The quick brown fox jumps over the lazy dog. " * 4)
    async for _ in stream.events():
        break
    await eventually(lambda: active(child) == 0, 5)


# ---- Piper ----


async def test_piper_speaks_at_the_rate_asked(piper: Any) -> None:
    chunks, end = await speak(piper, ["Sure, I can help with that. ", "Your order ships tomorrow."], "joe",
                              sample_rate=16000)
    assert end == StreamEnd("done")
    assert_continuous(chunks, 16000)
    assert 1.0 < pcm(chunks).size / 16000 < 8.0


async def test_word_timings_cross_the_process_as_the_engine_made_them(piper_pair: dict[str, Any]) -> None:
    said = {}
    for side in SIDES:
        events, end = await speak(piper_pair[side], ["Sure, I can help with that."], "joe", word_timings=True)
        assert end == StreamEnd("done")
        frames = sum(ev.pcm.size for ev in events if isinstance(ev, AudioChunk))
        timed = [(w.word, w.start, w.end) for ev in events if isinstance(ev, Words) for w in ev.words]
        assert all(0 <= start <= stop <= frames for _, start, stop in timed)
        said[side] = [w for w, _, _ in timed]  # Piper's durations are sampled: the times differ run to run
    assert said["process"] == said["inproc"] and said["inproc"][:2] == ["Sure", "I"]


async def test_a_reader_that_stops_stops_the_child_and_holds_a_window(piper_pair: dict[str, Any]) -> None:
    """Nobody reads: the child sends one window and no more, its engine fills its own bounded queue and
    stops synthesising (its workers' busy time stands still: judged by the engine's own clock, not by
    CPU time, which a loaded box blurs); reading on, synthesis resumes and every event comes, in order."""
    child: ProcessEngine = piper_pair["process"]
    stream = child.open_stream("joe", "en")
    stream.append("This is a long answer that nobody is listening to right now, sentence after sentence. " * 5)
    stream.finish()
    await eventually(lambda: len(stream._bridge._items) >= wire.WINDOW, 60)

    def busy() -> float:
        capacity = child.capacity()
        assert capacity is not None and capacity.busy_s is not None
        return capacity.busy_s

    settled, deadline = busy(), time.monotonic() + 30
    while True:  # the look-ahead in flight lands
        await asyncio.sleep(0.3)
        if (now := busy()) == settled:
            break
        settled = now
        assert time.monotonic() < deadline, "the child kept synthesising with nobody reading"
    rss = child.memory()["rss_bytes"]
    await asyncio.sleep(0.6)
    assert busy() == settled  # nothing synthesised while nobody reads
    assert len(stream._bridge._items) <= wire.WINDOW  # what the parent holds is bounded by the window
    assert child.memory()["rss_bytes"] - rss < 20 * 2**20
    chunks, end = await collect(stream)
    assert end == StreamEnd("done")
    assert_continuous(chunks, 24000)
    assert busy() > settled  # it was paused, not finished: reading on made it synthesise the rest
