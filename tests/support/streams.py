"""Reading an engine stream in tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from engine.types import StreamEnd, Waiting


async def collect(stream: Any, timeout: float = 60.0, *, waiting: bool = False) -> tuple[list[Any], StreamEnd]:
    """A stream's events before its `StreamEnd`, and the end itself, which must come within `timeout`.
    `Waiting` notices are left out unless `waiting`."""
    events: list[Any] = []

    async def run() -> StreamEnd:
        async for ev in stream.events():
            if isinstance(ev, StreamEnd):
                return ev
            if waiting or not isinstance(ev, Waiting):
                events.append(ev)
        raise AssertionError("events() ended without a StreamEnd")

    return events, await asyncio.wait_for(run(), timeout)


async def next_audio(events: AsyncIterator[Any], skip: tuple[str, ...] = ("capacity", "pacing")) -> Any:
    """The stream's next event that is not a `Waiting` of a reason in `skip` (a worker; the first-audio
    hold, which says `Waiting("pacing")` once, before the audio it holds)."""
    paced = 0
    async for ev in events:
        if not isinstance(ev, Waiting) or ev.reason not in skip:
            return ev
        paced += ev.reason == "pacing"
        assert paced <= 1, "the hold is told once"
    raise AssertionError("events() ended")
