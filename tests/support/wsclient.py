"""A small WebSocket/HTTP client for gateway tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from typing import Any

import websockets


async def open_session(addr: str, key: str | None = None, **config: Any) -> tuple[Any, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ws = await websockets.connect(f"ws://{addr}/v1/audio/speech/stream", max_size=None, additional_headers=headers)
    with contextlib.suppress(websockets.ConnectionClosed):  # a refused client may be closed already
        await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"} | config))
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 10))


async def refused_at_handshake(addr: str, key: str | None = None) -> tuple[int, str, dict[str, Any]]:
    """Open a session that the server refuses before the upgrade (gateway/handshake.py): its HTTP status,
    Retry-After and error body. Fails if the upgrade is accepted."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        ws = await websockets.connect(f"ws://{addr}/v1/audio/speech/stream", additional_headers=headers)
    except websockets.InvalidStatus as e:
        body = json.loads(bytes(e.response.body or b"{}"))
        return e.response.status_code, e.response.headers.get("Retry-After", ""), body
    await ws.close()
    raise AssertionError("the upgrade was accepted")


async def until(ws: Any, kind: str, timeout: float = 30) -> list[dict[str, Any]]:
    events = []
    while True:
        m = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(m, str):
            events.append(json.loads(m))
            if events[-1]["type"] == kind:
                return events


async def utterance(ws: Any, text: str, timeout: float = 60) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Speak `text` as one utterance (input.text, input.done): its events up to `session.done` (or an
    `error`), and the binary messages that came with them."""
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    events: list[dict[str, Any]] = []
    binary: list[bytes] = []
    while True:
        m = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(m, bytes):
            binary.append(m)
            continue
        events.append(json.loads(m))
        if events[-1]["type"] in ("session.done", "error"):
            return events, binary


async def say(ws: Any, text: str) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    return await until(ws, "session.done")


def call(addr: str, method: str, path: str, key: str | None, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """An HTTP call with an optional bearer key and JSON body: (status, JSON body)."""
    req = urllib.request.Request(f"http://{addr}{path}", json.dumps(body).encode() if body else b"", method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def post(addr: str, path: str, key: str | None = None) -> tuple[int, Any]:
    return call(addr, "POST", path, key)
