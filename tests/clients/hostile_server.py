"""A WebSocket server that misbehaves, for the client's bounds (tests/clients/test_client_bounds.py):
`python hostile_server.py PORT`; the request path picks how. It answers `session.config` with a real
`session.ready`, then:

- /huge: three binary messages of 64 MiB;
- /stray-audio: 300 binary messages of 1 MiB that no `audio.start` introduced;
- /stray-events: 300 `error` events of 1 MiB naming no utterance;
- /unread-audio: after the client's first `input.text`, `audio.start` for utterance 0, then 300 binary
  messages of 1 MiB (the client's consumer does not read them).

It runs in a process of its own, so what it holds is not counted as the client's memory."""

from __future__ import annotations

import asyncio
import json
import sys

from websockets.asyncio.server import ServerConnection, serve

MIB = 2**20
READY = {"type": "session.ready", "session_id": "hostile", "sample_rate": 24000, "format": "pcm",
         "next_utterance_index": 0}  # fmt: skip


async def handler(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request is not None else ""
    json.loads(await ws.recv())  # session.config
    await ws.send(json.dumps(READY))
    if path.endswith("/huge"):
        blob = bytes(64 * MIB)
        for _ in range(3):
            await ws.send(blob)
    elif path.endswith("/stray-audio"):
        blob = bytes(MIB)
        for _ in range(300):
            await ws.send(blob)
    elif path.endswith("/stray-events"):
        event = json.dumps({"type": "error", "code": "junk", "message": "x" * MIB})
        for _ in range(300):
            await ws.send(event)
    elif path.endswith("/unread-audio"):
        await ws.recv()  # input.text
        await ws.send(json.dumps({"type": "audio.start", "utterance_index": 0, "sample_rate": 24000,
                                  "format": "pcm"}))  # fmt: skip
        blob = bytes(MIB)
        for _ in range(300):
            await ws.send(blob)
    await ws.wait_closed()


async def main(port: int) -> None:
    async with serve(handler, "127.0.0.1", port, max_size=None):
        print("listening", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
