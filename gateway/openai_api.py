"""OpenAI-compatible HTTP: `POST /v1/audio/speech` and `GET /v1/audio/voices`.

Works with the official `openai` client. Errors use OpenAI's body shape
(`{"error": {"message", "type", "param", "code"}}`) so client libraries surface them properly.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Literal

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.response import Stream as StreamResponse

from engine import AudioChunk, Engine, EngineError, StreamEnd, Waiting
from gateway.admission import QueueFull, admit, ticketed
from gateway.audio import MEDIA_TYPES, Resampler, encode_file, encode_frames, wav_stream_header
from gateway.auth import caller, serving_engine
from gateway.errors import ApiError
from gateway.timing import LeadingTrim, ResponseClock, Timing, observe, trim_for
from gateway.voices import resolve_voice, stream_options
from segmentation import StreamSegmenter, normalize_for_speech
from sessions import StateUnavailable

MAX_INPUT_CHARS = 4096  # OpenAI's limit
MAX_INSTRUCTIONS = 500  # as session.config's
MAX_NAME_CHARS = 128  # voice, model, language: names, echoed in errors
# The longest valid body: 4096 characters of input and 500 of instructions, each a 12-byte JSON escape
# (a surrogate pair), and the rest. Litestar's default (10 MB) would parse megabytes on the event loop.
MAX_BODY_BYTES = 128 * 1024
# OpenAI's voice names: each maps to the engine's language-aware default unless the engine has a
# voice of that name (or the settings alias it).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse")


class SpeechRequest(msgspec.Struct, forbid_unknown_fields=False):
    input: str
    model: str = "voxgate"
    voice: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    language: str = "auto"
    sample_rate: int | None = None
    stream: bool | None = None
    stream_format: Literal["sse", "audio"] = "audio"
    seed: int | None = None


def _parse(raw: bytes) -> SpeechRequest:
    try:
        req = msgspec.json.decode(raw, type=SpeechRequest)
    except msgspec.ValidationError as e:
        where = re.search(r"\$\.(\w+)|field `(\w+)`", str(e))
        raise ApiError(str(e), param=where and (where[1] or where[2])) from None
    except msgspec.DecodeError:
        raise ApiError("the request body is not valid JSON", code="invalid_json") from None
    if not req.input.strip():
        raise ApiError("input must not be empty", param="input")
    if len(req.input) > MAX_INPUT_CHARS:
        raise ApiError(
            f"input is limited to {MAX_INPUT_CHARS} characters", param="input", code="string_above_max_length"
        )
    if req.instructions is not None and len(req.instructions) > MAX_INSTRUCTIONS:
        raise ApiError(f"instructions are limited to {MAX_INSTRUCTIONS} characters", param="instructions",
                       code="string_above_max_length")  # fmt: skip
    for name in ("voice", "model", "language"):
        if len(getattr(req, name) or "") > MAX_NAME_CHARS:
            raise ApiError(f"{name} is limited to {MAX_NAME_CHARS} characters", param=name,
                           code="string_above_max_length")  # fmt: skip
    if not 0.25 <= req.speed <= 4.0:
        raise ApiError("speed must be between 0.25 and 4.0", param="speed")
    if req.sample_rate is not None and not 8000 <= req.sample_rate <= 48000:
        raise ApiError("sample_rate must be between 8000 and 48000", param="sample_rate")
    if req.response_format == "aac":
        raise ApiError("response_format aac is not available; use mp3, opus, flac, wav or pcm", param="response_format")
    return req


def _voice(engine: Engine, name: str | None, aliases: dict[str, str]) -> str | None:
    if name is None:
        return None
    if name in aliases:
        return aliases[name]
    if name.lower() in OPENAI_VOICES and name not in {v.name for v in engine.voices()}:
        return None  # the engine's default voice for the language
    return name


async def _pcm(
    engine: Engine, req: SpeechRequest, voice: str | None, rate: int, voice_options: dict[str, object],
    trim: LeadingTrim | None = None, clock: ResponseClock | None = None,
) -> AsyncIterator[np.ndarray]:
    """The request's audio at `rate`, chunk by chunk (never an empty one); cancels the engine stream if
    the client leaves. `trim`: drop the leading silence; `clock`: its start is when the text went in."""
    options = stream_options(voice_options, sample_rate=rate, speed=req.speed, seed=req.seed,
                             instructions=req.instructions)  # fmt: skip
    stream = engine.open_stream(voice, req.language, **options)
    segmenter = StreamSegmenter(req.language, "auto")
    for seg in [*segmenter.feed(req.input), *segmenter.flush()]:
        if spoken := normalize_for_speech(seg.text, req.language):
            stream.append(spoken + " ")
    stream.finish()
    if clock is not None:
        clock.start = time.monotonic()
    trim = trim or LeadingTrim(rate, enabled=False)
    resample: Resampler | None = None
    try:
        async for ev in stream.events():
            if isinstance(ev, StreamEnd):
                if ev.reason == "error":
                    raise RuntimeError(ev.message or "synthesis failed")
                break
            if isinstance(ev, Waiting):  # the HTTP caller simply waits longer
                continue
            assert isinstance(ev, AudioChunk)
            resample = resample or Resampler(ev.sample_rate, rate)
            if (pcm := trim.feed(resample(ev.pcm))).size:
                yield pcm
        if resample is not None:  # the resampler's filter tail, then what the trim may still hold
            for pcm in (trim.feed(resample(np.zeros(0, np.int16), last=True)), trim.flush()):
                if pcm.size:
                    yield pcm
    finally:
        stream.cancel()  # a no-op once the stream has ended


async def client_gone(request: Request) -> None:
    """Returns when the client has gone. The body is read, so the next ASGI message is the disconnect;
    nothing else is expected, but one would be passed over without spinning."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)


async def _whole(request: Request, first: np.ndarray | None, chunks: AsyncIterator[np.ndarray]) -> np.ndarray | None:
    """All of a response's PCM, for a format sent as one file; None if the client left meanwhile (its
    engine stream is cancelled then, as a streamed body's is when its client goes)."""

    async def collect() -> np.ndarray:
        parts = [] if first is None else [first]
        parts += [pcm async for pcm in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
        await asyncio.wait({work, gone})
        await chunks.aclose()  # cancels the engine stream (a no-op once it has ended)
    return None if work.cancelled() else work.result()


def queue_full(e: QueueFull) -> Response:
    """429 with Retry-After (whole seconds) and OpenAI's body; `bound` is in the message."""
    response = ApiError(e.message, code="queue_full", param=None, status=429).response()
    response.headers["Retry-After"] = e.retry_after_header
    return response


@post("/v1/audio/speech", status_code=200, request_max_body_size=MAX_BODY_BYTES)  # OpenAI answers 200, not 201
async def create_speech(request: Request) -> Response:
    tenant, engine = caller(request), serving_engine(request)
    try:
        req = _parse(await request.body())
        name = _voice(engine, req.voice, request.app.state.settings.voice_aliases)
        voice, voice_options = await resolve_voice(request.app.state.store, tenant, engine, name)
        rate = req.sample_rate or engine.sample_rate
        fmt = req.response_format
        if fmt == "opus" and rate not in (8000, 12000, 16000, 24000, 48000):
            raise ApiError("opus needs a sample_rate of 8000, 12000, 16000, 24000 or 48000", param="sample_rate")
        ticket = await admit(request.app.state, tenant)  # until the engine has room and it is this tenant's turn
        clock = ResponseClock(rate, None, ticket.waited_s if ticket is not None else 0.0)
        trim = trim_for(rate, request.app.state.settings.limits)
        chunks = _pcm(ticketed(engine, ticket), req, voice, rate, voice_options, trim, clock)
        first = await anext(chunks, None)  # surfaces engine errors (bad voice, language) as a 400
    except ApiError as e:
        return e.response()
    except QueueFull as e:
        return queue_full(e)
    except RequestEntityTooLarge:
        return ApiError(f"the request body is limited to {MAX_BODY_BYTES} bytes", code="request_too_large",
                        status=413).response()  # fmt: skip
    except EngineError as e:
        return ApiError(str(e), param="voice" if "voice" in e.code else None, code=e.code).response()
    except StateUnavailable as e:
        return ApiError(str(e), code=e.code, status=503).response()

    headers = {"X-Audio-Sample-Rate": str(rate), "X-Audio-Channels": "1"}
    streamed = fmt in ("wav", "pcm")  # bytes leave as they are made; the others are one file
    file, timing = b"", None  # a file's, known before its headers

    def timed() -> Timing:
        """The whole record, once the last audio is handed over; a complete one goes to the histograms."""
        clock.trimmed = trim.trimmed
        timing = clock.record()
        observe(timing, request.app.state.settings.model, tenant.name)
        return timing

    if streamed:
        if first is not None:
            clock.audio(first)  # handed over with the headers
        headers |= clock.record().headers(whole=False)  # only what is known before the body
    else:  # assembled whole before the first byte leaves, so every field can be a header
        try:
            whole = await _whole(request, first, chunks)
        except RuntimeError as e:  # the engine failed mid-way; the body has not begun
            return ApiError(str(e), code="engine_error", status=500).response()
        if whole is None:
            return ApiError("the client disconnected", code="client_disconnected", status=499).response()
        file = await asyncio.to_thread(encode_file, whole, rate, fmt)
        clock.audio(whole)
        timing = timed()
        headers |= timing.headers(whole=True)

    async def audio() -> AsyncIterator[bytes]:
        if not streamed:
            yield file
            return
        try:
            if fmt == "wav":
                yield wav_stream_header(rate)
            if first is not None:
                yield encode_frames(first, "pcm")
            async for pcm in chunks:
                clock.audio(pcm)
                yield encode_frames(pcm, "pcm")
        finally:
            await chunks.aclose()  # a client that left frees its engine stream now

    if req.stream_format == "sse":

        async def sse() -> AsyncIterator[bytes]:
            total = 0
            async for data in audio():
                total += len(data)
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                yield f"data: {json.dumps(event)}\n\n".encode()
            usage = {"input_tokens": len(req.input), "output_tokens": total // 2, "total_tokens": len(req.input)}
            # The whole timing record beside `usage` (OpenAI's token counts), known only now.
            done = {"type": "speech.audio.done", "usage": usage,
                    "timing": msgspec.to_builtins(timing or timed())}  # fmt: skip
            yield f"data: {json.dumps(done)}\n\n".encode()

        return StreamResponse(sse(), media_type="text/event-stream", headers=headers)
    if not streamed:
        return Response(file, media_type=MEDIA_TYPES[fmt], headers=headers)

    async def observed() -> AsyncIterator[bytes]:
        async for data in audio():
            yield data
        timed()  # the client heard it all: into the histograms

    return StreamResponse(observed(), media_type=MEDIA_TYPES[fmt], headers=headers)


openai_routes = [create_speech]
