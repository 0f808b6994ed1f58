"""The shared core of the provider protocols: a native `Connection` driven through a translation.

A provider socket is not a second gateway. Its messages become native ones (`session.config`,
`input.text`, `input.done`, `input.cancel`, `session.close`) read by an ordinary `Connection` (the same
intake, contexts, admission, playout and bounds as `/v1/audio/speech/stream`), and the Connection's events
become the provider's messages on the way out. A `Wire` (one per wire format) does both translations;
the `Bridge` plugs it between the socket and the Connection.

What the provider's "end of a context" means is kept per context as a queue of `Marker`s, one per native
`input.done` sent: each `session.done` of that context (they come in order, after the context's audio)
takes the next marker and says what it was (a flush, the context's end, a Cartesia `done`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import msgspec
from msgspec import UNSET, UnsetType

from gateway.protocol import (
    MAX_MESSAGE_BYTES,
    AudioCancelled,
    AudioDone,
    AudioStart,
    AudioWords,
    Error,
    Event,
    InputCancel,
    InputDone,
    InputText,
    ProtocolError,
    SessionClose,
    SessionDone,
)

if TYPE_CHECKING:
    from gateway.connection import Connection

Receive = Callable[[], Awaitable[dict]]
SendText = Callable[[str], Awaitable[None]]
_events = msgspec.json.Decoder(Event)
_native = msgspec.json.Encoder()
M = TypeVar("M")


# The HTTP status each protocol gives an error code (the HTTP routes' responses, Cartesia's `status_code` on its
# socket's errors); any other code is a 400.
HTTP_STATUS = {"unauthorized": 401, "unknown_voice": 404, "unknown_model": 404, "timeout": 408, "queue_full": 429,
               "too_many_contexts": 429, "too_many_utterances": 429, "internal_error": 500, "engine_not_ready": 503,
               "draining": 503, "model_unloading": 503}  # fmt: skip


def http_status(code: str) -> int:
    return HTTP_STATUS.get(code, 400)


class Marker(enum.Enum):
    """What a context's next `session.done` means to the provider."""

    FLUSHED = "flushed"  # a flush ended an utterance; the context goes on
    FINAL = "final"  # the context's end (ElevenLabs isFinal, Cartesia done)


@dataclass
class ContextState:
    """One provider context, as the bridge tracks it beside the native context of the same id."""

    open_text: bool = False  # text sent since the last input.done
    closing: bool = False  # its end was asked (close_context, continue: false)
    ended: bool = False  # its end was told to the client (or it was cancelled): later events are dropped
    markers: deque[tuple[Marker, int]] = field(default_factory=deque)  # (what, flush id)
    sent_ms: float = 0.0  # the context's audio clock: ms of its audio sent
    options: dict[str, object] = field(default_factory=dict)  # the wire's per-context settings


class Wire(Protocol):
    """One provider's wire format over the native protocol."""

    def inbound(self, raw: str) -> list[msgspec.Struct]:
        """One provider message → the native messages it means (raises ProtocolError for a bad one)."""
        ...

    async def outbound(self, data: bytes | str, event: Event | None) -> None:
        """One native event (`event` decoded; None for a binary audio frame, `data`) → the client."""
        ...


class InterleavedWire(Wire, Protocol):
    """A wire whose audio messages each name their context: its contexts interleave (gateway/playout.py),
    so every audio frame comes with the utterance it is of."""

    async def audio(self, data: bytes, utterance: int) -> None:
        """One audio frame of `utterance` → the client."""
        ...


def native(msg: msgspec.Struct) -> str:
    return _native.encode(msg).decode()


def decode(decoder: msgspec.json.Decoder[M], raw: str) -> M:
    """A provider message by its wire's decoder; a bad one is a ProtocolError with voxgate's stable code."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as e:
        raise ProtocolError("invalid_message", str(e)[:200]) from None
    except msgspec.DecodeError as e:
        raise ProtocolError("invalid_json", f"message is not valid JSON: {str(e)[:200]}") from None
    except RecursionError:
        raise ProtocolError("invalid_json", "message nests too deeply") from None


def context_of(value: str | UnsetType) -> str | None:
    """A native event's context_id as the bridge keys contexts (None: the session's default context)."""
    return None if value is UNSET else value  # type: ignore[return-value]


class Contexts:
    """The provider contexts of one socket: bounded (`bound`, past which ended ones are forgotten first;
    the native side refuses more than `max_contexts` open ones)."""

    def __init__(self, bound: int) -> None:
        self._states: dict[str | None, ContextState] = {}
        self._bound = bound

    def get(self, context_id: str | None) -> ContextState | None:
        return self._states.get(context_id)

    def open(self, context_id: str | None) -> ContextState:
        state = self._states.get(context_id)
        if state is None or state.ended:
            if len(self._states) >= self._bound:
                self._forget()
            state = self._states[context_id] = ContextState()
        return state

    def _forget(self) -> None:
        for cid, state in list(self._states.items()):
            if state.ended or not (state.open_text or state.markers):
                del self._states[cid]
                if len(self._states) < self._bound:
                    return
        # Every one is live: the oldest goes (the native side has refused the newest by now).
        del self._states[next(iter(self._states))]

    def text(self, context_id: str | None, text: str) -> list[msgspec.Struct]:
        """Text for a context. Whitespace alone opens nothing (ElevenLabs' " " opening message and keep-alive,
        LiveKit Cartesia's closing " "): an utterance of a space would be audio of nothing."""
        state = self.open(context_id)
        if not text or (not state.open_text and not text.strip()):
            return []
        state.open_text = True
        return [InputText(text=text, context_id=context_id)]

    def done(self, context_id: str | None, marker: Marker, flush_id: int = 0) -> list[msgspec.Struct]:
        """End the context's open utterance; `marker` says what its session.done will mean. A FLUSHED with
        nothing open sends nothing; a FINAL always does (its session.done comes after the context's audio)."""
        state = self.open(context_id)
        if marker is Marker.FLUSHED and not state.open_text:
            return []
        if marker is Marker.FINAL:
            state.closing = True
        state.open_text = False
        if len(state.markers) < 64:  # the native side refuses more than max_open_utterances anyway
            state.markers.append((marker, flush_id))
        return [InputDone(context_id=context_id)]

    def cancel(self, context_id: str | None) -> list[msgspec.Struct]:
        state = self.open(context_id)
        state.open_text, state.closing = False, True
        state.markers.clear()
        return [InputCancel(context_id=context_id)]

    def finished(self, context_id: str | None) -> tuple[Marker, int] | None:
        """A session.done of the context came: its marker (None: none was owed, e.g. a bare done)."""
        state = self._states.get(context_id)
        if state is None or not state.markers:
            return None
        return state.markers.popleft()


class Bridge:
    """Runs between a provider's socket and a native Connection: `receive` and `send` are the Connection's."""

    def __init__(self, wire: Wire, receive: Receive, first: list[msgspec.Struct] | None = None) -> None:
        self.wire = wire
        self._receive = receive
        self._pending: deque[str] = deque(native(m) for m in first or [])
        self.conn: Connection | None = None

    async def receive(self) -> dict:
        """The Connection's next native message, translated from the socket's next provider message(s).
        A bad provider message is answered in the provider's error shape and the socket goes on."""
        while not self._pending:
            ev = await self._receive()
            if ev.get("type") != "websocket.receive":
                return ev
            raw = ev.get("text")
            try:
                if raw is None:
                    raise ProtocolError("binary_not_supported", "client frames must be JSON text")
                if len(raw) > MAX_MESSAGE_BYTES:
                    message = f"message of {len(raw)} characters; the limit is {MAX_MESSAGE_BYTES}"
                    raise ProtocolError("message_too_large", message)
                self._pending.extend(native(m) for m in self.wire.inbound(raw))
            except ProtocolError as e:
                assert self.conn is not None
                await self.conn.error(e.code, e.message, **e.fields)
        return {"type": "websocket.receive", "text": self._pending.popleft()}

    async def send(self, data: bytes | str) -> None:
        await self.wire.outbound(data, None if isinstance(data, bytes) else _events.decode(data))

    async def send_audio(self, data: bytes, utterance: int) -> None:
        """An audio frame and its utterance (an interleaved wire's: `InterleavedWire`)."""
        await cast(InterleavedWire, self.wire).audio(data, utterance)


def close_socket() -> list[msgspec.Struct]:
    """A provider's "close the socket": what is playing is cut (the client is leaving), then the session ends."""
    return [InputCancel(), SessionClose()]


__all__ = ["AudioCancelled", "AudioDone", "AudioStart", "AudioWords", "Bridge", "ContextState", "Contexts", "Error",
           "InterleavedWire", "Marker", "SessionDone", "Wire", "close_socket", "context_of", "decode", "http_status",
           "native"]  # fmt: skip
