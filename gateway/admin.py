"""The admin control plane: each model's state and memory, and loading and unloading models at run time.

    GET  /v1/admin/models                   every model's record (state, pid, streams, memory, …)
    GET  /v1/admin/models/{name}            one
    POST /v1/admin/models/{name}/load       start loading it (202; poll its state)
    POST /v1/admin/models/{name}/unload     {"grace_s": 30}: drain it, then close its engine (202)

Who is answered (the same for `/metrics`, which names every tenant):
- a caller on the admin socket (`admin_socket`: a Unix socket, mode 0600), without a key;
- with `admin_key` configured, a caller presenting it (not a tenant's key: refused like any wrong one);
- with `admin_open_loopback` (a developer's machine), a loopback caller whose request no proxy marks as
  forwarded, to a loopback or listed Host, from no foreign page (gateway/browser.py);
- nobody else: the peer's address is no credential, since a proxy or service-mesh sidecar on the same
  host makes every caller loopback.
Every admin POST carries `Content-Type: application/json` (415 otherwise): a page cannot send that
without a preflight the gateway never answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath

from gateway import engine_report
from gateway.auth import KEY_FORMS, presented_key
from gateway.browser import browser_refusal, via_admin_socket
from gateway.errors import ApiError
from gateway.models import ModelHandle, ModelRegistry, ModelUnavailable
from gateway.settings import Settings
from sessions import is_loopback

_FORWARDED = ("forwarded", "x-forwarded-for", "x-real-ip")


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The rules above: 401 `unauthorized` for a missing or wrong admin key, 403 `admin_key_required` where
    none is configured, 403 `admin_loopback_only` / `host_not_allowed` on the loopback opt-in, 415
    `unsupported_media_type` for a POST that is not JSON."""
    settings: Settings = connection.app.state.settings
    if connection.scope.get("method") == "POST":
        media = (connection.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise ApiError("admin requests must be sent as Content-Type: application/json",
                           code="unsupported_media_type", status=415)  # fmt: skip
    if via_admin_socket(connection.scope, settings):
        return
    if settings.admin_digest:
        presented = presented_key(connection)
        given = hashlib.sha256((presented or "").encode("utf-8")).hexdigest()
        if presented is None or not hmac.compare_digest(given, settings.admin_digest):
            raise ApiError(f"the admin key is required ({KEY_FORMS})", code="unauthorized",
                           status=401)  # fmt: skip
        return
    if not settings.admin_open_loopback:
        raise ApiError("the admin plane needs the admin key (setting admin_key) or the admin socket (setting "
                       "admin_socket)", code="admin_key_required", status=403)  # fmt: skip
    host = connection.client.host if connection.client is not None else ""
    if not is_loopback(host) or any(h in connection.headers for h in _FORWARDED):
        raise ApiError("without an admin key the admin routes answer direct loopback callers only",
                       code="admin_loopback_only", status=403)  # fmt: skip
    refusal = browser_refusal(connection, settings, credential=False)
    if refusal is not None:
        raise refusal


class UnloadRequest(msgspec.Struct, forbid_unknown_fields=True):
    grace_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None  # None: the drain_grace_s setting


def _capabilities(handle: ModelHandle) -> dict[str, Any] | None:
    engine = handle.engine
    if engine is None or handle.state != "ready":  # an engine process declares them once warm
        return None
    return {"sample_rate": engine.sample_rate, "cloning": bool(getattr(engine, "supports_cloning", False)),
            "codec_tokens": engine.codec_info() is not None, "languages": engine.languages(),
            "voices": len(engine.voices())}  # fmt: skip


def model_record(models: ModelRegistry, handle: ModelHandle) -> dict[str, Any]:
    """What the admin plane says of one model. Reads engines' own reports: run it off the event loop."""
    engine = handle.engine
    memory = None if engine is None else engine_report.memory(engine)
    return {
        "id": handle.name, "object": "model", "default": handle.name == models.default, "source": handle.spec.source,
        "state": handle.state, "error": handle.error or getattr(engine, "last_error", None),
        "pid": None if memory is None else memory["pid"],
        "streams": handle.streams, "capabilities": _capabilities(handle), "warm_up_s": handle.warm_up_s,
        "loaded_at": handle.loaded_at, "memory": memory,
        "telemetry": None if engine is None else engine_report.telemetry(engine),
    }  # fmt: skip


def _models(request: Request) -> ModelRegistry:
    return request.app.state.models


def _act(request: Request, act: Callable[[ModelRegistry], ModelHandle]) -> ModelHandle:
    """`act` on the models; unknown_model a 404, a model in the wrong state a 409."""
    try:
        return act(_models(request))
    except ModelUnavailable as e:
        raise e.api_error() from None


async def _record(request: Request, handle: ModelHandle) -> dict[str, Any]:
    return await asyncio.to_thread(model_record, _models(request), handle)


@get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    models = _models(request)
    records = await asyncio.to_thread(lambda: [model_record(models, h) for h in models])
    return {"object": "list", "data": records}


@get("/models/{name:str}")
async def get_model(request: Request, name: FromPath[str]) -> dict[str, Any]:
    return await _record(request, _act(request, lambda m: m.handle(name)))


@post("/models/{name:str}/load", status_code=202)
async def load_model(request: Request, name: FromPath[str]) -> dict[str, Any]:
    return await _record(request, _act(request, lambda m: m.load(name)))


@post("/models/{name:str}/unload", status_code=202)
async def unload_model(request: Request, name: FromPath[str]) -> Response[dict[str, Any]]:
    body = await request.body()
    try:
        req = msgspec.json.decode(body, type=UnloadRequest) if body.strip() else UnloadRequest()
    except msgspec.ValidationError as e:
        raise ApiError(str(e), param="grace_s") from None
    except msgspec.DecodeError:
        raise ApiError("the request body is not valid JSON", code="invalid_json") from None
    grace = request.app.state.settings.drain_grace_s if req.grace_s is None else req.grace_s
    handle = _act(request, lambda m: m.unload(name, grace))
    return Response(await _record(request, handle), status_code=202)


admin_router = Router("/v1/admin", route_handlers=[list_models, get_model, load_model, unload_model],
                      guards=[admin_guard])  # fmt: skip
admin_routes = [admin_router]
