"""OpenAI-compatible HTTP: `POST /v1/audio/speech` and `GET /v1/audio/voices`.

Works with the official `openai` client (every voice name it types, `{"id": …}` voice references, the
`x-request-id` it reads: gateway/request_id.py). Errors use OpenAI's body shape
(`{"error": {"message", "type", "param", "code"}}`, gateway/errors.py) so client libraries surface them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Literal, TypeVar, cast

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream as StreamResponse

from engine import AudioChunk, Engine, Stream, StreamEnd, StreamRequest
from gateway.admission import Admission, Ticket
from gateway.aliases import Aliases
from gateway.audio import MEDIA_TYPES, OPUS_RATES, Resampler, encode_file, encode_frames, wav_stream_header
from gateway.drain import refuse_while_draining
from gateway.errors import ApiError
from gateway.lexicons import spoken_segments, spoken_with, tenant_lexicon
from gateway.models import ModelRegistry, api_serving
from gateway.queued_stream import spoken_language, ticketed
from gateway.session_state import acquire_stream_slot, release_stream_slot
from gateway.settings import Settings
from gateway.timing import LeadingTrim, ResponseClock, Timing, observe, trim_for
from gateway.voices import TaskType, open_request, refuse_missing_capability, resolve_voice, stream_request
from segmentation.lexicon import Pronunciations
from sessions import SessionStore, StreamSlot, Tenant

T = TypeVar("T")

MAX_INPUT_CHARS = 4096  # OpenAI's limit
MAX_INSTRUCTIONS = 500  # as session.config's
MAX_NAME_CHARS = 128  # voice, model, language: names, echoed in errors
# The longest valid body: 4096 characters of input and 500 of instructions, each a 12-byte JSON escape
# (a surrogate pair), and the rest. Litestar's default (10 MB) would parse megabytes on the event loop.
MAX_BODY_BYTES = 128 * 1024
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


class VoiceRef(msgspec.Struct):
    """OpenAI's custom voice reference, `{"id": "voice_1234"}`: here a registered voice's id."""

    id: Name


class SpeechRequest(msgspec.Struct, forbid_unknown_fields=False):
    """The body of POST /v1/audio/speech, bounds declared (Litestar decodes and checks it before the handler)."""

    input: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_INPUT_CHARS)]
    model: Name = "voxgate"
    voice: Name | VoiceRef | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0
    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INSTRUCTIONS)] | None = None
    language: Name = "auto"
    sample_rate: Annotated[int, msgspec.Meta(ge=8000, le=48000)] | None = None
    lexicon: Name | None = None  # a tenant lexicon (PUT /v1/lexicons/{name}): its pronunciations
    stream: bool | None = None
    stream_format: Literal["sse", "audio"] = "audio"
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    # vLLM-Omni's task and inline reference: known so that what the model cannot do is refused by code
    # (gateway/voices.py refuse_missing_capability), never spoken in another voice.
    task_type: TaskType | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: Annotated[list[float], msgspec.Meta(max_length=8192)] | None = None

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    @property
    def inline_reference(self) -> bool:
        return bool(self.ref_audio or self.ref_text or self.speaker_embedding) or self.x_vector_only_mode is True


def _checked(req: SpeechRequest, engine: Engine) -> int:
    """What the Struct's bounds cannot say; returns the response's sample rate."""
    if not req.input.strip():
        raise ApiError("input must not be empty", param="input")
    if req.response_format == "aac":
        raise ApiError("response_format aac is not available; use mp3, opus, flac, wav or pcm", param="response_format")
    rate = req.sample_rate or engine.sample_rate
    if req.response_format == "opus" and rate not in OPUS_RATES:
        raise ApiError(f"opus needs a sample_rate of {', '.join(map(str, OPUS_RATES))}", param="sample_rate")
    return rate


async def speech_request(req: SpeechRequest, engine: Engine, store: SessionStore, tenant: Tenant,
                         aliases: Aliases) -> tuple[StreamRequest, Pronunciations]:  # fmt: skip
    """The engine request a speech body asks for (its voice resolved: alias, registered, engine's; its
    lexicon's IPA entries as `phonemes` where the engine takes them) and the respellings for its text."""
    rate = _checked(req, engine)
    refuse_missing_capability(engine, req.task_type, req.inline_reference)  # cloning, voice design
    voice = await resolve_voice(store, tenant, engine, req.voice_name, aliases)
    lexicon = await tenant_lexicon(store, tenant, req.lexicon)
    request = stream_request(voice, req.language, sample_rate=rate, speed=req.speed, seed=req.seed,
                             instructions=req.instructions)  # fmt: skip
    # The engine's verdict (an EngineError: a 400), off the event loop: an engine in a child process
    # answers by a round trip that a busy or stopped child can hold up to its timeout. The open that
    # follows finds the verdict cached.
    return await asyncio.to_thread(spoken_with, engine, request, lexicon)


def _spoken(engine: Engine, request: StreamRequest, spoken: Sequence[str]) -> Stream:
    """An engine stream with all of `spoken` in it (the text's segments as gateway/lexicons.py
    `spoken_segments` makes them: respelled and normalised as a WebSocket session's are)."""
    stream = open_request(engine, request)
    for segment in spoken:
        stream.append(segment + " ")
    stream.finish()
    return stream


async def _audio(stream: Stream) -> AsyncIterator[AudioChunk]:
    """The stream's audio until it ends; its failure is a 500 (the HTTP caller simply waits out `Waiting`)."""
    async for ev in stream.events():
        if isinstance(ev, StreamEnd):
            if ev.reason == "error":
                raise ApiError(ev.message or "synthesis failed", code="engine_error", status=500)
            return
        if isinstance(ev, AudioChunk):
            yield ev


async def speech_pcm(
    engine: Engine, request: StreamRequest, spoken: Sequence[str], trim: LeadingTrim | None = None,
    clock: ResponseClock | None = None,
) -> AsyncIterator[np.ndarray]:
    """`spoken` (a text's segments, `spoken_segments`) spoken as `request` asks, at its sample rate, chunk by
    chunk (never an empty one); cancels the engine stream if the client leaves. `trim`: drop the leading
    silence; `clock`: its start is when the text went in."""
    rate = request.sample_rate or engine.sample_rate
    stream = _spoken(engine, request, spoken)
    if clock is not None:
        clock.start = time.monotonic()
    trim = trim or LeadingTrim(rate, enabled=False)
    resample: Resampler | None = None
    try:
        async for ev in _audio(stream):
            resample = resample or Resampler(ev.sample_rate, rate)
            if (pcm := trim.feed(resample(ev.pcm))).size:
                yield pcm
        if resample is not None:  # the resampler's filter tail, then what the trim may still hold
            for pcm in (trim.feed(resample(np.zeros(0, np.int16), last=True)), trim.flush()):
                if pcm.size:
                    yield pcm
    finally:
        stream.cancel()  # a no-op once the stream has ended


async def admitted(admission: Admission | None, tenant: Tenant, speaks: StreamRequest, text: str,
                   request: Request | None = None) -> Ticket | None:
    """Waits until the engine has room for a stream of `speaks` saying `text` (its language, "auto" read
    from the text, and its voice are its cost) and it is this tenant's turn (QueueFull: a 429). With
    `request`, a client that leaves while it waits gives its place up at once (client_disconnected)
    instead of holding a place in the line and then starting a stream for nobody."""
    if admission is None:
        return None
    language = spoken_language(speaks.language, text)
    waits = admission.admit(tenant.name, tenant.weight, language=language, voice=speaks.voice)
    if request is None:
        return await waits
    turn, left = await while_connected(request, waits)  # cancelled: withdrawn
    if left:
        if not turn.cancelled() and turn.exception() is None:
            turn.result().release()  # admitted in the same instant: the slot goes to the next in line
        raise ApiError("the client disconnected while waiting its turn", code="client_disconnected", status=499)
    return turn.result()


async def holding(slot: StreamSlot | None, chunks: AsyncIterator[np.ndarray]) -> AsyncIterator[np.ndarray]:
    """`chunks`, the tenant's stream slot held until they end (or the client leaves and they are closed)."""
    try:
        async for pcm in chunks:
            yield pcm
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        await release_stream_slot(slot)


async def client_gone(request: Request) -> None:
    """Returns when the client has gone. The body is read, so the next ASGI message is the disconnect;
    nothing else is expected, but one would be passed over without spinning."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)


async def while_connected(request: Request, work: Awaitable[T]) -> tuple[asyncio.Future[T], bool]:
    """Runs `work` until it ends or the client leaves, whichever comes first: its future (cancelled, and
    awaited, if the client left before it ended) and whether the client left."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, gone})
    return task, gone.done() and not gone.cancelled()


async def _whole(request: Request, first: np.ndarray | None, chunks: AsyncIterator[np.ndarray]) -> np.ndarray | None:
    """All of a response's PCM, for a format sent as one file; None if the client left meanwhile (its
    engine stream is cancelled then, as a streamed body's is when its client goes)."""

    async def collect() -> np.ndarray:
        parts = [] if first is None else [first]
        parts += [pcm async for pcm in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    try:
        work, _ = await while_connected(request, collect())
    finally:
        await chunks.aclose()  # cancels the engine stream (a no-op once it has ended)
    return None if work.cancelled() else work.result()


class SpeechBody:
    """One speech response's audio: the engine's chunks as the body (streamed formats) or one file, its
    timing headers, and the timing record once the last audio is handed over."""

    def __init__(self, req: SpeechRequest, rate: int, chunks: AsyncIterator[np.ndarray], clock: ResponseClock,
                 trim: LeadingTrim, observed: Callable[[Timing], None]) -> None:  # fmt: skip
        self.req, self.rate, self.fmt = req, rate, req.response_format
        self.chunks, self.clock, self.trim, self._observed = chunks, clock, trim, observed
        self.streamed = self.fmt in ("wav", "pcm")  # bytes leave as they are made; the others are one file
        self.first: np.ndarray | None = None
        self.file, self.timing = b"", None  # a file's, known before its headers

    async def start(self, request: Request) -> dict[str, str]:
        """The first audio (engine errors surface here, as a 400); returns the response's headers."""
        self.first = await anext(self.chunks, None)
        headers = {"X-Audio-Sample-Rate": str(self.rate), "X-Audio-Channels": "1"}
        if self.streamed:
            if self.first is not None:
                self.clock.audio(self.first)  # handed over with the headers
            return headers | self.clock.record().headers(whole=False)  # only what is known before the body
        # Assembled whole before the first byte leaves, so every field can be a header.
        whole = await _whole(request, self.first, self.chunks)  # ApiError engine_error: the body not begun
        if whole is None:
            raise ApiError("the client disconnected", code="client_disconnected", status=499)
        self.file = await asyncio.to_thread(encode_file, whole, self.rate, self.fmt)
        self.clock.audio(whole)
        self.timing = self.timed()
        return headers | self.timing.headers(whole=True)

    def timed(self) -> Timing:
        """The whole record, once the last audio is handed over; a complete one goes to the histograms."""
        self.clock.trimmed = self.trim.trimmed
        timing = self.clock.record()
        self._observed(timing)
        return timing

    async def audio(self) -> AsyncIterator[bytes]:
        if not self.streamed:
            yield self.file
            return
        try:
            if self.fmt == "wav":
                yield wav_stream_header(self.rate)
            if self.first is not None:
                yield encode_frames(self.first, "pcm")
            async for pcm in self.chunks:
                self.clock.audio(pcm)
                yield encode_frames(pcm, "pcm")
        finally:
            await self.chunks.aclose()  # a client that left frees its engine stream now

    async def sse(self) -> AsyncIterator[bytes]:
        total, n = 0, len(self.req.input)
        async for data in self.audio():
            total += len(data)
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
        usage = {"input_tokens": n, "output_tokens": total // 2, "total_tokens": n}
        # The whole timing record beside `usage` (OpenAI's token counts), known only now.
        done = {"type": "speech.audio.done", "usage": usage, "timing": msgspec.to_builtins(self.timing or self.timed())}
        yield f"data: {json.dumps(done)}\n\n".encode()

    async def observed(self) -> AsyncIterator[bytes]:
        async for data in self.audio():
            yield data
        self.timed()  # the client heard it all: into the histograms


# OpenAI answers 200, not 201
@post("/v1/audio/speech", status_code=200, request_max_body_size=MAX_BODY_BYTES, guards=[refuse_while_draining])
async def create_speech(
    data: JSONBody[SpeechRequest], request: Request, models: NamedDependency[ModelRegistry],
    store: NamedDependency[SessionStore], tenant: NamedDependency[Tenant], settings: NamedDependency[Settings],
) -> Response:
    model = api_serving(models, data.model)  # `model` picks one (404 unknown_model; 503 while it cannot serve)
    engine, admission = cast(Engine, model.served), model.admission
    stream_req, pronunciations = await speech_request(data, engine, store, tenant, models.aliases)
    # Before admission: a text its lexicon lengthens past the bound is refused without taking capacity.
    spoken = await spoken_segments(data.input, stream_req.language, pronunciations, settings.limits)
    rate = stream_req.sample_rate or engine.sample_rate
    slot = await acquire_stream_slot(store, tenant)  # the tenant's max_streams (429 stream_limit)
    try:
        ticket = await admitted(admission, tenant, stream_req, data.input, request)
        clock = ResponseClock(rate, None, ticket.waited_s if ticket is not None else 0.0)
        trim = trim_for(rate, settings.limits)
        chunks = speech_pcm(ticketed(engine, ticket), stream_req, spoken, trim, clock)
        body = SpeechBody(data, rate, holding(slot, chunks), clock, trim,
                          lambda timing: observe(timing, model.name, tenant.name))  # fmt: skip
        headers = await body.start(request)
    except BaseException:
        await release_stream_slot(slot)  # no body will hold the stream
        raise
    if data.stream_format == "sse":
        return StreamResponse(body.sse(), media_type="text/event-stream", headers=headers)
    if not body.streamed:
        return Response(body.file, media_type=MEDIA_TYPES[body.fmt], headers=headers)
    return StreamResponse(body.observed(), media_type=MEDIA_TYPES[body.fmt], headers=headers)


openai_routes = [create_speech]
