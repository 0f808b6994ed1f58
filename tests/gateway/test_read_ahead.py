"""The WebSocket protocol's read-ahead (gateway/server.py `ReadAhead`): a client's small messages are read
while the app keeps up, without stopping the socket's reads per message; past a few messages or a few
kilobytes waiting for the app, reading stops until the app has taken them all, as uvicorn's own does.

Driven over a real socket pair: uvicorn's protocol on one end (the server's, as `server_config` builds
it), a real websockets client protocol writing the frames on the other.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from gateway.server import ReadAhead, server_config
from gateway.settings import Settings

WAIT_S = 10.0  # a bound on each wait for the server end to have read what was sent, not a speed claim


@dataclass
class App:
    """An ASGI app that accepts, then reads only once `go` is set: what it took, in order."""

    go: asyncio.Event = field(default_factory=asyncio.Event)
    taken: list[str] = field(default_factory=list)

    async def __call__(self, scope: dict, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await self.go.wait()
        while (message := await receive())["type"] == "websocket.receive":
            self.taken.append(message["text"])


@dataclass
class Pair:
    proto: ReadAhead
    client: ClientProtocol
    sock: socket.socket
    app: App

    def send(self, *texts: str) -> None:
        for text in texts:
            self.client.send_text(text.encode())
        self.sock.sendall(b"".join(self.client.data_to_send()))

    async def until(self, ready: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not ready():
                await asyncio.sleep(0.005)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    app = App()
    config = server_config(app, Settings())
    config.load()
    assert config.ws_protocol_class is ReadAhead  # what the gateway serves with
    ours, theirs = socket.socketpair()
    proto = ReadAhead(config=config, server_state=ServerState(), app_state={})
    loop = asyncio.get_running_loop()
    await loop.connect_accepted_socket(lambda: proto, ours)
    client = ClientProtocol(parse_uri("ws://test/v1/audio/speech/stream"))
    client.send_request(client.connect())
    theirs.setblocking(False)
    await loop.sock_sendall(theirs, b"".join(client.data_to_send()))
    async with asyncio.timeout(WAIT_S):  # the handshake's answer
        while not client.handshake_exc and client.state.name == "CONNECTING":
            client.receive_data(await loop.sock_recv(theirs, 65536))
    theirs.setblocking(True)
    assert client.state.name == "OPEN"
    try:
        yield Pair(proto, client, theirs, app)
    finally:  # the client closes; the app, let go, reads to the close and ends
        app.go.set()
        client.send_close()
        theirs.sendall(b"".join(client.data_to_send()))
        await asyncio.wait(proto.tasks, timeout=WAIT_S)
        theirs.close()


async def test_small_messages_are_read_ahead_of_the_app_without_pausing(pair: Pair) -> None:
    pair.send(*(f"piece {i} " for i in range(ReadAhead.read_ahead_messages - 1)))
    await pair.until(lambda: pair.proto.queue.qsize() == ReadAhead.read_ahead_messages - 1)
    assert not pair.proto.read_paused  # uvicorn's own would have paused at the first


async def test_reading_stops_at_the_message_bound_and_resumes_once_the_app_took_them(pair: Pair) -> None:
    sent = [f"piece {i} " for i in range(ReadAhead.read_ahead_messages + 4)]
    for i, text in enumerate(sent[: ReadAhead.read_ahead_messages]):  # one read each, as a client streams them
        pair.send(text)
        await pair.until(lambda i=i: pair.proto.queue.qsize() == i + 1)
    assert pair.proto.read_paused
    pair.send(*sent[ReadAhead.read_ahead_messages :])
    await asyncio.sleep(0.05)  # room for a read that should not happen (were it to, the count below shows it)
    assert pair.proto.queue.qsize() == ReadAhead.read_ahead_messages  # the rest wait in the kernel
    pair.app.go.set()
    await pair.until(lambda: len(pair.app.taken) == len(sent))
    assert pair.app.taken == sent  # in order, none lost across the pause
    assert not pair.proto.read_paused


async def test_reading_stops_at_once_for_a_message_past_the_byte_bound(pair: Pair) -> None:
    big = "x" * (ReadAhead.read_ahead_bytes + 1)
    pair.send(big)
    await pair.until(lambda: pair.proto.queue.qsize() == 1)
    assert pair.proto.read_paused
    pair.app.go.set()
    await pair.until(lambda: pair.app.taken == [big])
    assert not pair.proto.read_paused
