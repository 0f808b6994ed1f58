"""An async session over voxgate's WebSocket protocol (`/v1/audio/speech/stream`).

    session = await voxgate_client.connect("ws://127.0.0.1:8000", voice="joe", word_timestamps=True)
    speech = session.speech()            # one utterance; session.speech(context_id="a") for a context
    await speech.send("Hello there, ")   # LLM deltas as they come; voxgate commits at boundaries
    await speech.send("how are you?")
    await speech.done()                  # input.done: flush; the socket stays open for the next one
    async for item in speech:            # Audio frames and typed events, until session.done
        ...
    await session.close()

One reader task owns the socket and hands each frame to the `Speech` it belongs to: events by their
`context_id` and `utterance_index`, binary audio to the utterance whose `audio.start` came last (the
server sends utterances strictly in order). Each speech has a bounded inbox; a consumer that stops
reading stops the reader, so the server's own flow control takes over instead of memory growing here.
What a misbehaving server (or a man in the middle) can make the client hold is bounded too (`Limits`):
one message's size, each inbox's items and bytes, and what no speech claims (audio no utterance owns
is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

from voxgate_client import messages
from voxgate_client.events import (
    Audio,
    AudioCancelled,
    AudioStart,
    AudioWords,
    CodecDone,
    CodecStart,
    Error,
    Event,
    SessionDone,
    SessionReady,
    UnknownEvent,
    Word,
    decode_event,
)
from voxgate_client.inbox import Inbox

log = logging.getLogger("voxgate_client")

STREAM_PATH = "/v1/audio/speech/stream"
Item = Event | UnknownEvent | Audio
BYTES_PER_SAMPLE = {"pcm": 2, "ulaw": 1, "alaw": 1}


class VoxgateError(Exception):
    """The server refused something (`event` is its `error`), or the session cannot do what was asked."""

    def __init__(self, message: str, event: Error | None = None) -> None:
        super().__init__(message)
        self.event = event
        self.code = event.code if event is not None else None


class SessionClosed(VoxgateError):
    """The socket closed; `close_code`/`close_reason` say how (docs/protocol.md "Close codes")."""

    def __init__(self, close_code: int | None, close_reason: str = "") -> None:
        super().__init__(f"the session closed ({close_code} {close_reason})".strip())
        self.close_code = close_code
        self.close_reason = close_reason


class Refused(VoxgateError):
    """The server refused the session before the WebSocket upgrade (HTTP `status`, 503): `code` is
    `replica_full`, `draining` or `engine_not_ready` (docs/protocol.md "Refused at the handshake"); try
    again after `retry_after_s`, or another replica."""

    def __init__(self, status: int, code: str | None, message: str, retry_after_s: float | None) -> None:
        super().__init__(f"{code or status}: {message}")
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


def _refused(e: websockets.InvalidStatus) -> Refused:
    """A handshake refusal as `Refused`: the server's error body and Retry-After, where it sent them."""
    response = e.response
    try:
        error = msgspec.json.decode(bytes(response.body or b"{}")).get("error") or {}
    except (msgspec.DecodeError, AttributeError):
        error = {}
    retry = response.headers.get("Retry-After", "")
    return Refused(response.status_code, error.get("code"), str(error.get("message", response.reason_phrase)),
                   float(retry) if retry.isdigit() else None)  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """What one session holds at most of what the server sends: a server that misbehaves, or a man in
    the middle, must not grow the client without bound."""

    # One WebSocket message, bytes (None: any size). A whole file-format utterance arrives as one message:
    # 16 MiB is ~3 min of 24 kHz wav (~87 s at 48 kHz); raise it for longer files. A larger one closes
    # the socket (1009, message too big) before it is read.
    max_frame_bytes: int | None = 16 * 2**20
    # Per speech, what is queued for its consumer: past either, the reader stops reading the socket and
    # the server's flow control takes over (a frame larger than `inbox_bytes` still gets in alone).
    inbox_items: int = 4096
    inbox_bytes: int = 32 * 2**20
    # Events no speech claims (an error naming no utterance, a late cancel's answer), kept for
    # `async for item in session`: the newest, within both bounds. Audio no speech claims is dropped.
    unclaimed_items: int = 256
    unclaimed_bytes: int = 2**20
    # Messages the websockets library reads ahead of the reader, frames: at most this × `max_frame_bytes`.
    queue_frames: int = 16


def stream_url(url: str) -> str:
    """`url` as the streaming route's WebSocket URL: http(s) becomes ws(s), a bare host gets the path."""
    parts = urlsplit(url if "://" in url else f"ws://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


async def connect(url: str, *, api_key: str | None = None, open_timeout: float = 10.0,
                  inbox_items: int | None = None, limits: Limits | None = None, **config: Any) -> Session:  # fmt: skip
    """Open a session: connect, send `session.config` (`config`: its fields; names this client does not
    know are sent as they are) and wait for `session.ready`. A refused config raises `VoxgateError`; a
    session refused before the upgrade (the replica is full, draining or not ready) raises `Refused`.
    `limits`: what the session holds at most (`Limits`); `inbox_items` overrides its `inbox_items`."""
    limits = _limits(limits, inbox_items)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        ws = await websockets.connect(stream_url(url), additional_headers=headers, open_timeout=open_timeout,
                                      max_size=limits.max_frame_bytes, max_queue=limits.queue_frames)  # fmt: skip
    except websockets.InvalidStatus as e:
        raise _refused(e) from None
    session = Session(ws, limits=limits)
    try:
        await session.configure(timeout=open_timeout, **config)
    except BaseException:
        await session.abort()
        raise
    return session


def _limits(limits: Limits | None, inbox_items: int | None) -> Limits:
    limits = limits or Limits()
    return limits if inbox_items is None else dataclasses.replace(limits, inbox_items=inbox_items)


class Speech:
    """One utterance: the text sent into it, and the audio and events that come back for it.

    Iterate it for `Audio` frames and its events, in order; iteration ends after its last event
    (`session.done`, or `audio.cancelled` when cancelled), which `result` then holds.
    """

    def __init__(self, session: Session, context_id: str | None) -> None:
        self.session = session
        self.context_id = context_id
        self.utterance_index: int | None = None  # known at the first send (without a context) or event
        self.words: list[Word] = []  # every word timing received so far
        self.received_bytes = 0  # audio bytes received
        self.sample_rate = session.ready.sample_rate
        self.format = session.ready.format
        self.result: SessionDone | AudioCancelled | CodecDone | None = None
        self.sent_text = False
        self.input_done = False  # input.done sent (or the server finished the utterance)
        self.cancelled = False  # cancelled from here: audio still queued or arriving is dropped
        self.ended = asyncio.Event()
        self._inbox: Inbox[Item | None] = Inbox(session.limits.inbox_items, session.limits.inbox_bytes)
        self._closed_error: SessionClosed | None = None

    def __repr__(self) -> str:
        return f"Speech(utterance_index={self.utterance_index}, context_id={self.context_id!r})"

    # -- sending ------------------------------------------------------------------------------------

    async def send(self, text: str) -> None:
        """Append `text` verbatim (send your own spaces between deltas)."""
        if self.input_done or self.cancelled:
            raise VoxgateError(f"{self!r} is finished; open another speech")
        if not text:
            return
        self.session._opening(self)
        self.sent_text = True
        await self.session._send(messages.InputText(text=text, context_id=self.context_id))

    async def done(self) -> None:
        """`input.done`: commit the tail and finish the utterance (the socket stays open)."""
        if self.input_done or self.cancelled:
            return
        self.input_done = True
        self.session._closing(self)
        if not self.sent_text:  # the server never opened it: nothing will come back
            self._end(None)
            return
        await self.session._send(messages.InputDone(context_id=self.context_id))

    async def cancel(self, played_ms: float | None = None, timeout: float = 5.0) -> AudioCancelled | None:
        """Barge in: the server drops this utterance's text and audio; audio already queued here is dropped
        too. `played_ms`: how much of its audio the listener heard (the answer's `heard_text` says what
        that was). Without contexts the protocol cancels every utterance of the socket, and so does this.
        Returns the `audio.cancelled` that answered (None: the speech had ended before the cancel)."""
        if self.context_id is None:
            answers = await self.session.cancel(played_ms=played_ms, timeout=timeout)
        else:
            answers = await self.session.cancel(context_id=self.context_id, played_ms=played_ms, timeout=timeout)
        return next((a for a in answers if a.utterance_index == self.utterance_index), None)

    # -- receiving ----------------------------------------------------------------------------------

    @property
    def received_ms(self) -> float:
        """Milliseconds of audio received so far (PCM, u-law, a-law)."""
        per_sample = BYTES_PER_SAMPLE.get(self.format, 2)
        return self.received_bytes / per_sample / self.sample_rate * 1000

    def __aiter__(self) -> AsyncIterator[Item]:
        return self

    async def __anext__(self) -> Item:
        item = await self._inbox.get()
        if item is None:
            self._inbox.put_nowait(None)  # iterating again ends again
            if self._closed_error is not None:
                raise self._closed_error
            raise StopAsyncIteration
        return item

    async def collect(self, timeout: float | None = 60.0) -> tuple[bytes, list[Event | UnknownEvent]]:
        """Everything until the speech ends: its audio, and its events."""
        audio, events = bytearray(), []
        async with asyncio.timeout(timeout):
            async for item in self:
                if isinstance(item, Audio):
                    audio += item.data
                else:
                    events.append(item)
        return bytes(audio), events

    async def wait(self, timeout: float | None = None) -> SessionDone | AudioCancelled | CodecDone | None:
        """Wait until the speech ended (without consuming its items); its last event."""
        async with asyncio.timeout(timeout):
            await self.ended.wait()
        return self.result

    async def _deliver(self, item: Item, size: int) -> None:
        if isinstance(item, Audio):
            if self.cancelled:
                return  # a cancelled utterance's audio never plays
            self.received_bytes += len(item.data)
        elif isinstance(item, AudioWords):
            self.words.extend(item.words)
        elif isinstance(item, AudioStart | CodecStart):
            self.sample_rate = item.sample_rate
            self.format = item.format if isinstance(item, AudioStart) else "codec"
        await self._inbox.put(item, size)
        if _ends(item):
            self._end(item)  # type: ignore[arg-type]

    def _end(self, result: SessionDone | AudioCancelled | CodecDone | None,
             closed: SessionClosed | None = None) -> None:  # fmt: skip
        if self.ended.is_set():
            return
        self.result, self._closed_error = result, closed
        self.input_done = True
        self._inbox.put_nowait(None)
        self.ended.set()
        self.session._forget(self)

    def _drop_audio(self) -> None:
        self.cancelled = True
        self._inbox.purge(lambda item: isinstance(item, Audio))


def _ends(item: Item) -> bool:
    """The last event of an utterance."""
    if isinstance(item, CodecDone):
        return item.cancelled  # a finished codec utterance still gets its session.done
    return isinstance(item, SessionDone | AudioCancelled)


class Session:
    """One WebSocket session (see the module's docstring). Open it with `connect()`."""

    def __init__(self, ws: ClientConnection, inbox_items: int | None = None, limits: Limits | None = None) -> None:
        self.websocket = ws
        self.limits = _limits(limits, inbox_items)
        self.ready: SessionReady = SessionReady(session_id="", sample_rate=0, format="pcm")
        self._next_index = 0  # the server's utterance_index of the next utterance opened without a context
        self._open: Speech | None = None  # the utterance receiving text, without a context
        self._open_contexts: dict[str, Speech] = {}
        self._by_index: dict[int, Speech] = {}  # speeches without a context, by utterance_index
        self._by_context: dict[str, deque[Speech]] = {}  # per context, in order
        self._audio_owner: Speech | None = None
        self._audio_key: tuple[int | None, str | None] = (None, None)
        self._audio_offset = 0
        # What no speech claims (an error about the session, a late cancel's answer): the newest kept, with
        # their sizes (Limits.unclaimed_items, unclaimed_bytes).
        self._unclaimed: deque[tuple[Item, int]] = deque()
        self._unclaimed_bytes = 0
        self.dropped = 0  # frames dropped: audio no speech claimed, unclaimed events past the bounds
        self._unclaimed_ready = asyncio.Event()
        self._config_waiter: asyncio.Future[SessionReady] | None = None
        self._cancel_waiters: deque[asyncio.Future[AudioCancelled]] = deque()
        self._send_lock = asyncio.Lock()
        self.closed: SessionClosed | None = None
        self._reader = asyncio.create_task(self._read(), name="voxgate_client.reader")

    # -- configuration and lifecycle ----------------------------------------------------------------------

    async def configure(self, timeout: float = 10.0, **config: Any) -> SessionReady:
        """Send `session.config` (first, or again between utterances) and wait for `session.ready`."""
        known = {k: v for k, v in config.items() if k in messages.CONFIG_FIELDS}
        extra = {k: v for k, v in config.items() if k not in messages.CONFIG_FIELDS}
        self._config_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._send(messages.SessionConfig(**known), extra)
            async with asyncio.timeout(timeout):
                self.ready = await self._config_waiter
        finally:
            self._config_waiter = None
        self._next_index = self.ready.next_utterance_index
        return self.ready

    async def close(self, timeout: float = 10.0) -> None:
        """`session.close`: the server finishes what is open and sends the audio owed, then closes."""
        if self.closed is None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await self._send(messages.SessionClose())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        await self.abort()

    async def abort(self) -> None:
        """Close the socket now (what is playing is cut)."""
        await self.websocket.close()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._reader, 5.0)

    async def wait_closed(self) -> SessionClosed:
        """Wait until the socket is closed; how."""
        await asyncio.shield(self._reader)
        assert self.closed is not None
        return self.closed

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- utterances -----------------------------------------------------------------------------------

    @property
    def taking_text(self) -> bool:
        """Whether an utterance is open for text (a config sent now would be refused mid utterance)."""
        return self._open is not None or bool(self._open_contexts)

    def speech(self, context_id: str | None = None) -> Speech:
        """A new utterance (in context `context_id`, when the server has contexts). Without a context only
        one utterance takes text at a time: finish it (`done()`) before opening the next."""
        if self.closed is not None:
            raise self.closed
        return Speech(self, context_id)

    async def say(self, text: str, context_id: str | None = None) -> Speech:
        """One whole utterance: `text`, then `input.done`. Iterate the returned speech for its audio."""
        speech = self.speech(context_id)
        await speech.send(text)
        await speech.done()
        return speech

    async def cancel(self, context_id: str | None = None, played_ms: float | None = None,
                     timeout: float = 5.0) -> list[AudioCancelled]:  # fmt: skip
        """`input.cancel` (of one context, or without one of every utterance) and its answers: one
        `audio.cancelled` per utterance it cut, or the one saying nothing was left to cut."""
        if context_id is None:
            hit = [s for s in self._live() if s.context_id is None]
        else:
            hit = list(self._by_context.get(context_id, ())) + [
                s for s in [self._open_contexts.get(context_id)] if s is not None and s.sent_text
            ]
        hit = list(dict.fromkeys(hit))
        for speech in hit:
            speech._drop_audio()
        if self._open is not None and self._open in hit:
            self._open = None
        if context_id is not None:
            self._open_contexts.pop(context_id, None)
        waiter = asyncio.get_running_loop().create_future()
        self._cancel_waiters.append(waiter)
        try:
            await self._send(messages.InputCancel(context_id=context_id, played_ms=played_ms))
            async with asyncio.timeout(timeout):
                if not hit:
                    return [await waiter]
                await asyncio.gather(*(s.ended.wait() for s in hit))
        finally:
            if waiter in self._cancel_waiters:
                self._cancel_waiters.remove(waiter)
        return [s.result for s in hit if isinstance(s.result, AudioCancelled)]

    def __aiter__(self) -> AsyncIterator[Item]:
        return self

    async def __anext__(self) -> Item:
        """What no speech claimed (errors about the session, answers to late cancels); ends when closed."""
        while not self._unclaimed:
            if self.closed is not None:
                raise StopAsyncIteration
            self._unclaimed_ready.clear()
            ready = asyncio.ensure_future(self._unclaimed_ready.wait())
            try:
                await asyncio.wait({self._reader, ready}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
        item, size = self._unclaimed.popleft()
        self._unclaimed_bytes -= size
        return item

    @property
    def inbox_items(self) -> int:
        return self.limits.inbox_items

    def _stray(self, item: Item, size: int) -> None:
        """Keep what no speech claims, the newest within the bounds; audio no speech owns is dropped."""
        if isinstance(item, Audio):
            self._dropped(f"{size} bytes of audio no utterance owns")
            return
        self._unclaimed.append((item, size))
        self._unclaimed_bytes += size
        limits = self.limits
        while self._unclaimed and (len(self._unclaimed) > limits.unclaimed_items
                                   or self._unclaimed_bytes > limits.unclaimed_bytes):  # fmt: skip
            old, old_size = self._unclaimed.popleft()
            self._unclaimed_bytes -= old_size
            self._dropped(f"an unclaimed {type(old).__name__} of {old_size} bytes (past the unclaimed bounds)")
        if self._unclaimed:
            self._unclaimed_ready.set()

    def _dropped(self, what: str) -> None:
        if self.dropped == 0:  # said once per session: a misbehaving server must not flood the log either
            log.warning("voxgate_client: dropped %s; further drops are counted in Session.dropped", what)
        self.dropped += 1

    # -- bookkeeping (called by Speech) ------------------------------------------------------------------

    def _live(self) -> list[Speech]:
        live = list(self._by_index.values())
        for queue in self._by_context.values():
            live.extend(queue)
        return live

    def _opening(self, speech: Speech) -> None:
        """`speech` is about to send text: the server opens an utterance for it at its first text."""
        if self.closed is not None:
            raise self.closed
        if speech.sent_text:
            return
        if speech.context_id is None:
            if self._open is not None and self._open is not speech:
                raise VoxgateError("another utterance is still taking text: call done() on it first")
            self._open = speech
            speech.utterance_index = self._next_index
            self._next_index += 1
            self._by_index[speech.utterance_index] = speech
        else:
            current = self._open_contexts.get(speech.context_id)
            if current is not None and current is not speech:
                raise VoxgateError(f"context {speech.context_id!r} already has an utterance taking text")
            self._open_contexts[speech.context_id] = speech
            self._by_context.setdefault(speech.context_id, deque()).append(speech)

    def _closing(self, speech: Speech) -> None:
        if self._open is speech:
            self._open = None
        if speech.context_id is not None and self._open_contexts.get(speech.context_id) is speech:
            del self._open_contexts[speech.context_id]

    def _forget(self, speech: Speech) -> None:
        self._closing(speech)
        if speech.utterance_index is not None and self._by_index.get(speech.utterance_index) is speech:
            del self._by_index[speech.utterance_index]
        if speech.context_id is not None and speech in (queue := self._by_context.get(speech.context_id, deque())):
            queue.remove(speech)
            if not queue:
                del self._by_context[speech.context_id]
        if self._audio_owner is speech:
            self._audio_owner = None

    async def _send(self, message: messages.Message, extra: dict[str, Any] | None = None) -> None:
        if self.closed is not None:
            raise self.closed
        async with self._send_lock:
            await self.websocket.send(messages.encode(message, extra))

    # -- the reader ---------------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for frame in self.websocket:
                if isinstance(frame, bytes):
                    await self._route_audio(frame)
                    continue
                size = len(frame)
                try:
                    event = decode_event(frame)
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    log.warning("voxgate_client: an event that does not decode was skipped: %s", e)
                    continue
                await self._route(event, size)
        except websockets.ConnectionClosed:
            pass
        finally:
            self._closed()

    async def _route_audio(self, data: bytes) -> None:
        index, context_id = self._audio_key
        item = Audio(data=data, utterance_index=index, context_id=context_id, offset=self._audio_offset)
        self._audio_offset += len(data)
        if self._audio_owner is not None:
            await self._audio_owner._deliver(item, len(data))
        else:
            self._stray(item, len(data))

    async def _route(self, event: Event | UnknownEvent, size: int) -> None:
        if isinstance(event, SessionReady):
            if self._config_waiter is not None and not self._config_waiter.done():
                self._config_waiter.set_result(event)
            return
        waiting = self._config_waiter is not None and not self._config_waiter.done()
        if waiting and isinstance(event, Error) and event.utterance_index is None and event.context_id is None:
            self._config_waiter.set_exception(VoxgateError(f"{event.code}: {event.message}", event))  # type: ignore[union-attr]
            return
        speech = self._owner(event)
        if isinstance(event, AudioStart | CodecStart):
            self._audio_owner, self._audio_offset = speech, 0
            self._audio_key = (event.utterance_index, event.context_id)
        if isinstance(event, Error) and speech is not None and event.code in ("engine_error", "utterance_timeout"):
            self._closing(speech)  # the server finished the utterance: later text opens the next one
            speech.input_done = True
        if speech is not None:
            await speech._deliver(event, size)
            return
        if isinstance(event, AudioCancelled):
            while self._cancel_waiters:
                waiter = self._cancel_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(event)
                    break
        self._stray(event, size)

    def _owner(self, event: Event | UnknownEvent) -> Speech | None:
        index = event.fields.get("utterance_index") if isinstance(event, UnknownEvent) else getattr(
            event, "utterance_index", None)  # fmt: skip
        if event.context_id is not None:
            queue = self._by_context.get(event.context_id, deque())
            for speech in queue:
                if speech.utterance_index == index:
                    return speech
            for speech in queue:  # the context's oldest utterance the server has not named yet
                if speech.utterance_index is None:
                    speech.utterance_index = index
                    return speech
            return None
        return self._by_index.get(index) if isinstance(index, int) else None

    def _closed(self) -> None:
        code, reason = self.websocket.close_code, self.websocket.close_reason or ""
        sent = getattr(self.websocket.protocol, "close_sent", None)
        if self.websocket.protocol.close_rcvd is None and sent is not None:  # the client closed it (1009: too big)
            code, reason = sent.code, sent.reason
        self.closed = SessionClosed(code, reason)
        for speech in self._live() + [s for s in (self._open, *self._open_contexts.values()) if s is not None]:
            speech._end(None, self.closed)
        for waiter in (self._config_waiter, *self._cancel_waiters):
            if waiter is not None and not waiter.done():
                waiter.set_exception(self.closed)
