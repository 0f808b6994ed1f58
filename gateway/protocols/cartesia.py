"""Cartesia's streaming protocol (docs/cartesia.md): `/tts/websocket`, over the native Connection (bridge.py).

The socket's first generation request sets the session (its voice, output format and language); later
ones must ask for the same (`invalid_config` otherwise: one voice per socket, as a native session has).
Each `context_id` is a native context: `continue: false` ends it (`done` once its audio is out), `flush`
ends an utterance in it (`flush_done`), `cancel` cuts it. Word timestamps are the engine's word times
on the context's clock, in seconds.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
import numpy as np

from gateway.protocol import (
    AudioCancelled,
    AudioStart,
    AudioWords,
    ConfigMessage,
    ContextId,
    Error,
    Event,
    ProtocolError,
    SessionDone,
    quote,
)
from gateway.protocols.bridge import Contexts, Marker, SendText, context_of, http_status
from gateway.protocols.bridge import decode as bridge_decode

Encoding = Literal["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"]
Rate = Annotated[int, msgspec.Meta(ge=8000, le=48000)]
NATIVE_FORMAT = {"pcm_s16le": "pcm", "pcm_f32le": "pcm", "pcm_mulaw": "ulaw", "pcm_alaw": "alaw"}
# Cartesia's status codes on its messages: 206 while a context goes on, 200 at its end; errors: http_status.
STATUS_PARTIAL, STATUS_DONE = 206, 200


# -- messages, both ways ----------------------------------------------------------------------------


class Voice(msgspec.Struct, forbid_unknown_fields=False):
    mode: str = "id"
    id: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class OutputFormat(msgspec.Struct, forbid_unknown_fields=False, frozen=True):
    container: Literal["raw"] = "raw"
    encoding: Encoding = "pcm_s16le"
    sample_rate: Rate = 24000

    @property
    def native(self) -> str:
        return NATIVE_FORMAT[self.encoding]


class CartesiaInput(msgspec.Struct, forbid_unknown_fields=False):
    """A generation request, or a cancel. Fields with no voxgate meaning (model_id, duration, speed and
    emotion controls, max_buffer_delay_ms, pronunciation_dict_id, …) are accepted and ignored."""

    context_id: ContextId | None = None
    transcript: str | None = None
    continue_: bool = msgspec.field(name="continue", default=False)
    voice: Voice | None = None
    output_format: OutputFormat | None = None
    language: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    add_timestamps: bool = False
    flush: bool = False
    cancel: bool = False


class Chunk(msgspec.Struct, tag="chunk", tag_field="type"):
    data: str
    context_id: str
    done: bool = False
    status_code: int = STATUS_PARTIAL
    step_time: float = 0.0


class WordTimestamps(msgspec.Struct):
    words: list[str]
    start: list[float]
    end: list[float]


class Timestamps(msgspec.Struct, tag="timestamps", tag_field="type"):
    word_timestamps: WordTimestamps
    context_id: str
    done: bool = False
    status_code: int = STATUS_PARTIAL


class FlushDone(msgspec.Struct, tag="flush_done", tag_field="type"):
    flush_id: int
    context_id: str
    flush_done: bool = True
    done: bool = False
    status_code: int = STATUS_PARTIAL


class Done(msgspec.Struct, tag="done", tag_field="type"):
    context_id: str
    done: bool = True
    status_code: int = STATUS_DONE


class ErrorOut(msgspec.Struct, tag="error", tag_field="type"):
    """Cartesia's error shape; `code` is voxgate's stable code. `context_id` is always there ("" when the
    error concerns no context): Pipecat reads it from every message."""

    error: str
    code: str
    status_code: int
    context_id: str = ""
    done: bool = True


_decoder = msgspec.json.Decoder(CartesiaInput)
_encoder = msgspec.json.Encoder()


def decode(raw: str) -> CartesiaInput:
    return bridge_decode(_decoder, raw)


def error_message(code: str, message: str, context_id: str | None = None) -> str:
    out = ErrorOut(error=message, code=code, status_code=http_status(code), context_id=context_id or "")
    return _encoder.encode(out).decode()


def session_config(voice: str, fmt: OutputFormat, language: str | None) -> ConfigMessage:  # type: ignore[valid-type]
    return ConfigMessage(voice=voice, response_format=fmt.native, sample_rate=fmt.sample_rate,  # type: ignore[operator]
                         language=language or "auto", word_timestamps=True, timestamps_format="voxgate")  # fmt: skip


def to_f32(pcm: bytes) -> bytes:
    return (np.frombuffer(pcm, "<i2").astype("<f4") / 32768.0).tobytes()


# -- the wire ---------------------------------------------------------------------------------------


@dataclass
class _Playing:
    context_id: str | None
    offset: float  # its context's clock at the utterance's start (ms)


class CartesiaWire:
    def __init__(self, send: SendText, max_contexts: int) -> None:
        self._send = send
        self.contexts = Contexts(4 * max_contexts + 4)
        self.session: tuple[str, OutputFormat] | None = None  # the voice and format the socket speaks
        self._playing: _Playing | None = None
        self._flushes = 0

    # -- in --

    def inbound(self, raw: str) -> list[msgspec.Struct]:
        msg = decode(raw)
        cid = msg.context_id
        if msg.cancel:
            out = self.contexts.cancel(cid)
            self.contexts.open(cid).ended = True  # from this read on the context says nothing more (no done)
            if self._playing is not None and self._playing.context_id == cid:
                self._playing = None
            return out
        out: list[msgspec.Struct] = []
        if self.session is None:
            out.append(self._configure(msg))
        elif msg.voice is not None or msg.output_format is not None:
            self._same_session(msg)
        state = self.contexts.open(cid)
        state.options["timestamps"] = msg.add_timestamps
        if msg.transcript:
            out += self.contexts.text(cid, msg.transcript)
        if msg.flush:
            self._flushes += 1
            out += self.contexts.done(cid, Marker.FLUSHED, self._flushes)
        if not msg.continue_:
            out += self.contexts.done(cid, Marker.FINAL)
        return out

    def _configure(self, msg: CartesiaInput) -> msgspec.Struct:
        if msg.voice is None or not msg.voice.id:
            raise ProtocolError("invalid_config", "the first request must name a voice ({\"voice\": {\"id\": …}})",
                                **_ctx(msg.context_id))  # fmt: skip
        fmt = msg.output_format or OutputFormat()
        self.session = (msg.voice.id, fmt)
        return session_config(msg.voice.id, fmt, msg.language)

    def _same_session(self, msg: CartesiaInput) -> None:
        assert self.session is not None
        voice, fmt = self.session
        if (msg.voice is not None and msg.voice.id not in (None, voice)) or \
                (msg.output_format is not None and msg.output_format != fmt):  # fmt: skip
            raise ProtocolError(
                "invalid_config",
                f"this socket speaks voice {quote(voice)} as {fmt.encoding} at {fmt.sample_rate} Hz; "
                "open another socket for another voice or format", **_ctx(msg.context_id),
            )  # fmt: skip

    # -- out --

    async def outbound(self, data: bytes | str, event: Event | None) -> None:
        if event is None:
            assert isinstance(data, bytes)
            await self._audio(data)
        elif isinstance(event, AudioStart):
            cid = context_of(event.context_id)
            self._playing = _Playing(cid, self.contexts.open(cid).sent_ms)
        elif isinstance(event, AudioWords):
            await self._words(context_of(event.context_id), event)
        elif isinstance(event, SessionDone):
            await self._session_done(context_of(event.context_id))
        elif isinstance(event, AudioCancelled):
            cid = context_of(event.context_id)
            if self._playing is not None and self._playing.context_id == cid:
                self._playing = None
            state = self.contexts.get(cid)
            if state is not None:
                state.ended = True  # a cancelled context says nothing more (Cartesia sends no done for it)
        elif isinstance(event, Error):
            await self._send(error_message(event.code, event.message, context_of(event.context_id)))
        # session.ready, segment.committed, audio.mark, audio.waiting, audio.done: nothing in this protocol

    async def _audio(self, data: bytes) -> None:
        p = self._playing
        if p is None or self.session is None:
            return
        state = self.contexts.get(p.context_id)
        if state is None or state.ended:
            return
        fmt = self.session[1]
        state.sent_ms += len(data) / (2 if fmt.native == "pcm" else 1) * 1000 / fmt.sample_rate
        if fmt.encoding == "pcm_f32le":
            data = to_f32(data)
        await self._put(Chunk(data=base64.b64encode(data).decode(), context_id=p.context_id or ""))

    async def _words(self, cid: str | None, ev: AudioWords) -> None:
        state = self.contexts.get(cid)
        if state is None or state.ended or not state.options.get("timestamps") or self._playing is None:
            return
        at = self._playing.offset
        stamps = WordTimestamps([w.word for w in ev.words], [round((at + w.start_ms) / 1000, 3) for w in ev.words],
                                [round((at + w.end_ms) / 1000, 3) for w in ev.words])  # fmt: skip
        await self._put(Timestamps(word_timestamps=stamps, context_id=cid or ""))

    async def _session_done(self, cid: str | None) -> None:
        marker = self.contexts.finished(cid)
        state = self.contexts.get(cid)
        if marker is None or state is None or state.ended:
            return
        what, flush_id = marker
        if what is Marker.FLUSHED:
            await self._put(FlushDone(flush_id=flush_id, context_id=cid or ""))
        else:
            state.ended = True
            await self._put(Done(context_id=cid or ""))

    async def _put(self, msg: msgspec.Struct) -> None:
        await self._send(_encoder.encode(msg).decode())


def _ctx(context_id: str | None) -> dict[str, object]:
    return {} if context_id is None else {"context_id": context_id}
