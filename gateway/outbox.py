"""The connection's outbox: every frame the server sends waits here, bounded, for the one writer task.

A client that stops reading fills it; a put that waits past `send_timeout` raises `SlowClient`, so the
connection is dropped instead of holding memory or stalling anyone else. Audio of a cancelled utterance
is purged, and audio that arrives for it afterwards never gets in.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from gateway import metrics


class SlowClient(Exception):
    """The client stopped reading and its outbox stayed full."""


@dataclass(slots=True)
class Outgoing:
    data: bytes | str  # str: a JSON event; bytes: audio
    utterance: int | None = None
    last: bool = False  # the writer's stop signal
    audio: bool = False  # a JSON event that carries audio (vLLM-Omni's audio.chunk): purged on cancel too

    @property
    def is_audio(self) -> bool:
        return self.audio or isinstance(self.data, bytes)


class Outbox:
    """A bounded queue of frames for the writer; audio of a cancelled utterance can be purged.

    Plain events rather than a Condition: every check-and-modify runs without an await between,
    which is atomic on the event loop.
    """

    def __init__(self, maxsize: int, put_timeout: float) -> None:
        self._items: deque[Outgoing] = deque()
        self._maxsize = maxsize
        self._put_timeout = put_timeout
        self._space = asyncio.Event()
        self._ready = asyncio.Event()
        self._cancelled: set[int] = set()
        metrics.track_outbox(self)

    def __len__(self) -> int:
        return len(self._items)

    def queued(self) -> int:
        """Frames waiting to be sent (the writer's stop signal not counted): `voxgate_outbox_frames`."""
        items = self._items
        return len(items) - (1 if items and items[-1].last else 0)

    async def put(self, item: Outgoing) -> None:
        if len(self._items) >= self._maxsize:  # a timer only for a put that has to wait: most never do
            await self._wait_for_space()
        # Checked after any wait: audio of an utterance cancelled meanwhile never gets in.
        if item.is_audio and item.utterance in self._cancelled:
            return
        self._items.append(item)
        self._ready.set()

    async def _wait_for_space(self) -> None:
        try:
            async with asyncio.timeout(self._put_timeout):
                while len(self._items) >= self._maxsize:
                    self._space.clear()
                    await self._space.wait()
        except TimeoutError:
            raise SlowClient from None

    def discard(self) -> None:
        """Drop whatever the writer did not send (the connection is gone)."""
        self._items.clear()

    def close(self) -> None:
        """Tell the writer to stop once what is queued has been sent (bypasses the bound)."""
        self._items.append(Outgoing(b"", None, last=True))
        self._ready.set()

    def get_nowait(self) -> Outgoing | None:
        """The next frame, or None when none waits (the writer's fast path: no coroutine per frame)."""
        if not self._items:
            return None
        item = self._items.popleft()
        self._space.set()
        return item

    async def get(self) -> Outgoing:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._space.set()
        return item

    def cancel_audio(self, utterance: int) -> None:
        self._cancelled.add(utterance)  # until `settled`: bounded by the open utterances
        self._items = deque(i for i in self._items if not (i.is_audio and i.utterance == utterance))
        self._space.set()

    def settled(self, utterance: int) -> None:
        """The utterance's pump has ended: no more of its audio can come, so forget its cancel."""
        self._cancelled.discard(utterance)
