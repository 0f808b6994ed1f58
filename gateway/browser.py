"""What a browser may reach, and which Host names are answered without a credential.

A web page can make its visitor's browser send requests anywhere, the gateway on loopback included, and
with DNS rebinding read the answers. The rules:

- Origin: a request that carries `Origin` (every browser's WebSocket and cross-origin request) is
  answered only when that origin is the server's own (scheme-default ports aside, its host:port is the
  request's `Host`) or is listed in `allowed_origins` ("*": any). Without `Origin`, a browser's
  `Sec-Fetch-Site: cross-site` is refused likewise. Requests without either come from programs, not
  pages, and pass.
- Host: what is answered without a credential (open mode, the keyless admin plane) is answered only for
  a loopback name (`localhost`, `*.localhost`, a loopback address) or a name listed in `allowed_hosts`
  ("*": any): a rebound name (`evil.example` resolving to 127.0.0.1) is refused. A request without
  `Host` (HTTP/1.0 health checks) is no browser's and passes.
- The admin socket (`admin_socket`): only its owner can connect, and no browser can; neither rule applies.
- `/health` and `/livez` answer probes, which send whatever Host the platform picks: neither rule applies.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from gateway.errors import ApiError
from gateway.settings import Settings

PROBES = frozenset({"/health", "/livez"})  # answered to every Host and Origin: nothing in them to steal
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def via_admin_socket(scope: Mapping[str, object], settings: Settings) -> bool:
    """Whether the request came in through the admin socket (a Unix socket: uvicorn's server is its path)."""
    server = scope.get("server")
    return bool(settings.admin_socket) and isinstance(server, tuple | list) and len(server) == 2 \
        and server[1] is None and server[0] == settings.admin_socket  # fmt: skip


def _split_host(host: str) -> tuple[str, str | None]:
    """("name", "port" or None) of a Host value or an origin's authority; IPv6 keeps its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest.removeprefix(":") or None
    name, sep, port = host.rpartition(":")
    return (name, port or None) if sep and port.isdigit() else (host, None)


def _origin_authority(origin: str) -> str | None:
    """An origin's host[:port], its scheme's default port left out; None for "null" or a malformed one."""
    scheme, sep, rest = origin.strip().lower().rstrip("/").partition("://")
    if not sep or not rest or "/" in rest:
        return None
    name, port = _split_host(rest)
    return name if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{name}:{port}"


def _host_authority(host: str) -> str:
    """A Host value as an origin's authority: port 80 or 443 left out (the browser used its scheme's)."""
    name, port = _split_host(host)
    return name if port in (None, "80", "443") else f"{name}:{port}"


def is_loopback_name(name: str) -> bool:
    """localhost, *.localhost (browsers resolve them to loopback themselves), or a loopback address."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def origin_refusal(headers: Mapping[str, str], settings: Settings) -> ApiError | None:
    """403 `origin_not_allowed` for a browser request from a page of another origin; None: it may go on."""
    origin = headers.get("origin")
    allowed = settings.origin_list
    if origin is None:
        if headers.get("sec-fetch-site", "").lower() != "cross-site" or "*" in allowed:
            return None
        return ApiError("a cross-site browser request is refused (allowed_origins lists the pages allowed)",
                        code="origin_not_allowed", status=403)  # fmt: skip
    if "*" in allowed or origin.strip().lower().rstrip("/") in allowed:
        return None
    authority = _origin_authority(origin)
    host = headers.get("host")
    if authority is not None and host is not None and authority == _host_authority(host):
        return None  # the server's own page (the playground)
    return ApiError(f"requests from the origin {origin[:100]!r} are refused (the allowed_origins setting lists "
                    "the origins allowed besides the server's own)", code="origin_not_allowed", status=403)  # fmt: skip


def host_refusal(headers: Mapping[str, str], settings: Settings) -> ApiError | None:
    """403 `host_not_allowed` for a Host that is no loopback name and is not listed; None: it may go on."""
    host = headers.get("host")
    if host is None or "*" in settings.host_list:
        return None
    name, _ = _split_host(host)
    if is_loopback_name(name) or host.strip().lower() in settings.host_list or name in settings.host_list:
        return None
    return ApiError(f"the Host {host[:100]!r} is not answered without an API key (the allowed_hosts setting "
                    "lists the names allowed besides loopback ones)", code="host_not_allowed", status=403)  # fmt: skip


def browser_refusal(connection: ASGIConnection, settings: Settings, *, credential: bool) -> ApiError | None:
    """Why this request is refused by the rules above (None: it is not). `credential`: whether the route
    needs a key here (then a rebound Host gains nothing and is not checked)."""
    if connection.scope.get("path") in PROBES or via_admin_socket(connection.scope, settings):
        return None
    headers = connection.headers
    refusal = origin_refusal(headers, settings)
    if refusal is None and not credential:
        refusal = host_refusal(headers, settings)
    return refusal


def browser_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Every HTTP route: the rules above. The WebSocket route applies them itself, after its upgrade, so
    that the client is told why in an event and a close reason (gateway/app.py)."""
    if connection.scope["type"] != "http":
        return
    state = connection.app.state
    refusal = browser_refusal(connection, state.settings, credential=not state.api_keys.is_open)
    if refusal is not None:
        raise refusal
