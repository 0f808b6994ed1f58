"""A client that stops reading is disconnected once its bounded buffer is full; others go on."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import pytest
import websockets
from support.servers import serve
from support.wsclient import utterance

from engine import Engine
from gateway import metrics
from gateway.connection import Limits


@pytest.fixture(scope="module")
def tight_gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(outbox_frames=4, send_timeout=1.0))


@pytest.mark.slow
async def test_a_client_that_stops_reading_is_dropped_without_stalling_others(tight_gateway: str) -> None:
    url = f"ws://{tight_gateway}/v1/audio/speech/stream"
    # 48 kHz at quarter speed: many bytes per second of synthesis, so buffers fill quickly.
    config = {"type": "session.config", "voice": "joe", "language": "en", "sample_rate": 48000, "speed": 0.25}
    long = " ".join(f"This is sentence number {i} of a long answer nobody reads." for i in range(60))
    # A small receive window and max_queue=1: the client stops reading, TCP fills, the server's sends block.
    host, port = tight_gateway.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    slow = await websockets.connect(url, sock=sock, max_queue=1, max_size=None)
    await slow.send(json.dumps(config))
    await slow.send(json.dumps({"type": "input.text", "text": long}))
    await slow.send(json.dumps({"type": "input.done"}))

    async with websockets.connect(url, max_size=None) as fast:
        await fast.send(json.dumps(config))
        events, audio = await utterance(fast, "I am still being served.", timeout=30)
        assert events[-1]["type"] == "session.done" and sum(map(len, audio)) > 48000, events[-1]
    # (the fast session has closed; only the slow one is left)

    # Wait (without reading) until the server has dropped the slow session: the kernel's buffers
    # fill first, then the outbox, which must stay full for send_timeout.
    deadline = time.monotonic() + 120
    while metrics.SESSIONS._value.get() > 0:
        assert time.monotonic() < deadline, "the slow client was never disconnected"
        await asyncio.sleep(0.2)
    # Reading now yields what was buffered, then the close; its utterance never completes.
    events = []
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            m = await asyncio.wait_for(slow.recv(), 30)
            if isinstance(m, str):
                events.append(json.loads(m)["type"])
    assert "session.done" not in events
