"""A process stream's events from the I/O thread: queued without waiting up to the credit window (and its
slack), refused past it (the engine then ends the stream), and dropped quietly once the stream ended."""

from __future__ import annotations

import asyncio

import numpy as np

from engine.process import wire
from engine.process.stream import ProcessStream
from engine.types import AudioChunk, StreamEnd


def _chunk(i: int) -> AudioChunk:
    return AudioChunk(np.full(240, i, np.int16), 24000, i * 240, 0)


def test_events_past_the_window_are_refused_and_after_the_end_dropped() -> None:
    sent: list[wire.Command] = []
    stream = ProcessStream(1, None, send=sent.append, forget=lambda sid: None)
    assert all(stream.put(_chunk(i)) for i in range(wire.WINDOW + 2))
    assert not stream.put(_chunk(99))  # past the window's slack: the child broke the credit rule
    stream.end("done")
    assert stream.put(_chunk(100))  # ended: dropped, not an overrun


async def test_what_was_queued_comes_out_in_order_then_the_end() -> None:
    stream = ProcessStream(1, None, send=lambda msg: None, forget=lambda sid: None)
    for i in range(5):
        assert stream.put(_chunk(i))
    stream.end("done")
    got = []
    async with asyncio.timeout(5):
        async for ev in stream.events():
            got.append(ev)
    assert [int(ev.pcm[0]) for ev in got[:-1]] == list(range(5))  # type: ignore[union-attr]
    assert isinstance(got[-1], StreamEnd) and got[-1].reason == "done"
