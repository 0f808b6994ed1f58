"""A streaming session's start and run, whichever wire it speaks: the native `/v1/audio/speech/stream`, the
providers' sockets (gateway/protocols/routes.py) and their HTTP routes played as scripts
(gateway/protocols/http.py) all refuse a caller by `refusal` and serve one through `serve_connection`, so
every session is the same Connection under the same drain, aliases and bounds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from litestar.connection import WebSocket
from litestar.datastructures import State

from gateway.auth import KEY_FORMS, authenticate
from gateway.browser import browser_refusal
from gateway.connection import Connection, SendAudio
from gateway.drain import DRAIN_REASON, Drain
from gateway.models import ModelRegistry
from gateway.protocol import CLOSE_POLICY, CLOSE_RECONNECT, CLOSE_TRY_LATER, ProtocolError
from gateway.session_state import SessionBinding
from gateway.settings import Settings
from sessions import SessionStore, Tenant

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[bytes | str], Awaitable[None]]


@dataclass(frozen=True)
class Refusal:
    """Why a socket may not start a session: each wire says it in its own shape, then closes."""

    code: str  # voxgate's stable code
    message: str
    close_code: int

    @property
    def reason(self) -> str:  # the close frame's reason ("engine not ready")
        return self.code.replace("_", " ")


def refusal(socket: WebSocket, state: State) -> Refusal | None:
    """Why this caller may not start a session now; None: it may. Whether the replica can take one (engine
    ready, not draining, room) was answered at the handshake (gateway/handshake.py); the last model can go,
    or a drain begin, between the handshake and here."""
    if (refused := browser_refusal(socket, state.settings, credential=not state.api_keys.is_open)) is not None:
        return Refusal(refused.code, refused.message, CLOSE_POLICY)
    if authenticate(socket, query=True) is None:
        return Refusal("unauthorized", f"a valid API key is required ({KEY_FORMS} or ?api_key=)", CLOSE_POLICY)
    if state.models.any_serving() is None:
        return Refusal("engine_not_ready", "the engine is warming up", CLOSE_TRY_LATER)
    if state.drain.draining:
        return Refusal("draining", DRAIN_REASON, CLOSE_RECONNECT)
    return None


async def serve_connection(state: State, store: SessionStore, settings: Settings, tenant: Tenant, receive: Receive,
                           send: Send, *, made: Callable[[Connection], None] | None = None,
                           socket: WebSocket | None = None, interleaved: SendAudio | None = None) -> None:  # fmt: skip
    """Run one session: a native Connection reading `receive` and writing `send` on the serving model (each
    session.config's `model` may select another: models.select), counted by the drain, with the operator's
    voice aliases. `made` is given the Connection before it runs (a wire that needs it); `socket`, when
    given, is closed with the Connection's close code and reason at the end; `interleaved`, when given,
    gets every audio frame with its utterance, and named contexts interleave (gateway/playout.py)."""
    models: ModelRegistry = state.models
    served = models.any_serving()
    if served is None or served.served is None:
        raise ProtocolError("engine_not_ready", "the engine is warming up")
    drain: Drain = state.drain
    binding = SessionBinding(store, tenant, state.aliases)
    conn = Connection(served.served, settings.limits, binding, receive, send, model=served.name,
                      admission=served.admission, select=models.select, draining=lambda: drain.draining,
                      interleaved=interleaved)  # fmt: skip
    if made is not None:
        made(conn)
    drain.opened(conn)
    try:
        await conn.run()
    finally:
        drain.closed(conn)
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close(code=conn.close_code, reason=conn.close_reason)
