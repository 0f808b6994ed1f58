"""The provider protocols' routes: each accepts the provider's socket, checks it as the native route does
(origin, key, a model serving, no drain), and runs a native Connection through the provider's Wire."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import msgspec
from litestar import websocket
from litestar.connection import WebSocket
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.browser import browser_refusal
from gateway.connection import Connection
from gateway.drain import DRAIN_REASON, Drain
from gateway.models import ModelRegistry
from gateway.protocol import CLOSE_POLICY, CLOSE_RECONNECT, CLOSE_TRY_LATER, ProtocolError
from gateway.protocols import cartesia, elevenlabs
from gateway.protocols.bridge import Bridge, Wire
from gateway.protocols.http import http_routes
from gateway.protocols.keys import provider_tenant
from gateway.session_state import SessionBinding
from gateway.settings import Settings
from sessions import SessionStore


def refusal(socket: WebSocket, state: State) -> tuple[str, str, int] | None:
    """Why a provider socket cannot start (code, message, close code); None: it can."""
    if (refused := browser_refusal(socket, state.settings, credential=not state.api_keys.is_open)) is not None:
        return refused.code, refused.message, CLOSE_POLICY
    if provider_tenant(socket, query=True) is None:
        return "unauthorized", "a valid API key is required (xi-api-key, X-API-Key, Authorization or ?api_key=)", \
            CLOSE_POLICY  # fmt: skip
    if state.models.any_serving() is None:
        return "engine_not_ready", "the engine is warming up", CLOSE_TRY_LATER
    if state.drain.draining:
        return "draining", DRAIN_REASON, CLOSE_RECONNECT
    return None


MakeWire = Callable[[Callable[[], Connection]], Wire]  # given the Connection (once made), the socket's Wire


async def run_bridge(socket: WebSocket, state: State, store: SessionStore, settings: Settings, wire: MakeWire,
                     first: list[msgspec.Struct]) -> None:  # fmt: skip
    """Serve one accepted provider socket: a native Connection, its messages through `wire`."""
    models: ModelRegistry = state.models
    served = models.any_serving()
    tenant = provider_tenant(socket, query=True)
    assert served is not None and served.served is not None and tenant is not None
    holder: list[Connection] = []
    bridge = Bridge(wire(lambda: holder[0]), socket.receive, first)
    drain: Drain = state.drain
    binding = SessionBinding(store, tenant, state.aliases)  # the operator's voice aliases, as on the native route
    conn = Connection(served.served, settings.limits, binding, bridge.receive, bridge.send,
                      model=served.name, admission=served.admission, select=models.select,
                      draining=lambda: drain.draining)  # fmt: skip
    holder.append(conn)
    bridge.conn = conn
    drain.opened(conn)
    try:
        await conn.run()
    finally:
        drain.closed(conn)
        with contextlib.suppress(Exception):
            await socket.close(code=conn.close_code, reason=conn.close_reason)


async def _refuse(socket: WebSocket, text: str, close_code: int, reason: str) -> None:
    await socket.send_text(text)
    await socket.close(code=close_code, reason=reason[:120])


async def _elevenlabs(socket: WebSocket, state: State, store: SessionStore, settings: Settings, voice_id: str,
                      multi: bool) -> None:  # fmt: skip
    await socket.accept()
    if (refused := refusal(socket, state)) is not None:
        code, message, close = refused
        await _refuse(socket, elevenlabs.error_message(code, message, close_code=close), close, code)
        return
    try:
        fmt = elevenlabs.output_format(socket.query_params.get("output_format"))
        if len(voice_id) > 256:
            raise ProtocolError("invalid_config", "voice_id is limited to 256 characters")
    except ProtocolError as e:
        await _refuse(socket, elevenlabs.error_message(e.code, e.message), CLOSE_POLICY, e.code)
        return
    language = socket.query_params.get("language_code")
    first = [elevenlabs.session_config(voice_id, fmt, language[:64] if language else None)]

    def wire(conn: Callable[[], Connection]) -> Wire:
        return elevenlabs.ElevenLabsWire(socket.send_text, fmt, multi=multi, stop=lambda: conn().stop(),
                                         max_contexts=settings.limits.max_contexts)  # fmt: skip

    await run_bridge(socket, state, store, settings, wire, first)


@websocket("/v1/text-to-speech/{voice_id:str}/stream-input")
async def elevenlabs_stream_input(socket: WebSocket, state: State, store: NamedDependency[SessionStore],
                                  settings: NamedDependency[Settings], voice_id: FromPath[str]) -> None:  # fmt: skip
    await _elevenlabs(socket, state, store, settings, voice_id, multi=False)


@websocket("/v1/text-to-speech/{voice_id:str}/multi-stream-input")
async def elevenlabs_multi_stream_input(
    socket: WebSocket,
    state: State,
    store: NamedDependency[SessionStore],
    settings: NamedDependency[Settings],
    voice_id: FromPath[str],
) -> None:
    await _elevenlabs(socket, state, store, settings, voice_id, multi=True)


@websocket("/tts/websocket")
async def cartesia_websocket(socket: WebSocket, state: State, store: NamedDependency[SessionStore],
                             settings: NamedDependency[Settings]) -> None:  # fmt: skip
    """Cartesia's socket. Its version (the Cartesia-Version header or ?cartesia_version=) is accepted, whatever
    its date: the message shapes served are those every version since 2024-06 shares."""
    await socket.accept()
    if (refused := refusal(socket, state)) is not None:
        code, message, close = refused
        await _refuse(socket, cartesia.error_message(code, message), close, code)
        return

    def wire(conn: Callable[[], Connection]) -> Wire:
        return cartesia.CartesiaWire(socket.send_text, max_contexts=settings.limits.max_contexts)

    await run_bridge(socket, state, store, settings, wire, [])


protocol_routes = [elevenlabs_stream_input, elevenlabs_multi_stream_input, cartesia_websocket, *http_routes]
