"""LoopWaker: wake-ups from other threads reach the loop, and a burst of them costs one callback."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from engine.stream import EventBridge, LoopWaker
from engine.types import AudioChunk, StreamEnd


async def test_a_burst_of_wakeups_from_a_thread_is_one_callback_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    waker = LoopWaker.of(loop)
    assert LoopWaker.of(loop) is waker
    events = [asyncio.Event() for _ in range(100)]
    scheduled = 0
    real = loop.call_soon_threadsafe

    def counting(*args: object) -> object:
        nonlocal scheduled
        scheduled += 1
        return real(*args)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        t = threading.Thread(target=lambda: [waker.wake(e) for e in events])  # the loop is parked meanwhile
        t.start()
        t.join(5)
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 5)
    finally:
        del loop.call_soon_threadsafe
    assert scheduled == 1


async def test_bridges_fed_from_a_thread_deliver_everything_in_order() -> None:
    bridges = [EventBridge(maxsize=4) for _ in range(16)]
    got: list[list[int]] = [[] for _ in bridges]

    async def consume(i: int) -> None:
        async for ev in bridges[i].events():
            if isinstance(ev, AudioChunk):
                got[i].append(ev.first_frame)
            else:
                assert isinstance(ev, StreamEnd) and ev.reason == "done"

    def produce() -> None:
        for n in range(50):
            for b in bridges:
                b.put(AudioChunk(np.zeros(10, np.int16), 24000, n, 0), timeout=5)
        for b in bridges:
            b.end()

    consumers = [asyncio.create_task(consume(i)) for i in range(len(bridges))]
    await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(asyncio.to_thread(produce), *consumers), 10)
    assert all(g == list(range(50)) for g in got)
