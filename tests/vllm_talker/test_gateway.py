"""The gateway in front of the engine on the vLLM talker: a real server on loopback, real HTTP and
WebSocket clients. The protocol is ours whichever talker runs: the same events, and the native talker's
audio to 2 LSB (the codec's chunking follows the cycle timing, and a different chunking rounds differently)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from support.servers import serve

from engine.qwen3.serving.qwen3_engine import Qwen3Engine

pytestmark = pytest.mark.vllm

TEXT = "Hello there, how are you doing today?"


@pytest.fixture(scope="module")
def gateways(native: Qwen3Engine, on_vllm: Qwen3Engine) -> Iterator[dict[str, str]]:
    servers = {name: serve(engine, model="qwen") for name, engine in (("native", native), ("vllm", on_vllm))}
    addrs = {name: next(gen) for name, gen in servers.items()}
    yield addrs
    for gen in servers.values():
        next(gen, None)


async def speech(addr: str) -> bytes:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(f"http://{addr}/v1/audio/speech", json={
            "model": "qwen", "input": TEXT, "voice": "ryan", "response_format": "pcm"})
        assert r.status_code == 200, r.text
        return r.content


def assert_same_audio(got: bytes, want: bytes) -> None:
    a, b = np.frombuffer(got, np.int16).astype(np.int32), np.frombuffer(want, np.int16).astype(np.int32)
    assert b.size > 5000 and a.shape == b.shape and np.abs(a - b).max() <= 2


async def test_http_speech_is_the_native_talkers_audio(gateways: dict[str, str]) -> None:
    assert_same_audio(await speech(gateways["vllm"]), await speech(gateways["native"]))


async def streamed(addr: str) -> tuple[bytes, list[str]]:
    """One utterance over the WebSocket protocol, its text in pieces; → (PCM, the server events' types)."""
    audio, kinds = b"", []
    async with websockets.connect(f"ws://{addr}/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "ryan", "language": "en"}))
        for piece in ("Streaming speech ", "for voice agents ", "should start quickly."):
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for msg in ws:
            if isinstance(msg, bytes):
                audio += msg
                continue
            event: dict[str, Any] = json.loads(msg)
            kinds.append(event["type"])
            assert event["type"] != "error", event
            if event["type"] == "audio.done":
                break
    return audio, kinds


async def test_a_streamed_websocket_utterance_is_the_native_talkers_audio(gateways: dict[str, str]) -> None:
    (want, want_kinds), (got, got_kinds) = await streamed(gateways["native"]), await streamed(gateways["vllm"])
    assert_same_audio(got, want)
    assert got_kinds == want_kinds
