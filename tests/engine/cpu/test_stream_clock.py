"""A stream carries out its plan (engine/cpu/policy.py `stream_plan`) on its engine's clock, not the
wall clock: with a fake clock (`CpuEngine(clock=...)`) that only the test moves, a held first audio and a
`Waiting` notice go exactly when the clock says, and not before, however long the wall clock runs.
Synthesis is real (Piper); only the clock and, where a rule weighs it, the RTF are the test's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.streams import next_audio
from support.waits import until  # wall clock, bounded: a real model run makes the first audio

from engine import load_engine
from engine.cpu.policy import DEFAULT, StreamStatus
from engine.cpu.splitters import SplitterGroups
from engine.types import AudioChunk, StreamEnd, Waiting
from tests.support.clocks import ManualClock

QUIET_S = 0.3  # wall seconds a stream is given to act wrongly while its clock stands still


@pytest.fixture(scope="module")
def clocked() -> Iterator[tuple[Any, ManualClock]]:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    clock = ManualClock()
    engine = load_engine("piper", workers=2, clock=clock)
    yield engine, clock
    engine.close()


def advance(engine: Any, clock: ManualClock, seconds: float) -> None:
    clock.now += seconds
    engine.wake()


async def goes_at(engine: Any, clock: ManualClock, first: asyncio.Future[Any], at: float, early: str) -> None:
    """The held first audio (`first`, the events' next) stays held until the stream's clock is 10 ms short
    of `at` (`early` says what it would mean otherwise), and goes when the clock reaches `at`."""
    advance(engine, clock, at - 0.01 - clock())
    await asyncio.sleep(QUIET_S)
    assert not first.done(), early
    advance(engine, clock, 0.01)
    assert isinstance(await asyncio.wait_for(first, 10), AudioChunk)


def slow_box(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RTF the rules weigh, fixed at 3 (runs measure nothing): one more piece is predicted late."""
    monkeypatch.setattr(engine.meter, "backend_rtf", lambda backend: 3.0)
    monkeypatch.setattr(engine.meter, "record", lambda *a: None)


def held_workers(engine: Any) -> tuple[threading.Event, list[Any]]:
    """Every worker held by a job until the returned gate is set."""
    gate = threading.Event()
    running = [threading.Event() for _ in range(engine.workers)]
    jobs = [engine.pool.submit(float("-inf"), lambda e=e: (e.set(), gate.wait(30))) for e in running]
    assert all(e.wait(10) for e in running), "the pool's workers are taken"
    return gate, jobs


async def test_a_stream_waiting_for_a_worker_is_told_so_once_its_clock_says_it_waited(clocked: Any) -> None:
    engine, clock = clocked
    gate, blockers = held_workers(engine)
    try:
        # Another stream's first piece, queued first: the new stream's first piece comes after it.
        other = engine.pool.submit(clock() - 60.0, lambda: None, owner="another stream", first_audio=True)
        stream = engine.open_stream("joe", "en")
        stream.append("Hello there.")
        stream.finish()
        events = stream.events()
        notice = asyncio.ensure_future(events.__anext__())
        await until(lambda: stream.snapshot.pieces, "its piece is queued")
        advance(engine, clock, DEFAULT.notice_after_s - 0.01)
        await asyncio.sleep(QUIET_S)
        assert not notice.done(), "told before it waited notice_after_s on its clock"
        advance(engine, clock, 0.01)
        assert await asyncio.wait_for(notice, 10) == Waiting("capacity", ahead=1)
        gate.set()
        rest = [ev async for ev in events]
    finally:
        gate.set()
    assert rest[-1] == StreamEnd("done") and any(isinstance(ev, AudioChunk) for ev in rest)
    assert not any(isinstance(ev, Waiting) for ev in rest), "once per wait"
    other.result(5)
    for job in blockers:
        job.result(5)


async def test_first_audio_held_for_text_still_to_come_goes_at_the_cap_of_its_clock(
        clocked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rest of the reply is still being written and one more piece is predicted late (RTF 3): waiting
    # does not make it less late, so the hold has no timer before its cap (`first_hold_s` on the
    # stream's clock). The wall clock running on changes nothing.
    engine, clock = clocked
    slow_box(engine, monkeypatch)
    stream = engine.open_stream("joe", "en")
    stream.append("Hi there.")
    events = stream.events()
    first = asyncio.ensure_future(next_audio(events, skip=("pacing",)))
    try:
        await until(lambda: stream.status is StreamStatus.HELD, "its first audio is made and held")
        await goes_at(engine, clock, first, clock() + DEFAULT.first_hold_s, "let go before the hold's cap on its clock")
        await until(lambda: stream.first_audio_at is not None, "its first chunk is out")  # set just after the put
        assert stream.first_audio_at == clock() and stream.status is StreamStatus.PLAYING
    finally:
        stream.finish()
    rest = [ev async for ev in events]
    assert rest[-1] == StreamEnd("done")


async def test_a_continuations_first_audio_is_not_held_past_the_audio_its_listener_still_hears(
        clocked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A client's sentence splitter cut "Dr." from "Smith will see you at three.": that stream's audio was
    # made before "Dr." had played, then held for the piece after it, predicted late, until 0.7 s after
    # "Dr." had played: a gap its listener heard then, for one that might come later. Its listener has
    # 1 s of audio left here, and the piece after its first is predicted late (RTF 3) and kept from
    # running: its first audio goes as that 1 s runs out (less `hold_margin_s`), not at the 2 s cap.
    engine, clock = clocked
    slow_box(engine, monkeypatch)
    release = threading.Event()
    real = engine.synthesise

    def gated(voice: Any, lang: str, text: str, *args: Any) -> Any:
        if text != "Hi there.":
            release.wait(30)
        yield from real(voice, lang, text, *args)

    monkeypatch.setattr(engine, "synthesise", gated)
    opened = clock()
    stream = engine.open_stream("joe", "en", listener_buffer_s=1.0)
    stream.append("Hi there.")
    stream.append("This sentence follows the greeting.")
    stream.finish()
    events = stream.events()
    first = asyncio.ensure_future(next_audio(events, skip=("pacing",)))
    try:
        await until(lambda: stream.status is StreamStatus.HELD, "its first audio is made and held")
        runs_out = opened + 1.0
        await goes_at(engine, clock, first, runs_out - DEFAULT.hold_margin_s,
                      "let go while its listener still had more than the margin to hear")  # fmt: skip
    finally:
        release.set()
    rest = [ev async for ev in events]
    assert rest[-1] == StreamEnd("done")


async def test_first_audio_held_for_text_still_to_come_goes_once_that_text_is_made_with_no_clock_move(
        clocked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kokoro's first piece ("我们的系统", 1.3 s) was out before the rest of its sentence had come; with nothing
    # cut after it, the first audio went at once, and its listener heard 0.9-1.5 s of silence after it.
    # Held for the text still to come, it goes on an event, the next piece made: no timer, no poll.
    engine, clock = clocked
    slow_box(engine, monkeypatch)
    stream = engine.open_stream("joe", "en")
    stream.append("Hi there.")
    events = stream.events()
    first = asyncio.ensure_future(next_audio(events, skip=("pacing",)))
    await until(lambda: stream.status is StreamStatus.HELD, "its first audio is made and held")
    await asyncio.sleep(QUIET_S)
    assert not first.done(), "let go with text still to come and its clock standing still"
    stream.append("Then more.")
    stream.finish()
    assert isinstance(await asyncio.wait_for(first, 30), AudioChunk)
    rest = [ev async for ev in events]
    assert rest[-1] == StreamEnd("done")
    assert stream.first_audio_at == clock()  # the clock never moved: the release was the event's


async def drain(events: Any) -> StreamEnd:
    """The rest of a stream's events (bounded by the caller); its end."""
    async for ev in events:
        if isinstance(ev, StreamEnd):
            return ev
    raise AssertionError("no end")


@pytest.mark.parametrize("seen", ["splitting", "whole", "new"])
async def test_a_turns_first_sentence_is_held_for_the_next_when_its_client_sends_sentence_by_sentence(
        clocked: Any, monkeypatch: pytest.MonkeyPatch, seen: str) -> None:
    # vLLM-Omni's splitter sent "Well..." alone; it went at once, "I guess that could work." came 0.2-0.3 s
    # before it had played, with both workers busy: a gap. A listener seen sending a sentence while it
    # still heard the one before has its next turn's first sentence held as for text still to come, until
    # the next opens behind it (its piece made: an event, the clock standing still); so has one not seen
    # before while most listeners of its group seen split; one seen sending whole replies goes at once.
    engine, clock = clocked
    cfg = engine.config
    monkeypatch.setattr(engine, "splitters", SplitterGroups(cfg.splitters_per_group, cfg.splitter_groups))
    listener = "turns"
    for other in ("x", "y"):  # the other listeners of its group seen split
        engine.splitters.opened(None, other, False)
        engine.splitters.opened(None, other, True)
    if seen != "new":  # an earlier turn, with a sentence opened while its listener still heard one, or not
        options = {"listener_buffer_s": 0.5} if seen == "splitting" else {}
        earlier = engine.open_stream("joe", "en", listener=listener, **options)
        earlier.append("Okay.")
        earlier.finish()
        gone = (StreamStatus.HELD, StreamStatus.PLAYING, StreamStatus.ENDED)
        await until(lambda: earlier.status in gone, "its first audio is made")
        advance(engine, clock, cfg.first_hold_s)  # whatever held it, the cap has passed
        assert await asyncio.wait_for(drain(earlier.events()), 30) == StreamEnd("done")
    slow_box(engine, monkeypatch)
    well = engine.open_stream("joe", "en", listener=listener)
    well.append("Well...")
    well.finish()
    events = well.events()
    first = asyncio.ensure_future(next_audio(events, skip=("pacing",)))
    if seen == "whole":  # nothing holds it
        assert isinstance(await asyncio.wait_for(first, 30), AudioChunk)
        assert await asyncio.wait_for(drain(events), 30) == StreamEnd("done")
        return
    await until(lambda: well.status is StreamStatus.HELD, "its first audio is made and held")
    await asyncio.sleep(QUIET_S)
    assert not first.done(), "let go while a next sentence is likely and its clock stands still"
    behind = engine.open_stream("joe", "en", listener=listener)
    behind.append("I guess that could work.")
    behind.finish()
    assert well.snapshot.next is behind
    assert isinstance(await asyncio.wait_for(first, 30), AudioChunk)
    ends = await asyncio.wait_for(asyncio.gather(drain(events), drain(behind.events())), 60)
    assert ends == [StreamEnd("done")] * 2
    assert well.first_audio_at == clock()  # the clock never moved: the release was the next sentence's
