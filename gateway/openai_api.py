"""OpenAI-compatible HTTP: `POST /v1/audio/speech` and `GET /v1/audio/voices`.

Works with the official `openai` client. Errors use OpenAI's body shape
(`{"error": {"message", "type", "param", "code"}}`) so client libraries surface them properly.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
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
    engine: Engine, req: SpeechRequest, voice: str | None, rate: int, voice_options: dict[str, object]
) -> AsyncIterator[np.ndarray]:
    """The request's audio at `rate`, chunk by chunk; cancels the engine stream if the client leaves."""
    options = stream_options(voice_options, sample_rate=rate, speed=req.speed, seed=req.seed,
                             instructions=req.instructions)  # fmt: skip
    stream = engine.open_stream(voice, req.language, **options)
    segmenter = StreamSegmenter(req.language, "auto")
    for seg in [*segmenter.feed(req.input), *segmenter.flush()]:
        if spoken := normalize_for_speech(seg.text, req.language):
            stream.append(spoken + " ")
    stream.finish()
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
            yield resample(ev.pcm)
    finally:
        stream.cancel()  # a no-op once the stream has ended


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
        chunks = _pcm(ticketed(engine, ticket), req, voice, rate, voice_options)
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

    async def audio() -> AsyncIterator[bytes]:
        try:
            if fmt == "wav":
                yield wav_stream_header(rate)
            if fmt in ("wav", "pcm"):  # streamable: bytes leave as they are made
                if first is not None:
                    yield encode_frames(first, "pcm")
                async for pcm in chunks:
                    yield encode_frames(pcm, "pcm")
            else:  # compressed: one file once the audio is complete
                parts = [] if first is None else [first]
                parts += [pcm async for pcm in chunks]
                pcm = np.concatenate(parts) if parts else np.zeros(0, np.int16)
                yield await asyncio.to_thread(encode_file, pcm, rate, fmt)
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
            yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()

        return StreamResponse(sse(), media_type="text/event-stream", headers=headers)
    return StreamResponse(audio(), media_type=MEDIA_TYPES[fmt], headers=headers)


openai_routes = [create_speech]
