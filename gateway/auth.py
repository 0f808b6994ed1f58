"""Who is calling: an API key → a tenant.

A key is taken in every form the clients voxgate serves send one (`presented_key`): OpenAI's SDKs and
most HTTP clients send `Authorization: Bearer <key>`; vLLM-Omni's harnesses `Authorization: Api-Key
<key>`; Django-style clients `Authorization: Token <key>`; ElevenLabs' SDKs and plugins `xi-api-key`;
Cartesia's and many gateways' `X-API-Key`. WebSocket routes also take `?api_key=` (or `?api-key=`), since
browsers cannot set headers on a WebSocket; on HTTP a key in the URL (which proxies and logs keep) is not
taken.
"""

from __future__ import annotations

from litestar.connection import ASGIConnection

from gateway.errors import ApiError
from gateway.models import ModelHandle, api_serving
from sessions import ApiKeys, Tenant

# `Authorization: <scheme> <key>` schemes that carry a key as is (case-insensitive).
AUTH_SCHEMES = frozenset({"bearer", "api-key", "apikey", "token"})
KEY_HEADERS = ("xi-api-key", "x-api-key")  # ElevenLabs', then the common one
QUERY_KEYS = ("api_key", "api-key")
KEY_FORMS = "Authorization: Bearer/Api-Key/Token, xi-api-key or X-API-Key"  # for refusals' messages


def presented_key(connection: ASGIConnection, *, query: bool = False) -> str | None:
    """The key the caller presented, in any form it may come (the module's docstring), or None.
    `query`: also a `?api_key=` / `?api-key=` query parameter (WebSocket routes only)."""
    authorization = connection.headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() in AUTH_SCHEMES and value.strip():
            return value.strip()
    for name in KEY_HEADERS:
        if (value := connection.headers.get(name)) and value.strip():
            return value.strip()
    if query:
        for name in QUERY_KEYS:
            if (value := connection.query_params.get(name)) and value.strip():
                return value.strip()
    return None


def authenticate(connection: ASGIConnection, *, query: bool = False) -> Tenant | None:
    """The caller's tenant, the default tenant in open mode, or None for a missing or wrong key.
    `query`: also take the key from the URL (`presented_key`) — WebSocket routes only."""
    keys: ApiKeys = connection.app.state.api_keys
    return keys.authenticate(presented_key(connection, query=query))


def caller(connection: ASGIConnection) -> Tenant:
    """The caller's tenant; a missing or wrong key is a 401 (the app turns ApiError into the response)."""
    tenant = authenticate(connection)
    if tenant is None:
        raise ApiError(f"a valid API key is required ({KEY_FORMS})", code="unauthorized", status=401)
    return tenant


def serving_model(connection: ASGIConnection) -> ModelHandle:
    """The model `?model=` names (the default without one) if it serves now: 404 unknown_model, or a 503
    (engine_not_ready before it is warm, model_unloading, …)."""
    return api_serving(connection.app.state.models, connection.query_params.get("model"))
