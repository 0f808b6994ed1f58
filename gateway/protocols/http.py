"""The providers' HTTP routes: ElevenLabs' `POST /v1/text-to-speech/{voice_id}/stream` (audio bytes) and
`…/stream/with-timestamps` (a JSON line per chunk, with alignment), Cartesia's `POST /tts/bytes`.

Each request is a provider socket played from a script: its body becomes the provider messages that say the
same (`{"text": …}` then `{"text": ""}`; one Cartesia request with `continue: false`), read by the same Wire
and native Connection as the sockets', and what the Wire sends is turned into the response's body. So the
HTTP routes have the sockets' segmentation, admission, bounds and errors, and no code of their own for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream as StreamResponse

from gateway.audio import MP3_RATES, Mp3Stream, mp3_available, wav_stream_header
from gateway.auth import authenticate
from gateway.connection import Connection
from gateway.protocol import ProtocolError
from gateway.protocols import cartesia, elevenlabs
from gateway.protocols.bridge import Bridge, Wire, http_status
from gateway.settings import Settings
from gateway.sockets import serve_connection
from sessions import SessionStore, Tenant

MAX_TEXT_CHARS = 40_000  # one request's text (ElevenLabs' own limit for its newest models is 40 000)
_QUEUE = 32  # response chunks waiting for the client; past it the Connection waits, then drops a stalled client
_END = object()


@dataclass
class Failure:
    code: str
    message: str


class Collector:
    """The Wire's messages, as the response's items, in a bounded queue; the end (isFinal, done, an error)
    ends the Connection."""

    def __init__(self, convert: Callable[[dict[str, Any]], bytes | Failure | None]) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE)
        self._convert = convert
        self.conn: Connection | None = None

    async def send(self, text: str) -> None:
        msg = json.loads(text)
        item = self._convert(msg)
        if item is not None and item != b"":
            await self.queue.put(item)
        if isinstance(item, Failure) or msg.get("isFinal") or msg.get("type") == "done":
            assert self.conn is not None
            self.conn.stop()


async def _run(state: State, store: SessionStore, settings: Settings, tenant: Tenant, collector: Collector, wire: Wire,
               first: list[msgspec.Struct], script: list[str]) -> asyncio.Task[None]:  # fmt: skip
    """The Connection reading `first` (native messages) then `script` (the provider's) through `wire`, its
    output in `collector.queue`, then `_END`."""
    if state.models.any_serving() is None:
        raise ProtocolError("engine_not_ready", "the engine is warming up")
    pending = [{"type": "websocket.receive", "text": raw} for raw in script]
    never = asyncio.Event()

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        await never.wait()  # the script is all read: the Connection ends itself (stop) or by its idle bound
        return {"type": "websocket.disconnect"}

    bridge = Bridge(wire, receive, first)

    def made(conn: Connection) -> None:
        bridge.conn = collector.conn = conn

    async def run() -> None:
        try:
            await serve_connection(state, store, settings, tenant, bridge.receive, bridge.send, made=made)
        finally:
            with contextlib.suppress(TimeoutError):  # a client that stopped reading is not waited for
                async with asyncio.timeout(settings.limits.send_timeout):
                    await collector.queue.put(_END)

    return asyncio.create_task(run())


async def _respond(task: asyncio.Task[None], collector: Collector, media_type: str, head: bytes,
                   failed: Callable[[Failure], Response[Any]]) -> Response[Any]:  # fmt: skip
    """A failure before any audio is the response's status; after, the stream just ends (HTTP can say no more)."""
    first = await collector.queue.get()
    if isinstance(first, Failure):
        task.cancel()
        return failed(first)

    async def body() -> AsyncIterator[bytes]:
        try:
            if head:
                yield head
            item = first
            while item is not _END:
                if isinstance(item, bytes):
                    yield item
                elif isinstance(item, Failure):
                    return
                item = await collector.queue.get()
        finally:
            if not task.done():
                assert collector.conn is not None
                collector.conn.stop()
            await asyncio.wait({task}, timeout=5)

    return StreamResponse(body(), media_type=media_type)


def _tenant(request: Request) -> Tenant | None:
    return authenticate(request)


# -- ElevenLabs -------------------------------------------------------------------------------------


class ElevenLabsSpeech(msgspec.Struct, forbid_unknown_fields=False):
    """The request body. model_id, voice_settings, seed, previous_text, … are accepted and ignored."""

    text: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
    language_code: Annotated[str, msgspec.Meta(max_length=64)] | None = None


def _el_failure(f: Failure) -> Response[Any]:
    return Response({"detail": {"status": f.code, "message": f.message}}, status_code=http_status(f.code))


def _el_convert(timestamps: bool) -> Callable[[dict[str, Any]], bytes | Failure | None]:
    def convert(msg: dict[str, Any]) -> bytes | Failure | None:
        if "error" in msg:
            return Failure(msg["error"], msg["message"])
        if not timestamps:
            return base64.b64decode(msg["audio"]) if msg.get("audio") else None
        a = msg.get("normalizedAlignment")  # on the request's clock, as the HTTP route's readers expect
        if not msg.get("audio") and not a:
            return None
        line: dict[str, Any] = {"audio_base64": msg.get("audio") or ""}
        if a:
            starts = [t / 1000 for t in a["charStartTimesMs"]]
            ends = [(t + d) / 1000 for t, d in zip(a["charStartTimesMs"], a["charDurationsMs"], strict=True)]
            line["alignment"] = line["normalized_alignment"] = {
                "characters": a["chars"], "character_start_times_seconds": starts,
                "character_end_times_seconds": ends}  # fmt: skip
        return json.dumps(line).encode() + b"\n"

    return convert


async def _elevenlabs(request: Request, state: State, store: SessionStore, settings: Settings, voice_id: str,
                      timestamps: bool) -> Response[Any]:  # fmt: skip
    tenant = _tenant(request)
    if tenant is None:
        return _el_failure(
            Failure("unauthorized", "a valid API key is required (xi-api-key, X-API-Key or Authorization)")
        )
    try:
        speech = msgspec.json.decode(await request.body(), type=ElevenLabsSpeech)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return _el_failure(Failure("invalid_request", str(e)[:200]))
    try:
        fmt = elevenlabs.output_format(request.query_params.get("output_format"))
    except ProtocolError as e:
        return _el_failure(Failure(e.code, e.message))
    collector = Collector(_el_convert(timestamps))
    wire = elevenlabs.ElevenLabsWire(collector.send, fmt, multi=False, stop=lambda: None, max_contexts=1)
    first = elevenlabs.session_config(voice_id[:256], fmt, speech.language_code)
    script = [json.dumps({"text": speech.text}), json.dumps({"text": ""})]
    try:
        task = await _run(state, store, settings, tenant, collector, wire, [first], script)
    except ProtocolError as e:
        return _el_failure(Failure(e.code, e.message))
    media = "application/json" if timestamps else fmt.media_type
    return await _respond(task, collector, media, b"", _el_failure)


@post("/v1/text-to-speech/{voice_id:str}/stream", status_code=200)
async def elevenlabs_stream(request: Request, state: State, store: NamedDependency[SessionStore],
                            settings: NamedDependency[Settings], voice_id: FromPath[str]) -> Response[Any]:  # fmt: skip
    return await _elevenlabs(request, state, store, settings, voice_id, timestamps=False)


@post("/v1/text-to-speech/{voice_id:str}/stream/with-timestamps", status_code=200)
async def elevenlabs_stream_with_timestamps(
    request: Request,
    state: State,
    store: NamedDependency[SessionStore],
    settings: NamedDependency[Settings],
    voice_id: FromPath[str],
) -> Response[Any]:
    return await _elevenlabs(request, state, store, settings, voice_id, timestamps=True)


# -- Cartesia ---------------------------------------------------------------------------------------


class BytesFormat(msgspec.Struct, forbid_unknown_fields=False):
    container: Literal["raw", "wav", "mp3"] = "raw"
    encoding: cartesia.Encoding = "pcm_s16le"
    sample_rate: cartesia.Rate = 24000
    bit_rate: Annotated[int, msgspec.Meta(ge=8000, le=320000)] = 128000  # mp3 only


class BytesRequest(msgspec.Struct, forbid_unknown_fields=False):
    transcript: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
    voice: cartesia.Voice
    output_format: BytesFormat = msgspec.field(default_factory=BytesFormat)
    language: Annotated[str, msgspec.Meta(max_length=64)] | None = None


def _cartesia_failure(f: Failure) -> Response[Any]:
    status = http_status(f.code)
    return Response({"error": f.message, "code": f.code, "status_code": status}, status_code=status)


def _container(out: BytesFormat) -> tuple[bytes, Mp3Stream | None] | Failure:
    """The response's header (WAV's) and MP3 encoder, for the container asked."""
    if out.container == "wav":
        if out.encoding != "pcm_s16le":
            return Failure("unsupported_format", "wav is served as pcm_s16le")
        return wav_stream_header(out.sample_rate), None
    if out.container == "mp3":
        if not mp3_available() or out.sample_rate not in MP3_RATES:
            return Failure("unsupported_format", f"mp3 at {out.sample_rate} Hz cannot be encoded")
        return b"", Mp3Stream(out.sample_rate, max(8, out.bit_rate // 1000))
    return b"", None


def _cartesia_convert(mp3: Mp3Stream | None) -> Callable[[dict[str, Any]], bytes | Failure | None]:
    def convert(msg: dict[str, Any]) -> bytes | Failure | None:
        if msg.get("type") == "error":
            return Failure(msg["code"], msg["error"])
        if msg.get("type") == "chunk":
            data = base64.b64decode(msg["data"])
            return data if mp3 is None else mp3.feed(data)
        if msg.get("type") == "done" and mp3 is not None:
            return mp3.finish()
        return None

    return convert


@post("/tts/bytes", status_code=200)
async def cartesia_bytes(request: Request, state: State, store: NamedDependency[SessionStore],
                         settings: NamedDependency[Settings]) -> Response[Any]:  # fmt: skip
    """Cartesia's bytes endpoint: raw PCM (s16le, f32le, μ-law, A-law), WAV (s16le) or MP3, streamed."""
    tenant = _tenant(request)
    if tenant is None:
        return _cartesia_failure(Failure("unauthorized", "a valid API key is required (X-API-Key or Authorization)"))
    try:
        req = msgspec.json.decode(await request.body(), type=BytesRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return _cartesia_failure(Failure("invalid_request", str(e)[:200]))
    out = req.output_format
    if isinstance(container := _container(out), Failure):
        return _cartesia_failure(container)
    head, mp3 = container
    raw = {"container": "raw", "encoding": "pcm_s16le" if mp3 is not None else out.encoding,
           "sample_rate": out.sample_rate}  # fmt: skip
    request_msg = {"transcript": req.transcript, "continue": False, "context_id": "bytes", "language": req.language,
                   "voice": {"mode": "id", "id": req.voice.id}, "output_format": raw}  # fmt: skip
    collector = Collector(_cartesia_convert(mp3))
    wire = cartesia.CartesiaWire(collector.send, max_contexts=1)
    try:
        task = await _run(state, store, settings, tenant, collector, wire, [], [json.dumps(request_msg)])
    except ProtocolError as e:
        return _cartesia_failure(Failure(e.code, e.message))
    media = {"raw": "audio/pcm", "wav": "audio/wav", "mp3": "audio/mpeg"}[out.container]
    return await _respond(task, collector, media, head, _cartesia_failure)


http_routes = [elevenlabs_stream, elevenlabs_stream_with_timestamps, cartesia_bytes]
