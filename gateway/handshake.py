"""Refusals at the WebSocket handshake: a replica that cannot take a session says so before the upgrade.

A session refused after the upgrade costs the client a round trip and a closed socket, and a balancer
cannot retry it (the upgrade was answered 101, so the request counts as served). Refused before it, as
HTTP 503 with `Retry-After` and the reason's stable code in OpenAI's error body, it is an ordinary failed
request: HAProxy (`retry-on 503`, `option redispatch`) and nginx (`proxy_next_upstream http_503`) send it
to another replica at once and the client never sees it (deploy/haproxy.cfg, deploy/nginx.conf).

The reasons, in the order checked:
- `engine_not_ready`: no model is serving (warming up, restarting after a crash, failed, unloaded);
- `draining`: the replica is leaving (SIGTERM, gateway/drain.py);
- `replica_full`: `max_sessions` WebSocket sessions are open (0: no bound). A session counts from its
  handshake until its socket closes, on every WebSocket route.

Where the server offers no handshake denial (ASGI's `websocket.http.response` extension; uvicorn has it,
Litestar's test client has not), the refusal is made the old way: accepted, an `error` event, a close.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.drain import DRAIN_REASON, DRAIN_RETRY_AFTER_S
from gateway.protocol import CLOSE_RECONNECT, CLOSE_TRY_LATER, encode, error_event

# How long a refused client (or a balancer with no other replica) waits before trying this replica again:
# a session ends within seconds to minutes, an engine restart takes seconds.
FULL_RETRY_AFTER_S = 1.0
NOT_READY_RETRY_AFTER_S = 2.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a session cannot start here: its stable code, a sentence, when to try again, and the close
    code used where the refusal has to be made after an upgrade."""

    code: str
    message: str
    retry_after_s: float
    close_code: int

    def body(self) -> bytes:
        """OpenAI's error body (gateway/errors.py's shape), as any HTTP refusal of ours."""
        error = {"message": self.message, "type": "invalid_request_error", "param": None, "code": self.code}
        return json.dumps({"error": error}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", b"application/json"),
                (b"retry-after", str(max(1, math.ceil(self.retry_after_s))).encode())]  # fmt: skip


NOT_READY = Refusal("engine_not_ready", "the engine is warming up", NOT_READY_RETRY_AFTER_S, CLOSE_TRY_LATER)
DRAINING = Refusal("draining", DRAIN_REASON, DRAIN_RETRY_AFTER_S, CLOSE_RECONNECT)
FULL = Refusal("replica_full", "this replica holds as many sessions as it is allowed: try another",
               FULL_RETRY_AFTER_S, CLOSE_TRY_LATER)  # fmt: skip


def refusal(*, serving: bool, draining: bool, open_sessions: int, max_sessions: int) -> Refusal | None:
    """The refusal a new session gets, or None: it may start."""
    if not serving:
        return NOT_READY
    if draining:
        return DRAINING
    if max_sessions and open_sessions >= max_sessions:
        return FULL
    return None


class SessionCount:
    """The WebSocket sessions open on this replica (the handshake middleware keeps it)."""

    def __init__(self, max_sessions: int = 0) -> None:
        if max_sessions < 0:
            raise ValueError("max_sessions must be ≥ 0 (0: no bound)")
        self.max_sessions = max_sessions
        self.open = 0

    def __len__(self) -> int:
        return self.open


def handshake_middleware(app: ASGIApp) -> ASGIApp:
    """Every WebSocket route: refuse before the upgrade (HTTP 503) when the replica cannot take a session,
    and count the sessions it lets through."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await app(scope, receive, send)
            return
        state = scope["litestar_app"].state
        count: SessionCount = state.sessions
        refused = refusal(serving=state.models.any_serving() is not None, draining=state.drain.draining,
                          open_sessions=count.open, max_sessions=count.max_sessions)  # fmt: skip
        if refused is not None:
            await _refuse(scope, receive, send, refused)
            return
        count.open += 1
        try:
            await app(scope, receive, send)
        finally:
            count.open -= 1

    return middleware


async def _refuse(scope: Scope, receive: Receive, send: Send, refused: Refusal) -> None:
    message = await receive()  # websocket.connect
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 503,  # type: ignore[typeddict-item]
                    "headers": refused.headers()})  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": refused.body()})  # type: ignore[typeddict-item]
        return
    await send({"type": "websocket.accept", "subprotocol": None, "headers": []})
    await send({"type": "websocket.send", "text": encode(error_event(refused.code, refused.message))})  # type: ignore[typeddict-item]
    await send({"type": "websocket.close", "code": refused.close_code, "reason": refused.code.replace("_", " ")})  # type: ignore[typeddict-item]
