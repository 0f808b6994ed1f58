"""A bounded FIFO between the socket reader and one consumer, from which queued items can be purged
(a cancelled utterance's audio must not play after the cancel, even if it arrived before it)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    def __init__(self, bound: int) -> None:
        self._items: deque[T] = deque()
        self._bound = bound
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> None:
        """Queue `item`, waiting while the inbox is full: the reader stops reading the socket, so a slow
        consumer slows the server (its flow control) instead of growing this process without bound."""
        while len(self._items) >= self._bound:
            self._writable.clear()
            await self._writable.wait()
        self.put_nowait(item)

    def put_nowait(self, item: T) -> None:
        """Queue `item` past the bound (for the few end-of-stream items that must always get in)."""
        self._items.append(item)
        self._readable.set()

    async def get(self) -> T:
        while not self._items:
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        self._writable.set()
        return item

    def purge(self, drop: Callable[[T], bool]) -> int:
        """Remove the queued items `drop` selects; how many went."""
        kept = deque(item for item in self._items if not drop(item))
        removed = len(self._items) - len(kept)
        self._items = kept
        self._writable.set()
        return removed
