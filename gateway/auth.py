"""Who is calling: an API key (header or, for browsers' WebSockets, a query parameter) → a tenant."""

from __future__ import annotations

from litestar.connection import ASGIConnection

from sessions import ApiKeys, Tenant, key_from_headers


def authenticate(connection: ASGIConnection) -> Tenant | None:
    """The caller's tenant, the default tenant in open mode, or None for a missing or wrong key."""
    keys: ApiKeys = connection.app.state.api_keys
    presented = key_from_headers(connection.headers.get("authorization"), connection.headers.get("x-api-key"))
    if presented is None:
        presented = connection.query_params.get("api_key")  # browsers cannot set WebSocket headers
    return keys.authenticate(presented)
