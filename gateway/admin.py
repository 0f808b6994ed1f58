"""The admin control plane: each model's state and memory, and loading and unloading models at run time.

    GET  /v1/admin/models                   every model's record (state, pid, streams, memory, …)
    GET  /v1/admin/models/{name}            one
    POST /v1/admin/models/{name}/load       start loading it (202; poll its state)
    POST /v1/admin/models/{name}/unload     {"grace_s": 30}: drain it, then close its engine (202)

Behind the admin key (the `admin_key` setting: its sha256, as tenants' keys are given), which is not a
tenant's key: a tenant's is refused like any wrong key. Without an admin key configured only loopback
callers are answered, and not through a proxy that says it forwarded the request (a proxy on the same
host makes every caller loopback: configure an admin key there).
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
from gateway.errors import ApiError
from gateway.models import ModelHandle, ModelRegistry, ModelUnavailable
from sessions import is_loopback, key_from_headers

_FORWARDED = ("forwarded", "x-forwarded-for", "x-real-ip")


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """401 unless the admin key is presented (or, with none configured, 403 for a caller not on loopback)."""
    digest = connection.app.state.settings.admin_digest
    if digest:
        presented = key_from_headers(connection.headers.get("authorization"), connection.headers.get("x-api-key"))
        given = hashlib.sha256((presented or "").encode("utf-8")).hexdigest()
        if presented is None or not hmac.compare_digest(given, digest):
            raise ApiError("the admin key is required (Authorization: Bearer or X-API-Key)", code="unauthorized",
                           status=401)  # fmt: skip
        return
    host = connection.client.host if connection.client is not None else ""
    if not is_loopback(host) or any(h in connection.headers for h in _FORWARDED):
        raise ApiError("the admin routes answer loopback callers only when no admin_key is configured",
                       code="admin_loopback_only", status=403)  # fmt: skip


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
