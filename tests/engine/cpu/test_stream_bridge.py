"""EventBridge: the backend-agnostic thread → asyncio bridge (engine/stream.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from support.waits import until

from engine.stream import EventBridge
from engine.types import AudioChunk, StreamEnd


def chunk(i: int, n: int = 4) -> AudioChunk:
    return AudioChunk(np.full(n, i, np.int16), 24000, i * n, 0)


async def drain(bridge: EventBridge) -> list[object]:
    return [ev async for ev in bridge.events()]


async def test_events_come_in_order_and_end_exactly_once() -> None:
    bridge = EventBridge(maxsize=4)

    def produce() -> None:
        for i in range(50):  # far more than the bound: the producer must wait for the consumer
            assert bridge.put(chunk(i))
        bridge.end("done")
        bridge.end("error", "late")  # a second end is ignored

    t = threading.Thread(target=produce)
    t.start()
    events = await drain(bridge)
    t.join()
    assert [e.first_frame for e in events[:-1]] == [i * 4 for i in range(50)]
    assert events[-1] == StreamEnd("done")


async def test_put_blocks_while_full_until_consumer_reads() -> None:
    bridge = EventBridge(maxsize=2)
    assert bridge.put(chunk(0)) and bridge.put(chunk(1))
    with pytest.raises(TimeoutError):
        bridge.put(chunk(2), timeout=0.05)
    it = bridge.events()
    assert (await it.__anext__()).first_frame == 0
    assert bridge.put(chunk(2), timeout=0.05)
    await it.aclose()


async def test_cancel_drops_queued_audio_and_later_events() -> None:
    aborted = threading.Event()
    bridge = EventBridge(maxsize=8, on_cancel=aborted.set)
    for i in range(3):
        bridge.put(chunk(i))
    it = bridge.events()
    assert (await it.__anext__()).first_frame == 0
    bridge.cancel()
    assert aborted.is_set()
    assert bridge.put(chunk(9)) is False  # a worker learns at its next chunk that it must stop
    assert bridge.end("done") is False
    rest = [ev async for ev in it]
    assert rest == [StreamEnd("cancelled")]


async def test_cancel_wakes_a_producer_blocked_on_a_full_queue() -> None:
    bridge = EventBridge(maxsize=1)
    bridge.put(chunk(0))
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(bridge.put(chunk(1))))
    t.start()
    time.sleep(0.05)
    assert t.is_alive()  # blocked: the queue is full and nobody reads
    bridge.cancel()
    t.join(timeout=2)
    assert result == [False]
    assert await drain(bridge) == [StreamEnd("cancelled")]


async def test_cancel_before_the_end_is_read_supersedes_it() -> None:
    bridge = EventBridge()
    bridge.put(chunk(0))
    bridge.end("done")
    bridge.cancel()
    assert await drain(bridge) == [StreamEnd("cancelled")]


async def test_cancel_after_the_end_was_read_changes_nothing() -> None:
    aborted: list[bool] = []
    bridge = EventBridge(on_cancel=lambda: aborted.append(True))
    bridge.end("done")
    assert await drain(bridge) == [StreamEnd("done")]
    bridge.cancel()
    assert aborted == []


async def test_leaving_the_loop_early_cancels_the_stream() -> None:
    bridge = EventBridge()
    for i in range(3):
        bridge.put(chunk(i))
    async for _ in bridge.events():
        break
    # the loop's async-generator finaliser runs the cleanup as a task, a loop turn or two on (the bound is
    # a hang's, in wall seconds: a loaded box can take longer than the 50 ms the old 5 turns took)
    await until(lambda: bridge.cancelled, "the stream is cancelled", 5)
    assert bridge.put(chunk(5)) is False


async def test_wakes_a_waiting_consumer_from_another_thread() -> None:
    bridge = EventBridge()
    timer = threading.Timer(0.05, lambda: (bridge.put(chunk(0)), bridge.end("done")))
    timer.start()
    events = await asyncio.wait_for(drain(bridge), timeout=2)
    assert len(events) == 2 and events[0].first_frame == 0 and events[1] == StreamEnd("done")


async def test_events_can_be_consumed_once() -> None:
    bridge = EventBridge()
    bridge.end("done")
    await drain(bridge)
    with pytest.raises(RuntimeError):
        await drain(bridge)
