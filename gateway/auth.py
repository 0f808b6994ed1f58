"""Who is calling: an API key (header or, for browsers' WebSockets, a query parameter) → a tenant."""

from __future__ import annotations

from litestar.connection import ASGIConnection

from gateway.errors import ApiError
from gateway.models import ModelHandle, api_serving
from sessions import ApiKeys, Tenant, key_from_headers


def authenticate(connection: ASGIConnection, *, query: bool = False) -> Tenant | None:
    """The caller's tenant, the default tenant in open mode, or None for a missing or wrong key.

    `query`: also take `?api_key=` — only the WebSocket route does, since browsers cannot set headers
    on a WebSocket; everywhere else a key in the URL (which proxies and logs keep) is not accepted."""
    keys: ApiKeys = connection.app.state.api_keys
    presented = key_from_headers(connection.headers.get("authorization"), connection.headers.get("x-api-key"))
    if presented is None and query:
        presented = connection.query_params.get("api_key")
    return keys.authenticate(presented)


def caller(connection: ASGIConnection) -> Tenant:
    """The caller's tenant; a missing or wrong key is a 401 (the app turns ApiError into the response)."""
    tenant = authenticate(connection)
    if tenant is None:
        raise ApiError("a valid API key is required", code="unauthorized", status=401)
    return tenant


def serving_model(connection: ASGIConnection) -> ModelHandle:
    """The model `?model=` names (the default without one) if it serves now: 404 unknown_model, or a 503
    (engine_not_ready before it is warm, model_unloading, …)."""
    return api_serving(connection.app.state.models, connection.query_params.get("model"))
