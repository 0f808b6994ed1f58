"""The provider protocols' routes: each accepts the provider's socket, refuses a caller as the native route
does (gateway/sockets.py: origin, key, a model serving, no drain) in the provider's shape, and serves the
same session (`serve_connection`) through the provider's Wire."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from litestar import websocket
from litestar.connection import WebSocket
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.auth import authenticate
from gateway.connection import Connection
from gateway.protocol import CLOSE_POLICY, ProtocolError
from gateway.protocols import cartesia, elevenlabs
from gateway.protocols.bridge import Bridge, Wire
from gateway.protocols.http import http_routes
from gateway.settings import Settings
from gateway.sockets import refusal, serve_connection
from sessions import SessionStore

MakeWire = Callable[[Callable[[], Connection]], Wire]  # given the Connection (once made), the socket's Wire


async def run_bridge(socket: WebSocket, state: State, store: SessionStore, settings: Settings, wire: MakeWire,
                     first: list[msgspec.Struct], *, interleaved: bool = False) -> None:  # fmt: skip
    """Serve one accepted provider socket: a native Connection, its messages through `wire`. `interleaved`:
    the wire tags each audio message with its context (an `InterleavedWire`), and contexts interleave."""
    tenant = authenticate(socket, query=True)
    assert tenant is not None
    holder: list[Connection] = []
    bridge = Bridge(wire(lambda: holder[0]), socket.receive, first)

    def made(conn: Connection) -> None:
        holder.append(conn)
        bridge.conn = conn

    await serve_connection(state, store, settings, tenant, bridge.receive, bridge.send, made=made, socket=socket,
                           interleaved=bridge.send_audio if interleaved else None)  # fmt: skip


async def _refuse(socket: WebSocket, text: str, close_code: int, reason: str) -> None:
    await socket.send_text(text)
    await socket.close(code=close_code, reason=reason[:120])


async def _elevenlabs(socket: WebSocket, state: State, store: SessionStore, settings: Settings, voice_id: str,
                      multi: bool) -> None:  # fmt: skip
    await socket.accept()
    if (refused := refusal(socket, state)) is not None:
        message = elevenlabs.error_message(refused.code, refused.message, close_code=refused.close_code)
        await _refuse(socket, message, refused.close_code, refused.code)
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

    # Multi-stream-input interleaves its contexts, as ElevenLabs does: every audio message names its context and
    # the client plays the ones it wants (docs/elevenlabs.md); stream-input has one context.
    await run_bridge(socket, state, store, settings, wire, first, interleaved=multi)


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
        await _refuse(socket, cartesia.error_message(refused.code, refused.message), refused.close_code, refused.code)
        return

    def wire(conn: Callable[[], Connection]) -> Wire:
        return cartesia.CartesiaWire(socket.send_text, max_contexts=settings.limits.max_contexts)

    await run_bridge(socket, state, store, settings, wire, [])


protocol_routes = [elevenlabs_stream_input, elevenlabs_multi_stream_input, cartesia_websocket, *http_routes]
