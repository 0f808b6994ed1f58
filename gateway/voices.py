"""The tenant's voice registry over HTTP, and how a voice name becomes an engine voice.

A registered *preset* is an engine voice plus defaults (speed, instructions): works with every
engine. A *clone* carries a reference clip and its transcript, for engines that can clone
(`engine.supports_cloning`); others refuse it clearly. Registered voices live in the shared store,
so every replica resolves them the same way.

A registration is bounded at every step, since a small request can ask for much work: the body
(`MAX_BODY_BYTES`, 413 past it), the bodies being received (`RegistrationLimits`: per tenant and in the
process, 429 past either, never a queue — a tenant's slow uploads hold only its own places), the
parsing and decoding in flight (taken once the body is in, so a slow upload never holds one), the
clip's decoding (engine/reference.py: at most 30 s, whatever its header says), and the tenant's voices
(by count and by bytes, in the store). Parsing, base64 and decoding are CPU work and run on the
registry's own threads, never on the event loop. A clone is stored as the engine will read
it: mono, at most 24 kHz, 16-bit FLAC (≤ 1.44 MB of samples for 30 s).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from engine import Engine, EngineError, Stream, StreamRequest
from engine.options import stream_request as checked_request
from engine.reference import MAX_SECONDS, compact_reference
from gateway.aliases import SHIPPED, Aliases
from gateway.drain import refuse_while_draining
from gateway.errors import ApiError, api_error, invalid
from sessions import (
    InvalidId,
    SessionStore,
    Tenant,
    Voice,
)

T = TypeVar("T")

_ENGINE_DEFAULTS = ("default", "auto")

# A 30 s WAV at 48 kHz, stereo, 16-bit is 5.8 MB, 7.7 MB as base64: it fits, and so does any compressed
# clip of 30 s. Litestar's default (10 MB) would also let 10 MB of JSON strings through the parser.
MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RegistrationLimits:
    """How much voice registration may hold at once."""

    body_timeout_s: float = 30.0  # a body arriving slower than this gives its place up (408)
    # Bodies being received at once, each up to MAX_BODY_BYTES of memory: per tenant (one tenant's slow
    # uploads take only its own places) and in the process (32 × 8 MiB = 256 MiB at most).
    uploads_per_tenant: int = 4
    uploads: int = 32
    # Registrations parsing and decoding (CPU work, after their body is in) at once in the process, and
    # the threads that run them: each is bounded in time (a clip decodes to at most 30 s).
    decodes: int = 4
    decode_threads: int = 2


REGISTRATION = RegistrationLimits()
MAX_REF_TEXT = 2000  # a 30 s transcript is a few hundred characters
MAX_DESCRIPTION = 500
MAX_INSTRUCTIONS = 500  # as session.config's instructions


class VoiceRequest(msgspec.Struct, forbid_unknown_fields=True):
    voice_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    base_voice: Annotated[str, msgspec.Meta(max_length=128)] | None = None  # preset: an engine voice …
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] | None = None  # … with defaults
    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INSTRUCTIONS)] | None = None
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION)] = ""
    ref_audio: str | None = None  # clone: base64 or a data: URI of an audio file …
    # … and what it says (without it: x-vector only, less like the speaker)
    ref_text: Annotated[str, msgspec.Meta(max_length=MAX_REF_TEXT)] | None = None


class Uploads:
    """Registration bodies being received: at most `per_tenant` of a tenant's and `total` in the process.
    Counted on the event loop only (no lock). Past either a registration is refused at once (429)."""

    def __init__(self, per_tenant: int, total: int) -> None:
        self.per_tenant, self.total = per_tenant, total
        self._held: dict[str, int] = {}

    def enter(self, tenant: str) -> str | None:
        """Take a place for `tenant`'s body; None when taken, else why not (the 429's message)."""
        if self._held.get(tenant, 0) >= self.per_tenant:
            return f"{self.per_tenant} voice registrations of this tenant are being uploaded"
        if sum(self._held.values()) >= self.total:
            return f"{self.total} voice registrations are being uploaded"
        self._held[tenant] = self._held.get(tenant, 0) + 1
        return None

    def leave(self, tenant: str) -> None:
        if (left := self._held.get(tenant, 0) - 1) > 0:
            self._held[tenant] = left
        else:
            self._held.pop(tenant, None)


class RegistrationGate:
    """At most `limit` registrations parsing and decoding, their CPU work on `threads` threads of their own.

    A place is taken once the request's body is in (a slow upload holds an upload place, `Uploads`, not
    this) and given back when the request is answered, or, once its work went to a thread, when that
    work has really ended: a client that leaves does not free a place its clip is still decoding in.
    Past the limit a registration is refused at once (429), not queued."""

    def __init__(self, limit: int, threads: int) -> None:
        self._places = threading.BoundedSemaphore(limit)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="voice-registration")

    def enter(self) -> Registration | None:
        return Registration(self._places, self._executor) if self._places.acquire(blocking=False) else None


class Registration:
    def __init__(self, places: threading.BoundedSemaphore, executor: ThreadPoolExecutor) -> None:
        self._places, self._executor = places, executor
        self._handed_off = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the gate's threads; the place goes with it (once per registration)."""
        assert not self._handed_off, "one piece of work per registration"
        future = self._executor.submit(fn, *args)
        self._handed_off = True
        future.add_done_callback(lambda _: self._places.release())
        return await asyncio.wrap_future(future)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if not self._handed_off:
            self._places.release()


_GATE = RegistrationGate(REGISTRATION.decodes, REGISTRATION.decode_threads)
_UPLOADS = Uploads(REGISTRATION.uploads_per_tenant, REGISTRATION.uploads)


def stream_request(
    voice: tuple[str | None, dict[str, Any]], language: str, *, sample_rate: int | None, speed: float,
    seed: int | None, instructions: str | None, output: str = "pcm", word_timings: bool = False,
) -> StreamRequest:
    """The engine request for a stream: the resolved voice (`resolve_voice`) with a registered voice's
    defaults, overridden by the request's settings; checked against StreamRequest's bounds (EngineError)."""
    options = dict(voice[1])
    if sample_rate is not None:
        options["sample_rate"] = sample_rate
    if speed != 1.0:
        options["speed"] = speed
    if seed is not None:
        options["seed"] = seed
    if instructions:
        options["instructions"] = instructions
    if output != "pcm":
        options["output"] = output
    if word_timings:
        options["word_timings"] = True
    return checked_request(voice[0], language, options)


def open_request(engine: Engine, request: StreamRequest) -> Stream:
    """Opens `request` through `open_stream`, the adapter every engine wrapper (admission) sees."""
    return engine.open_stream(request.voice, request.language, **request.options())


async def resolve_voice(
    store: SessionStore, tenant: Tenant, engine: Engine, name: str | None, aliases: Aliases = SHIPPED,
) -> tuple[str | None, dict[str, Any]]:
    """(engine voice, stream options) for a voice name, on every route: through the aliases
    (gateway/aliases.py: the configured table, the engine's own voices, the shipped names), then an
    engine voice as is, a registered voice through the store; an unknown name is passed on for the
    engine to reject (`unknown_voice`)."""
    name = aliases.voice(name, [v.name for v in engine.voices()])
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
    if not engine.supports_cloning:
        raise EngineError("voice_cloning_unsupported", f"voice {name!r} is a clone; this engine cannot clone voices")
    return None, {"ref_audio": voice.ref_audio, "ref_text": voice.ref_text}


# VoiceInfo.extra key an engine sets on the voice that speaks a language when a stream names none:
# comma-separated languages ("en,zh"). It is what speaks a language the named voice cannot.
DEFAULT_FOR = "default_for"


def voice_switches(engine: Engine, voice: str | None, language: str) -> dict[str, str]:
    """{language: voice} for each language a session may speak (every one of the engine's under "auto",
    else the one named) that its voice does not: the engine speaks those segments in that language's
    default voice (Piper's joe has no Mandarin, so Kokoro reads the Han text). A client is told this in
    `session.ready` rather than hearing another voice unannounced. No named voice (the language-aware
    default), a clone or a preset the engine does not list: nothing is switched."""
    infos = engine.voices()
    named = next((v for v in infos if v.name == voice), None)
    if named is None:
        return {}
    wanted = [lang for lang in engine.languages() if lang != "auto"] if language == "auto" else [language]
    switches: dict[str, str] = {}
    for lang in wanted:
        if lang in named.languages:
            continue
        declared = (v.name for v in infos if lang in v.extra.get(DEFAULT_FOR, "").split(","))
        if stand_in := next(declared, None) or next((v.name for v in infos if lang in v.languages), None):
            switches[lang] = stand_in
    return switches


TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]  # vLLM-Omni's (Qwen3-TTS's) tasks


def designs_voices(engine: Engine) -> bool:
    """The engine declares a voice shaped by instructions (engine/types.py VoiceInfo kind "designed")."""
    return any(v.kind == "designed" for v in engine.voices())


def refuse_missing_capability(engine: Engine, task_type: TaskType | None, inline_reference: bool) -> None:
    """A request that asks for what the served model cannot do is refused with a stable code, never
    spoken as something else (a clone request in the default voice). vLLM-Omni's clients ask by
    `task_type` and by sending a reference inline (`ref_audio`, `ref_text`, `x_vector_only_mode`,
    `speaker_embedding`):

    - cloning (`task_type: "Base"`, or an inline reference) on a model that cannot clone:
      `voice_cloning_unsupported`;
    - an inline reference on a model that can: `inline_reference_unsupported` (a clone is registered
      once, POST /v1/audio/voices, and named as the voice: the registry stores it compact and shares it
      across replicas, and a session does not carry megabytes of audio in each config);
    - `task_type: "VoiceDesign"` on a model that designs no voices: `voice_design_unsupported`.

    EngineError: a 400 over HTTP, an `error` event on a WebSocket."""
    if (task_type == "Base" or inline_reference) and not engine.supports_cloning:
        raise EngineError("voice_cloning_unsupported", "this model cannot clone voices (task_type Base, ref_audio, "
                                                       "x_vector_only_mode); use a Base checkpoint")  # fmt: skip
    if inline_reference:
        raise EngineError("inline_reference_unsupported", "a reference is not taken inline: register the voice "
                          "(POST /v1/audio/voices with ref_audio and ref_text), then name it as the voice")  # fmt: skip
    if task_type == "VoiceDesign" and not designs_voices(engine):
        raise EngineError("voice_design_unsupported",
                          "this model designs no voices (task_type VoiceDesign); use a VoiceDesign checkpoint")


@dataclass(frozen=True)
class _Names:
    """What the registration checks a request against, read on the event loop before the work leaves it."""

    engine_voices: frozenset[str]
    reserved: frozenset[str]  # casefolded: names resolved before registered voices, on some route
    cloning: bool


def _names(engine: Engine, aliases: Aliases) -> _Names:
    voices = frozenset(v.name for v in engine.voices())
    reserved = {n.casefold() for n in (*voices, *_ENGINE_DEFAULTS)} | aliases.reserved_voice_names()
    return _Names(voices, frozenset(reserved), engine.supports_cloning)


def _decode_audio(value: str) -> bytes:
    if value.startswith("data:"):
        value = value.partition(",")[2]
    return base64.b64decode(value, validate=True)


def _parse(raw: bytes) -> VoiceRequest:
    try:
        return msgspec.json.decode(raw, type=VoiceRequest)
    except msgspec.ValidationError as e:
        raise invalid(e) from None
    except msgspec.DecodeError:
        raise ApiError("the request body is not valid JSON", code="invalid_json") from None


def _voice_from(raw: bytes, names: _Names) -> Voice:
    """The request body → the voice to store; a clone's clip decoded (bounded) and made compact. Runs on
    the registry's threads."""
    req = _parse(raw)
    if req.voice_id.casefold() in names.reserved:
        # Engine voices, default/auto and the aliases (shipped and configured) are resolved before the
        # registry: a voice registered under one of them would never be used.
        raise ApiError(f"voice_id {req.voice_id!r} is the name of an engine voice or alias, which always wins; "
                       "choose another id", param="voice_id", code="voice_id_reserved")  # fmt: skip
    if req.ref_audio is not None:
        if not names.cloning:
            raise EngineError("voice_cloning_unsupported", "this engine cannot clone voices; register a preset")
        try:
            audio = _decode_audio(req.ref_audio)
        except (binascii.Error, ValueError):
            raise ApiError("ref_audio: not base64 (or a base64 data: URI)", param="ref_audio") from None
        clip = compact_reference(audio)  # EngineError invalid_reference_audio: unreadable, too short or long
        meta = {"description": req.description, "format": "flac", "sample_rate": clip.sample_rate,
                "seconds": clip.seconds}  # fmt: skip
        return Voice(req.voice_id, "clone", req.voice_id, ref_audio=clip.data, ref_text=req.ref_text or None,
                     metadata=meta)  # fmt: skip
    if req.base_voice is None:
        raise ApiError("base_voice: a preset names an engine voice (or send ref_audio + ref_text for a clone)",
                       param="base_voice")
    if req.base_voice not in names.engine_voices:
        raise EngineError("unknown_voice", f"base_voice {req.base_voice!r} is not a voice of this engine")
    meta = {"base_voice": req.base_voice, "speed": req.speed, "instructions": req.instructions,
            "description": req.description}  # fmt: skip
    return Voice(req.voice_id, "preset", req.voice_id, metadata=meta)


def _busy(why: str) -> Response[dict[str, Any]]:
    response = api_error(429, "registration_busy", f"{why}; retry in a moment")
    response.headers["Retry-After"] = "1"
    return response


@post("/v1/audio/voices", status_code=201, request_max_body_size=MAX_BODY_BYTES, guards=[refuse_while_draining],
      opt={"too_large_hint": f" (a clip of up to {MAX_SECONDS:g} s; send it compressed: FLAC, Opus or MP3)"})
async def create_voice(
    request: Request, tenant: NamedDependency[Tenant], engine: NamedDependency[Engine],
    store: NamedDependency[SessionStore], aliases: NamedDependency[Aliases],
) -> Response[dict[str, Any]]:
    """The body is read here, not by Litestar: an upload place (the tenant's) is taken before it arrives,
    it must arrive within `body_timeout_s`, and only then is a place taken to decode its up to 8 MB of
    JSON on the registry's threads."""
    if (refused := _UPLOADS.enter(tenant.name)) is not None:
        return _busy(refused)
    try:
        raw = await _body(request)
        registration = _GATE.enter()
        if registration is None:
            return _busy(f"{REGISTRATION.decodes} voice registrations are being decoded")
        with registration:
            voice = await registration.run(_voice_from, raw, _names(engine, aliases))
            voice = await store.put_voice(tenant.name, voice)
    finally:
        _UPLOADS.leave(tenant.name)
    return Response({"voice_id": voice.voice_id, "kind": voice.kind, "created_ms": voice.created_ms}, status_code=201)


async def _body(request: Request) -> bytes:
    """The request's body, within `body_timeout_s` (408 past it; 413 past MAX_BODY_BYTES, Litestar's)."""
    timeout = REGISTRATION.body_timeout_s
    try:
        return await asyncio.wait_for(request.body(), timeout)
    except TimeoutError:
        raise ApiError(f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       status=408) from None  # fmt: skip


@delete("/v1/audio/voices/{voice_id:str}", status_code=200)
async def delete_voice(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], voice_id: FromPath[str]
) -> Response[dict[str, Any]]:
    if not await store.delete_voice(tenant.name, voice_id):
        raise ApiError(f"no voice {voice_id[:128]!r}", code="voice_not_found", status=404)
    return Response({"id": voice_id, "object": "voice", "deleted": True})  # OpenAI's shape for deletions


@get("/v1/audio/voices")
async def list_voices(
    tenant: NamedDependency[Tenant], engine: NamedDependency[Engine], store: NamedDependency[SessionStore],
    aliases: NamedDependency[Aliases],
) -> Response[dict[str, Any]]:
    voices = [
        {"name": v.name, "languages": list(v.languages), "kind": v.kind, "description": v.description}
        for v in engine.voices()
    ]
    registered = await store.list_voices(tenant.name)
    count, size = await store.voice_usage(tenant.name)
    for v in registered:
        voices.append({"name": v.voice_id, "kind": v.kind, "description": v.metadata.get("description", ""),
                       "base_voice": v.metadata.get("base_voice"), "created_ms": v.created_ms,
                       "bytes": v.ref_audio_bytes})  # fmt: skip
    limits = store.settings
    usage = {"voices": count, "bytes": size, "max_voices": limits.max_voices_per_tenant,
             "max_bytes": limits.max_voice_bytes_per_tenant}  # fmt: skip
    return Response({"voices": voices, "languages": engine.languages(), "aliases": aliases.voice_table(),
                     "cloning": engine.supports_cloning, "usage": usage})  # fmt: skip


voice_routes = [create_voice, delete_voice, list_voices]
