"""Waiting in tests for something another thread or task does: bounded, with what failed to happen
named. One place polls, so a test says what it waits for, not how often it looks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def _told(what: object) -> object:
    """`what`, or what it returns when it is a function (a message read only at the failure)."""
    return what() if callable(what) else what


async def until(check: Callable[[], object], what: object, timeout: float = 30.0, every: float = 0.005) -> None:
    """Until `check()` is true; an AssertionError saying `what` did not happen once `timeout` wall seconds
    have passed. Looks every `every` seconds, yielding the event loop between looks."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, (f"not within {timeout} s", _told(what))
        await asyncio.sleep(every)


def until_blocking(check: Callable[[], object], what: object, timeout: float = 30.0, every: float = 0.005) -> None:
    """`until` for a test with no event loop (a thread of its own waits for the others)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, (f"not within {timeout} s", _told(what))
        time.sleep(every)
