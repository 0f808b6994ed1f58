"""`ProcessStream`: one stream of an engine in a child process (the `Stream` protocol, engine/types.py).

The stream owns what the parent knows of one child stream: its `EventBridge` (so any event loop may
consume its audio), the bound on text not yet spoken, and the credit it gives back as its consumer reads
(engine/process/wire.py), so a consumer that stops reading stops the child stream too. It reaches its
engine only through two callables: `send` (queue a command for the child) and `forget` (drop the stream
from the engine's table). `event_of` turns a stream message from the child into the event it stands for.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import numpy as np

from engine.process import wire
from engine.stream import EventBridge
from engine.types import (
    AudioChunk,
    CodecFrames,
    EngineError,
    StreamEnd,
    StreamEvent,
    Waiting,
    Words,
    WordTiming,
)

StreamMessage = wire.Audio | wire.Codec | wire.WordsMsg | wire.Wait


def event_of(msg: StreamMessage, payload: bytes) -> AudioChunk | CodecFrames | Words | Waiting:
    """The stream event a child's message carries (audio and codes in `payload`, int16)."""
    if isinstance(msg, wire.Audio):
        return AudioChunk(np.frombuffer(payload, dtype=np.int16), msg.sample_rate, msg.first_frame, msg.segment)
    if isinstance(msg, wire.Codec):
        codes = np.frombuffer(payload, dtype=np.int16).reshape(-1, msg.codebooks)
        return CodecFrames(codes, msg.first_frame, msg.segment, msg.prime)
    if isinstance(msg, wire.WordsMsg):
        timings = tuple(WordTiming(w, start, end) for w, start, end in msg.words)
        return Words(msg.segment, msg.sample_rate, timings, msg.estimated)
    return Waiting(msg.reason, msg.ahead)


class ProcessStream:
    """One stream of a `ProcessEngine` (the `Stream` protocol)."""

    def __init__(self, sid: int, max_pending: int | None, *, send: Callable[[wire.Command], None],
                 forget: Callable[[int], None]) -> None:
        self.sid = sid
        self._send, self._forget = send, forget
        self._bridge = EventBridge(wire.WINDOW + 2, on_cancel=self._cancelled)
        self._max_pending = max_pending
        self._lengths: list[int] = []  # characters of each append, by engine index
        self._pending = 0  # characters appended whose audio has not yet been read past
        self._heard = 0  # appends before this one are heard
        self._finished = False

    def append(self, text: str) -> None:
        """Queue one segment. The engine's own bound on text not yet spoken is judged here (counting
        text as pending until audio of a later segment has been read: never less than the child's
        count), so `queue_full` is raised at once, as in-process."""
        if self._finished:
            raise EngineError("invalid_state", "append after finish")
        if not isinstance(text, str):
            raise EngineError("invalid_text", "append takes a string")
        index = len(self._lengths)
        if self._bridge.ended:
            self._lengths.append(0)
            return
        if self._max_pending is not None and self._pending + len(text) > self._max_pending:
            self._lengths.append(0)
            self._send(wire.Append(self.sid, ""))  # the child counts segments by appends
            raise EngineError("queue_full", f"segment {index} refused: the stream already holds {self._pending} "
                                            f"characters not yet spoken (at most {self._max_pending})")
        self._lengths.append(len(text))
        self._pending += len(text)
        self._send(wire.Append(self.sid, text))

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            if not self._bridge.ended:
                self._send(wire.Finish(self.sid))

    def cancel(self) -> None:
        self._bridge.cancel()  # drops audio queued here, ends "cancelled", then tells the child (_cancelled)

    def put(self, event: AudioChunk | CodecFrames | Words | Waiting) -> bool:
        """Hand the consumer one event from the child; False when it overran the credit window."""
        return self._bridge.offer(event) is not None  # never blocks: the credit window bounds what comes

    def end(self, reason: str, message: str = "", code: str = "") -> None:
        self._bridge.end(reason, message, code)

    def _cancelled(self) -> None:
        self._forget(self.sid)
        with contextlib.suppress(EngineError):  # a child gone or swamped has no stream to cancel
            self._send(wire.Cancel(self.sid))

    def _read_past(self, segment: int) -> None:
        while self._heard < segment and self._heard < len(self._lengths):
            self._pending -= self._lengths[self._heard]
            self._heard += 1

    async def events(self) -> AsyncIterator[StreamEvent]:
        consumed = 0
        async with contextlib.aclosing(self._bridge.events()) as events:  # leaving early cancels the stream
            async for ev in events:
                yield ev
                if isinstance(ev, StreamEnd):
                    return
                # Back here: the consumer has taken `ev` and asks for more, so the child may send more.
                if isinstance(ev, AudioChunk | CodecFrames):
                    self._read_past(ev.segment)
                consumed += 1
                if consumed >= wire.CREDIT_BATCH and not self._bridge.ended:
                    with contextlib.suppress(EngineError):
                        self._send(wire.Credit(self.sid, consumed))
                    consumed = 0
