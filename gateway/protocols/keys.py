"""The providers' forms of an API key, beside voxgate's own (gateway/auth.py)."""

from __future__ import annotations

from litestar.connection import ASGIConnection

from gateway.auth import authenticate
from sessions import Tenant

# The header (and query) forms of a key the providers' clients send, beside voxgate's own.
PROVIDER_KEY_HEADERS = ("xi-api-key", "x-api-key")


def provider_tenant(connection: ASGIConnection, *, query: bool) -> Tenant | None:
    """The caller's tenant by voxgate's key forms, or by a provider's (`xi-api-key`, ElevenLabs')."""
    tenant = authenticate(connection, query=query)
    if tenant is not None:
        return tenant
    keys = connection.app.state.api_keys
    for name in PROVIDER_KEY_HEADERS:
        if (presented := connection.headers.get(name)) is not None and (t := keys.authenticate(presented)):
            return t
    return None
