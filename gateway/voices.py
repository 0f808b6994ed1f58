"""The tenant's voice registry over HTTP, and how a voice name becomes an engine voice.

A registered *preset* is an engine voice plus defaults (speed, instructions): works with every
engine. A *clone* carries a reference clip and its transcript, for engines that can clone
(`engine.supports_cloning`); others refuse it clearly. Registered voices live in the shared store,
so every replica resolves them the same way.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.params import FromPath

from engine import Engine, EngineError
from engine.reference import decode_reference
from gateway.auth import caller, serving_engine
from gateway.errors import api_error
from sessions import (
    InvalidId,
    SessionStore,
    SessionStoreError,
    StateUnavailable,
    Tenant,
    Voice,
    VoiceExists,
    VoiceLimitExceeded,
)

_STATUS = {VoiceExists: 409, VoiceLimitExceeded: 413, InvalidId: 400, StateUnavailable: 503}
_ENGINE_DEFAULTS = ("default", "auto")


class VoiceRequest(msgspec.Struct, forbid_unknown_fields=True):
    voice_id: str
    base_voice: str | None = None  # preset: an engine voice …
    speed: float | None = None  # … with defaults
    instructions: str | None = None
    description: str = ""
    ref_audio: str | None = None  # clone: base64 or a data: URI of an audio file …
    ref_text: str | None = None  # … and what it says (without it: x-vector only, less like the speaker)


def stream_options(
    voice_options: dict[str, Any], *, sample_rate: int | None, speed: float, seed: int | None, instructions: str | None
) -> dict[str, Any]:
    """Engine options for a stream: a registered voice's defaults, overridden by the request's settings."""
    options = dict(voice_options)
    if sample_rate is not None:
        options["sample_rate"] = sample_rate
    if speed != 1.0:
        options["speed"] = speed
    if seed is not None:
        options["seed"] = seed
    if instructions:
        options["instructions"] = instructions
    return options


def can_clone(engine: Engine) -> bool:
    return bool(getattr(engine, "supports_cloning", False))


async def resolve_voice(
    store: SessionStore, tenant: Tenant, engine: Engine, name: str | None
) -> tuple[str | None, dict[str, Any]]:
    """(engine voice, stream options) for a voice name: an engine voice as is, a registered voice
    through the store; an unknown name is passed on for the engine to reject."""
    if name is None or name in _ENGINE_DEFAULTS or name in {v.name for v in engine.voices()}:
        return name, {}
    try:
        voice = await store.get_voice(tenant.name, name)
    except InvalidId:
        return name, {}
    if voice is None:
        return name, {}
    if voice.kind == "preset":
        meta = voice.metadata
        options = {k: meta[k] for k in ("speed", "instructions") if meta.get(k) is not None}
        return meta.get("base_voice"), options
    if not can_clone(engine):
        raise EngineError("voice_cloning_unsupported", f"voice {name!r} is a clone; this engine cannot clone voices")
    return None, {"ref_audio": voice.ref_audio, "ref_text": voice.ref_text}


def _decode_audio(value: str) -> bytes:
    if value.startswith("data:"):
        value = value.partition(",")[2]
    return base64.b64decode(value, validate=True)


def _voice_from(req: VoiceRequest, engine: Engine) -> Voice:
    if req.ref_audio is not None:
        if not can_clone(engine):
            raise EngineError("voice_cloning_unsupported", "this engine cannot clone voices; register a preset")
        try:
            audio = _decode_audio(req.ref_audio)
        except (binascii.Error, ValueError):
            raise ValueError("ref_audio: not base64 (or a base64 data: URI)") from None
        return Voice(req.voice_id, "clone", req.voice_id, ref_audio=audio, ref_text=req.ref_text or None,
                     metadata={"description": req.description})  # fmt: skip
    if req.base_voice is None:
        raise ValueError("base_voice: a preset names an engine voice (or send ref_audio + ref_text for a clone)")
    if req.base_voice not in {v.name for v in engine.voices()}:
        raise EngineError("unknown_voice", f"base_voice {req.base_voice!r} is not a voice of this engine")
    if req.speed is not None and not 0.25 <= req.speed <= 4.0:
        raise ValueError("speed: must be between 0.25 and 4.0")
    meta = {"base_voice": req.base_voice, "speed": req.speed, "instructions": req.instructions,
            "description": req.description}  # fmt: skip
    return Voice(req.voice_id, "preset", req.voice_id, metadata=meta)


@post("/v1/audio/voices", status_code=201)
async def create_voice(request: Request) -> Response[dict[str, Any]]:
    tenant, engine = caller(request), serving_engine(request)
    try:
        req = msgspec.json.decode(await request.body(), type=VoiceRequest)
        voice = _voice_from(req, engine)
        if voice.ref_audio is not None:  # refuse a clip the engine could not read now, not at first use
            await asyncio.to_thread(decode_reference, voice.ref_audio)
        voice = await request.app.state.store.put_voice(tenant.name, voice)
    except EngineError as e:  # before ValueError, which it extends
        return api_error(400, e.code, str(e), "voice")
    except SessionStoreError as e:
        return api_error(_STATUS.get(type(e), 400), e.code, str(e))
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as e:
        return api_error(400, "invalid_value", str(e))
    return Response({"voice_id": voice.voice_id, "kind": voice.kind, "created_ms": voice.created_ms}, status_code=201)


@delete("/v1/audio/voices/{voice_id:str}", status_code=200)
async def delete_voice(request: Request, voice_id: FromPath[str]) -> Response[dict[str, Any]]:
    tenant = caller(request)
    try:
        deleted = await request.app.state.store.delete_voice(tenant.name, voice_id)
    except SessionStoreError as e:
        return api_error(_STATUS.get(type(e), 400), e.code, str(e))
    if not deleted:
        return api_error(404, "voice_not_found", f"no voice {voice_id!r}")
    return Response({"id": voice_id, "object": "voice", "deleted": True})  # OpenAI's shape for deletions


@get("/v1/audio/voices")
async def list_voices(request: Request) -> Response[dict[str, Any]]:
    from gateway.openai_api import OPENAI_VOICES

    tenant, engine = caller(request), serving_engine(request)
    voices = [
        {"name": v.name, "languages": list(v.languages), "kind": v.kind, "description": v.description}
        for v in engine.voices()
    ]
    try:
        registered = await request.app.state.store.list_voices(tenant.name)
    except StateUnavailable as e:
        return api_error(503, e.code, str(e))
    for v in registered:
        voices.append({"name": v.voice_id, "kind": v.kind, "description": v.metadata.get("description", ""),
                       "base_voice": v.metadata.get("base_voice"), "created_ms": v.created_ms})  # fmt: skip
    aliases = dict.fromkeys(OPENAI_VOICES, "default") | request.app.state.settings.voice_aliases
    return Response({"voices": voices, "languages": engine.languages(), "aliases": aliases,
                     "cloning": can_clone(engine)})  # fmt: skip


voice_routes = [create_voice, delete_voice, list_voices]
