"""`voxgate serve --model synthetic` as an operator runs it for a load test: a real server process, its
engine in a child process, options from the TOML's `[engine_options]`. It serves a WebSocket utterance,
an OpenAI HTTP speech request and codec tokens, and past its configured capacity the gateway's admission
refuses with its usual code — no GPU, no model."""

from __future__ import annotations

import asyncio
import json
import struct
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.replicas import Replica
from support.wsclient import open_session, utterance


@pytest.fixture(scope="module")
def synthetic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logdir = tmp_path_factory.mktemp("synthetic")
    config = logdir / "voxgate.toml"
    # One stream at a time and nobody waiting: the second concurrent utterance is refused at once.
    config.write_text("max_waiting_per_model = 0\n[engine_options]\nspeed = 8.0\nfirst_audio_s = 0.05\ncapacity = 1\n")
    replica = Replica("", logdir, "--config", str(config))
    replica.cmd = [arg for arg in replica.cmd if arg not in ("--redis-url", "")]
    replica.cmd[replica.cmd.index("piper")] = "synthetic"
    replica.spawn()
    try:
        replica.wait_healthy(60)
        yield replica.addr
    finally:
        replica.kill()


def level(audio: bytes) -> float:
    pcm = np.frombuffer(audio, np.int16).astype(np.float64) / 32768
    return float(np.sqrt(np.mean(pcm**2)))


async def test_a_websocket_utterance_is_spoken(synthetic_server: str) -> None:
    ws, ready = await open_session(synthetic_server, voice="synthetic", model="synthetic")
    try:
        assert ready["type"] == "session.ready", ready
        events, binary = await utterance(ws, "Hello there. This is a load test, spoken by nobody.")
        assert events[-1]["type"] == "session.done", events[-1]
        audio = b"".join(binary)
        assert len(audio) / 2 / 24000 > 1.0 and level(audio) > 0.02
    finally:
        await ws.close()


def test_an_openai_speech_request_is_spoken(synthetic_server: str) -> None:
    body = {"model": "synthetic", "input": "Hello from the synthetic engine.", "voice": "synthetic",
            "response_format": "pcm"}  # fmt: skip
    req = urllib.request.Request(f"http://{synthetic_server}/v1/audio/speech", json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        audio = r.read()
    assert len(audio) / 2 / 24000 > 1.0 and level(audio) > 0.02


async def test_past_its_capacity_the_gateway_refuses(synthetic_server: str) -> None:
    holder, _ = await open_session(synthetic_server, voice="synthetic")
    other, _ = await open_session(synthetic_server, voice="synthetic")
    try:
        await holder.send(json.dumps({"type": "input.text", "text": "I hold the only slot. "}))
        await _audio(holder)  # its stream is admitted and speaking; no input.done: it keeps the slot
        events, _ = await utterance(other, "Is there room for me? ")
        error: dict[str, Any] = events[-1]
        assert error["type"] == "error" and error["code"] == "queue_full", error
    finally:
        await holder.close()
        await other.close()


async def _audio(ws: Any) -> None:
    while not isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
        pass


async def test_codec_tokens_are_served_for_on_device_decoding_clients(synthetic_server: str) -> None:
    """codec_tokens output: `codec.start` with the engine's codec shape, binary frames numbered in order,
    the last with EOS, `codec.done` counting them — the gateway's codec path, loaded with no model."""
    ws, ready = await open_session(synthetic_server, voice="synthetic", output_mode="codec_tokens")
    try:
        assert ready["type"] == "session.ready", ready
        events, binary = await utterance(ws, "Codec tokens for a device. Two sentences of them.")
        kinds = [e["type"] for e in events]
        assert "codec.start" in kinds and "codec.done" in kinds and kinds[-1] == "session.done", kinds
        start = next(e for e in events if e["type"] == "codec.start")
        assert (start["codebooks"], start["frame_rate_hz"], start["decoder_id"]) == (16, 12.5, "synthetic")
        headers = [struct.unpack_from("<IHB", m) for m in binary]
        assert [h[0] for h in headers] == list(range(len(headers)))
        assert headers[-1][2] & 1  # EOS
        frames = sum(h[1] for h in headers)
        assert all(len(m) == 7 + h[1] * 32 for m, h in zip(binary, headers, strict=True))
        done = next(e for e in events if e["type"] == "codec.done")
        assert done["total_frames"] == frames and frames / 12.5 > 1.0
    finally:
        await ws.close()
