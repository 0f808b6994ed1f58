"""`POST /v1/audio/speech/batch`: several texts in one request, in vLLM-Omni's shape.

The body carries shared defaults (every field of POST /v1/audio/speech but `input`) and `items`, 1 to
32 objects that each need only `input` and may override any default. Items are synthesised
concurrently, each through its model's admission (capacity and tenant fairness) as every other stream,
and each is checked like a POST /v1/audio/speech body (its `model` picks one: gateway/models.py). The
answer is one JSON object: `{id, results: [{index, status, audio_data (base64), media_type, usage} |
{index, status, error, code, param?, retry_after_s?}], total, succeeded, failed}` in item order; an
item that fails (a bad voice, a full queue) fails alone. Only when every item was refused for a full
queue is the whole request a 429.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from engine import Engine, EngineError
from gateway.admission import QueueFull
from gateway.audio import MEDIA_TYPES, encode_file
from gateway.drain import refuse_while_draining
from gateway.errors import ApiError, invalid
from gateway.lexicons import spoken_segments
from gateway.models import ModelRegistry, api_serving
from gateway.openai_api import MAX_INPUT_CHARS, SpeechRequest, admitted, speech_pcm, speech_request, while_connected
from gateway.queued_stream import ticketed
from gateway.session_state import acquire_stream_slot, release_stream_slot
from gateway.settings import Settings
from gateway.timing import ResponseClock, observe, trim_for
from sessions import SessionStore, SessionStoreError, Tenant

log = logging.getLogger("voxgate")

MAX_BATCH_ITEMS = 32  # vLLM-Omni's tts_batch_max_items
# All items' input together: twice one full request. The answer holds every item's audio at once
# (about 10 minutes of speech for 8192 characters, ~28 MB of 24 kHz PCM before base64). A lexicon may
# lengthen each item's text to Limits.max_respelling_growth times it (gateway/lexicons.py), no more.
MAX_BATCH_CHARS = 2 * MAX_INPUT_CHARS
# The longest valid body: the batch's characters, 33 sets of instructions (500) and names (3 × 128),
# each character a 12-byte JSON escape (a surrogate pair), and the rest.
MAX_BATCH_BODY_BYTES = 512 * 1024
# A backstop per item past admission: an admitted stream is kept ahead of its listener, so speech comes
# at least in real time (~14 characters/s English, ~4.5 Mandarin); 4 characters/s leaves a wide margin.
ITEM_TIMEOUT_BASE_S = 30.0
ITEM_TIMEOUT_S_PER_CHAR = 0.25
_STREAMING_FIELDS = ("stream", "stream_format")  # a batch answers whole files


@dataclass(frozen=True)
class _Caller:
    request: Request
    tenant: Tenant
    models: ModelRegistry
    store: SessionStore
    settings: Settings


def _item_request(fields: dict[str, Any]) -> SpeechRequest:
    try:
        return msgspec.convert(fields, SpeechRequest)
    except msgspec.ValidationError as e:
        raise invalid(e) from None


def _check_items(items: list[Any]) -> None:
    """Every item is an object, and their inputs together are within the batch's bound."""
    chars = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ApiError(f"items[{i}] must be an object with input", param="items")
        if isinstance(item.get("input"), str):
            chars += len(item["input"])
    if chars > MAX_BATCH_CHARS:
        raise ApiError(f"a batch's inputs are limited to {MAX_BATCH_CHARS} characters in all", param="items",
                       code="string_above_max_length")  # fmt: skip


def _parse_batch(body: dict[str, Any]) -> list[SpeechRequest | ApiError]:
    """Each item's request (defaults merged, checked as POST /v1/audio/speech checks a body), or the
    ApiError that item alone answers with. A malformed batch as a whole raises ApiError (a 400)."""
    items = body.pop("items", None)
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_ITEMS:
        raise ApiError(f"items must be a list of 1 to {MAX_BATCH_ITEMS} objects", param="items")
    if "input" in body:
        raise ApiError("input belongs in each item, not in the batch's defaults", param="input")
    for name in _STREAMING_FIELDS:
        if body.get(name) not in (None, False, "audio") or any(
            isinstance(i, dict) and i.get(name) not in (None, False, "audio") for i in items
        ):
            raise ApiError("a batch answers whole files; streaming is POST /v1/audio/speech", param=name)
    _item_request({**body, "input": "x"})  # bad defaults fail the batch, naming the field
    _check_items(items)
    out: list[SpeechRequest | ApiError] = []
    for item in items:
        try:
            out.append(_item_request({**body, **item}))
        except ApiError as e:
            out.append(e)
    return out


# Item refusals a later try may get past: admission's line (queue_full), the tenant's max_streams (stream_limit).
_TRY_LATER = ("queue_full", "stream_limit")


def _error(index: int, e: ApiError, **extra: object) -> dict[str, Any]:
    # vLLM-Omni's item error is a message string; the stable code (and the field it names) ride beside it.
    out: dict[str, Any] = {"index": index, "status": "error", "error": e.message, "code": e.code}
    if e.param is not None:
        out["param"] = e.param
    return out | extra


def _encode(pcm: np.ndarray, rate: int, fmt: str) -> str:
    return base64.b64encode(encode_file(pcm, rate, fmt)).decode("ascii")


async def _item(index: int, req: SpeechRequest | ApiError, who: _Caller) -> dict[str, Any]:
    if isinstance(req, ApiError):
        return _error(index, req)
    ticket, slot = None, None
    try:
        model = api_serving(who.models, req.model)  # each item's `model` picks one (unknown_model, …)
        engine = cast(Engine, model.served)
        stream_req, respelled = await speech_request(req, engine, who.store, who.tenant, who.models.aliases)
        spoken = await spoken_segments(req.input, stream_req.language, respelled, who.settings.limits)
        rate = stream_req.sample_rate or engine.sample_rate
        slot = await acquire_stream_slot(who.store, who.tenant)  # each item is a stream of the tenant's max_streams
        ticket = await admitted(model.admission, who.tenant, stream_req, req.input)  # as POST /v1/audio/speech
        clock = ResponseClock(rate, None, ticket.waited_s if ticket is not None else 0.0)
        trim = trim_for(rate, who.settings.limits)
        # The text spoken (respelled, normalised) is what takes time to say, more than the text sent.
        chars = max(len(req.input), sum(map(len, spoken)))
        async with asyncio.timeout(ITEM_TIMEOUT_BASE_S + ITEM_TIMEOUT_S_PER_CHAR * chars):
            # The ticketed stream counts its audio to the tenant and releases the ticket as it ends.
            pcm_chunks = speech_pcm(ticketed(engine, ticket), stream_req, spoken, trim, clock)
            parts = [pcm async for pcm in pcm_chunks]
        pcm = np.concatenate(parts) if parts else np.zeros(0, np.int16)
    except QueueFull as e:
        refusal = ApiError(e.message, code="queue_full")
        return _error(index, refusal, bound=e.bound, retry_after_s=round(e.retry_after_s, 1))
    except TimeoutError:
        return _error(index, ApiError("synthesis took longer than its bound", code="timeout"))
    except (ApiError, EngineError, SessionStoreError) as e:  # answered as the app's table answers them
        return _error(index, ApiError.of(e))
    except Exception as e:  # one item's failure never fails its siblings; the log has the trace
        log.exception("batch item %d failed", index)
        return _error(index, ApiError(f"synthesis failed: {type(e).__name__}", code="synthesis_failed"))
    finally:
        if ticket is not None:
            ticket.release()  # idempotent: also when the stream never opened (a bad voice)
        await release_stream_slot(slot)
    fmt = req.response_format
    audio = await asyncio.to_thread(_encode, pcm, rate, fmt)
    # Timed as POST /v1/audio/speech times a file: the audio goes when the whole of it is ready.
    clock.audio(pcm)
    clock.trimmed = trim.trimmed
    timing = clock.record()
    observe(timing, model.name, who.tenant.name)
    usage = {"input_tokens": len(req.input), "output_tokens": len(pcm), "total_tokens": len(req.input)}
    return {"index": index, "status": "success", "audio_data": audio, "media_type": MEDIA_TYPES[fmt], "usage": usage,
            "timing": msgspec.to_builtins(timing)}  # fmt: skip


@post("/v1/audio/speech/batch", status_code=200, request_max_body_size=MAX_BATCH_BODY_BYTES,
      guards=[refuse_while_draining])  # fmt: skip
async def create_speech_batch(
    data: JSONBody[dict[str, Any]], request: Request, tenant: NamedDependency[Tenant],
    models: NamedDependency[ModelRegistry], store: NamedDependency[SessionStore], settings: NamedDependency[Settings],
) -> Response[Any]:
    who = _Caller(request, tenant, models, store, settings)
    reqs = _parse_batch(data)
    # The client left (or the server stops): its streams and tickets go now.
    work, _ = await while_connected(request, asyncio.gather(*(_item(i, r, who) for i, r in enumerate(reqs))))
    if work.cancelled():
        raise ApiError("the client disconnected", code="client_disconnected", status=499)
    results = work.result()
    refused = [r for r in results if r.get("code") in _TRY_LATER]
    if len(refused) == len(results):  # nothing could start: the whole request is refused, as a 429
        retry = min(float(r.get("retry_after_s", 1.0)) for r in refused)
        return ApiError(refused[0]["error"], code=refused[0]["code"], status=429, retry_after_s=retry).response()
    succeeded = sum(1 for r in results if r["status"] == "success")
    body = {"id": f"speech-batch-{uuid.uuid4().hex}", "results": results, "total": len(results),
            "succeeded": succeeded, "failed": len(results) - succeeded}  # fmt: skip
    # Up to tens of MB of base64: serialised off the event loop.
    data = await asyncio.to_thread(msgspec.json.encode, body)
    return Response(data, media_type="application/json")


batch_routes = [create_speech_batch]
