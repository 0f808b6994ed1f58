"""The thread → asyncio bridge every backend uses to hand a stream's events to the event loop.

Worker threads produce `AudioChunk`s / `CodecFrames` (and `Waiting` notices) with `put` (blocking while
the bounded queue is full: that is the backpressure a slow client exerts) and finish with `end`. The
event loop consumes with `async for ev in bridge.events()`; it never blocks on the producer, it only
takes a short lock.

Guarantees (what a pump relies on, whichever backend is behind it):
- events come out in the order they were put;
- the consumer sees exactly one `StreamEnd`, and it is the last event;
- `cancel()` drops the audio still queued, makes every later `put` a no-op that returns False (so a
  worker stops at its next chunk), wakes blocked producers, and ends the stream with
  `StreamEnd("cancelled")` unless the consumer has already received its `StreamEnd`;
- leaving the `async for` early (break, task cancelled) cancels the stream, so work is freed.

Wake-ups: a producer wakes its consumer through its loop's `LoopWaker`, which gathers the wake-ups that
come from any thread while the loop is busy into one `call_soon_threadsafe` (a self-pipe write and a
loop iteration each). An engine thread that hands out a batch of chunks for many streams at once (the
engine process's I/O thread reads up to 64 messages per poll) then costs the loop one wake-up, not one
per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import ClassVar

from engine.types import AudioChunk, CodecFrames, StreamEnd, StreamEvent, Waiting


class LoopWaker:
    """Sets asyncio Events of one loop from other threads, batched: the first `wake` while none is
    pending schedules one callback on the loop, and every `wake` until it runs rides along with it."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker]] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: list[asyncio.Event] = []
        self._pending_lock = threading.Lock()

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopWaker:
        """The loop's waker (one per loop, gone with it)."""
        with cls._lock:
            waker = cls._by_loop.get(loop)
            if waker is None:
                waker = cls._by_loop[loop] = cls(loop)
            return waker

    def wake(self, event: asyncio.Event) -> None:
        """Set `event` on the loop soon (from any thread)."""
        with self._pending_lock:
            self._pending.append(event)
            if len(self._pending) > 1:
                return  # a callback is scheduled and has not run yet: it sets this one too
        # A RuntimeError means the loop is closed: nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._set_pending)

    def _set_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for event in pending:
            event.set()


class EventBridge:
    """A bounded, thread-safe queue of stream events with an async consumer side.

    `on_cancel` (optional) runs once, in the thread that called `cancel`, after the stream is marked
    cancelled: backends use it to abort the work in flight (e.g. terminate a model run).
    """

    def __init__(self, maxsize: int = 64, on_cancel: Callable[[], None] | None = None) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._maxsize = maxsize
        self._on_cancel = on_cancel
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._items: deque[AudioChunk | CodecFrames | Waiting] = deque()
        self._end: StreamEnd | None = None  # the end decided so far (first one wins)
        self._end_delivered = False
        self._cancelled = False
        self._consuming = False
        self._waker: LoopWaker | None = None
        self._wakeup: asyncio.Event | None = None

    # ---- producer side (any thread) ----

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def ended(self) -> bool:
        """True once an end is decided: producers should stop."""
        return self._end is not None

    @property
    def queued(self) -> int:
        """Events queued for the consumer, not yet read."""
        with self._lock:
            return len(self._items)

    def put(self, chunk: AudioChunk | CodecFrames | Waiting, timeout: float | None = None) -> bool:
        """Queue `chunk`, waiting while the queue is full. False: dropped (stream cancelled/ended).

        Raises TimeoutError if `timeout` passes with the queue still full.
        """
        with self._not_full:
            ok = self._not_full.wait_for(
                lambda: self._end is not None or len(self._items) < self._maxsize, timeout
            )
            if self._end is not None:
                return False
            if not ok:
                raise TimeoutError("stream consumer is not reading")
            self._items.append(chunk)
        self._wake()
        return True

    def offer(self, chunk: AudioChunk | CodecFrames | Waiting) -> bool | None:
        """`put` that never waits: True queued, False dropped (stream cancelled/ended), None full. For a
        producer whose own credit bounds what it sends (the engine process's I/O thread): no Condition
        wait, one lock, per event."""
        with self._lock:
            if self._end is not None:
                return False
            if len(self._items) >= self._maxsize:
                return None
            self._items.append(chunk)
        self._wake()
        return True

    def end(self, reason: str = "done", message: str = "", code: str = "") -> bool:
        """Decide the stream's end (never blocks; the end does not count against the bound).

        Only the first call counts; returns whether this one did. `code`: see `StreamEnd`.
        """
        with self._lock:
            if self._end is not None:
                return False
            self._end = StreamEnd(reason, message, code)  # type: ignore[arg-type]
            self._not_full.notify_all()
        self._wake()
        return True

    # ---- consumer side ----

    def cancel(self) -> None:
        """Barge-in: drop queued audio and end with "cancelled" (idempotent, thread-safe)."""
        with self._lock:
            if self._cancelled or self._end_delivered:
                return
            self._cancelled = True
            self._items.clear()
            # An end decided but not yet delivered is superseded: no audio follows a cancel anyway.
            self._end = StreamEnd("cancelled")
            self._not_full.notify_all()
        self._wake()
        if self._on_cancel is not None:
            self._on_cancel()

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Yield the events in order, ending with exactly one `StreamEnd`. One consumer only."""
        with self._lock:
            if self._consuming:
                raise RuntimeError("a stream's events can be consumed only once")
            self._consuming = True
            self._waker = LoopWaker.of(asyncio.get_running_loop())
            self._wakeup = asyncio.Event()
        wakeup = self._wakeup
        try:
            while True:
                with self._lock:
                    if self._items:
                        ev: StreamEvent | None = self._items.popleft()
                        self._not_full.notify()
                    elif self._end is not None:
                        ev = self._end
                        self._end_delivered = True
                    else:
                        ev = None
                        # Cleared under the lock: a producer's wake-up scheduled after this is not lost.
                        wakeup.clear()
                if ev is None:
                    await wakeup.wait()
                    continue
                yield ev
                if isinstance(ev, StreamEnd):
                    return
        finally:
            if not self._end_delivered:
                self.cancel()

    def _wake(self) -> None:
        waker, wakeup = self._waker, self._wakeup
        if waker is None or wakeup is None:
            return  # nobody consuming yet: events() checks the queue before it waits
        waker.wake(wakeup)
