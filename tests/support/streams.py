"""Reading an engine stream in tests."""

from __future__ import annotations

import asyncio
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
