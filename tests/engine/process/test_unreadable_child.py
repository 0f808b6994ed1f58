"""A child that sends what cannot be read is broken: it is killed and restarted, so every stream ends
(`engine_restarting`) instead of one whose `End` was lost waiting forever; the messages beside an
unreadable one still count (frames come in (header, payload) pairs); a child of another wire version is
given up. The fault is real bytes on the real socket: a second peer connects to the child's ipc address
(the parent's DEALER reads from every peer) and sends them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import zmq

from engine.process import ProcessEngine, ProcessStream, start_engine, wire
from engine.types import AudioChunk, StreamEnd

LONG = " ".join(f"Sentence {i} of a long answer keeps this stream speaking for a while." for i in range(12))


@pytest.fixture
def engine() -> Iterator[ProcessEngine]:
    started = start_engine("piper", queue_size=4)
    try:
        started.wait_ready(240)
        yield started
    finally:
        started.close()


def impostor_sends(engine: ProcessEngine, frames: list[bytes]) -> None:
    """`frames` as one message to the parent, from a peer on the child's own address."""
    assert engine._child is not None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(engine._child.address)
    sock.send_multipart(frames)
    time.sleep(0.3)
    sock.close()
    ctx.term()


def speaking(engine: ProcessEngine) -> ProcessStream:
    stream = engine.open_stream("joe", "en")
    stream.append(LONG)
    stream.finish()
    return stream


async def first_audio_then_end(stream: ProcessStream, timeout_s: float = 30) -> tuple[int, StreamEnd]:
    """(audio events before its end, its end)."""
    audio = 0
    async with asyncio.timeout(timeout_s):
        async for ev in stream.events():
            if isinstance(ev, StreamEnd):
                return audio, ev
            audio += isinstance(ev, AudioChunk)
    raise AssertionError("the stream ended without an end")


async def test_an_undecodable_message_restarts_the_child_and_ends_its_streams(engine: ProcessEngine) -> None:
    pid = engine.pid
    stream = await asyncio.to_thread(speaking, engine)
    events = stream.events()
    assert isinstance(await asyncio.wait_for(anext(events), 30), AudioChunk | StreamEnd)  # under way
    await asyncio.to_thread(impostor_sends, engine, [b"\xc1 not msgpack", wire.NO_PAYLOAD])
    async with asyncio.timeout(10):
        async for ev in events:
            if isinstance(ev, StreamEnd):
                break
    assert ev.reason == "error" and ev.code == "engine_restarting", ev
    assert "does not decode" in ev.message, ev.message
    await asyncio.to_thread(engine.wait_ready, 60)
    assert engine.pid != pid and engine.restarts == 1, engine


async def test_the_messages_beside_an_unreadable_one_still_count(engine: ProcessEngine) -> None:
    one, two = await asyncio.to_thread(speaking, engine), await asyncio.to_thread(speaking, engine)
    end = wire.End(two.sid, "error", "the end sent beside the unreadable message", "beside")
    frames = [b"\xc1", wire.NO_PAYLOAD, wire.event_encoder.encode(end), wire.NO_PAYLOAD]
    await asyncio.to_thread(impostor_sends, engine, frames)
    (_, end_one), (_, end_two) = await asyncio.gather(first_audio_then_end(one), first_audio_then_end(two))
    assert end_two.code == "beside", end_two  # dispatched, not lost behind the bad header
    assert end_one.code == "engine_restarting", end_one


async def test_frames_out_of_their_pairs_break_the_child_too(engine: ProcessEngine) -> None:
    stream = await asyncio.to_thread(speaking, engine)
    await asyncio.to_thread(impostor_sends, engine, [wire.event_encoder.encode(wire.Hello(wire.VERSION, 1))])
    _, end = await first_audio_then_end(stream)
    assert end.code == "engine_restarting" and "pairs" in end.message, end


async def test_a_child_of_another_wire_version_is_given_up(engine: ProcessEngine) -> None:
    stream = await asyncio.to_thread(speaking, engine)
    hello = wire.Hello(wire.VERSION + 1, 4242)
    await asyncio.to_thread(impostor_sends, engine, [wire.event_encoder.encode(hello), wire.NO_PAYLOAD])
    _, end = await first_audio_then_end(stream)
    assert end.reason == "error" and end.code == "engine_unavailable", end
    assert engine.state == "failed" and f"wire version {wire.VERSION + 1}" in (engine.last_error or ""), engine
    assert "restart the gateway" in (engine.last_error or "")
    await asyncio.sleep(1.0)  # past the first back-off: nothing restarted
    assert engine.pid is None and engine.restarts == 0, engine


def send_raw(engine: ProcessEngine, frames: list[bytes]) -> None:
    """`frames` to the child as one command, on the real socket (through the parent's own outbox)."""
    with engine._lock:
        engine._outbox.append(list(frames))
    engine._wake()


async def test_a_command_the_child_cannot_read_restarts_it_and_ends_its_streams(engine: ProcessEngine) -> None:
    """The other direction: a lost `Finish` or `Cancel` would leave its stream open for good in the child."""
    pid = engine.pid
    stream = await asyncio.to_thread(speaking, engine)
    send_raw(engine, [b"\xc1 not msgpack"])
    _, end = await first_audio_then_end(stream)
    assert end.code == "engine_restarting" and "could not read a command" in end.message, end
    await asyncio.to_thread(engine.wait_ready, 60)
    assert engine.pid != pid, engine

