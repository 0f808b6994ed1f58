"""A bounded FIFO between the socket reader and one consumer, from which queued items can be purged
(a cancelled utterance's audio must not play after the cancel, even if it arrived before it)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """At most `bound` items and `max_bytes` bytes (each item's size is given when it is put; an item
    bigger than `max_bytes` still gets in alone, so one large frame never deadlocks its reader)."""

    def __init__(self, bound: int, max_bytes: int | None = None) -> None:
        self._items: deque[tuple[T, int]] = deque()
        self._bound = bound
        self._max_bytes = max_bytes
        self._bytes = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """Bytes queued (as their sizes were given)."""
        return self._bytes

    def _full(self) -> bool:
        if len(self._items) >= self._bound:
            return True
        return self._max_bytes is not None and bool(self._items) and self._bytes >= self._max_bytes

    async def put(self, item: T, size: int = 0) -> None:
        """Queue `item`, waiting while the inbox is full: the reader stops reading the socket, so a slow
        consumer slows the server (its flow control) instead of growing this process without bound."""
        while self._full():
            self._writable.clear()
            await self._writable.wait()
        self.put_nowait(item, size)

    def put_nowait(self, item: T, size: int = 0) -> None:
        """Queue `item` past the bound (for the few end-of-stream items that must always get in)."""
        self._items.append((item, size))
        self._bytes += size
        self._readable.set()

    async def get(self) -> T:
        while not self._items:
            self._readable.clear()
            await self._readable.wait()
        item, size = self._items.popleft()
        self._bytes -= size
        self._writable.set()
        return item

    def purge(self, drop: Callable[[T], bool]) -> int:
        """Remove the queued items `drop` selects; how many went."""
        kept = deque(entry for entry in self._items if not drop(entry[0]))
        removed = len(self._items) - len(kept)
        self._items = kept
        self._bytes = sum(size for _, size in kept)
        self._writable.set()
        return removed
