"""Session 28's part for bench/capacity_parts.py: the WebSocket protocol's per-message read, uvicorn's
websockets-sansio protocol (old) against the gateway's `ReadAhead` (new, gateway/server.py), each driven
over a real socket pair after a real handshake (a websockets client protocol writing the frames).

- `wsread`: one word piece from the client (a masked text frame of ~40 bytes) through `data_received`, the
  receive queue and the app's `receive`, with the real transport's pause and resume of reading (an epoll
  change each) where the protocol makes them.

(`wsframe`, an audio frame through the protocol's send with websockets' frame writer against a frame head
written directly, was measured in session 28 at 1.77 against 0.96 µs and not kept: capacity_s28.md.)
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

Timed = Callable[[int], None]


def _open(loop: asyncio.AbstractEventLoop, cls: type) -> tuple[Any, Any, socket.socket]:
    """A `cls` protocol accepted on one end of a socket pair, its handshake done by a websockets client on the
    other; the app accepts, then only answers `receive` when asked (the parts drive it)."""
    from uvicorn.server import ServerState
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    from gateway.server import server_config
    from gateway.settings import Settings

    async def app(scope: dict, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await asyncio.Event().wait()  # the parts call the protocol's send and receive themselves

    config = server_config(app, Settings(), ws=cls)
    config.load()
    ours, theirs = socket.socketpair()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)  # not the default loop

    async def handshake() -> ClientProtocol:
        await loop.connect_accepted_socket(lambda: proto, ours)
        client = ClientProtocol(parse_uri("ws://parts/v1/audio/speech/stream"))
        client.send_request(client.connect())
        theirs.setblocking(False)
        await loop.sock_sendall(theirs, b"".join(client.data_to_send()))
        while client.state.name == "CONNECTING":
            client.receive_data(await loop.sock_recv(theirs, 65536))
        return client

    client = loop.run_until_complete(asyncio.wait_for(handshake(), 10.0))
    return proto, client, theirs


def wsread_parts() -> tuple[Timed, Timed]:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    from gateway.server import ReadAhead

    loop = asyncio.new_event_loop()
    held: list[socket.socket] = []
    piece = json.dumps({"type": "input.text", "text": "Sure, "}).encode()

    def timed(cls: type) -> Timed:
        proto, client, peer = _open(loop, cls)
        held.append(peer)  # the client's end stays open while the part runs
        client.send_text(piece)
        frame = b"".join(client.data_to_send())  # one masked frame: the same bytes fed each time

        async def many(n: int) -> None:
            for _ in range(n):
                proto.data_received(frame)
                await proto.receive()

        return lambda n, held=held: loop.run_until_complete(many(n))  # held: alive as long as the part

    return timed(WebSocketsSansIOProtocol), timed(ReadAhead)
