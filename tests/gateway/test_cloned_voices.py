"""Cloned voices through the gateway: a tiny Qwen3 Base checkpoint behind a real server, a clone
registered over HTTP (a WAV file, base64) and spoken over the WebSocket and the OpenAI endpoint."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from support.servers import serve
from support.wsclient import call, open_session, until, utterance

from engine import load_engine
from engine.qwen3 import make_tiny_checkpoint
from engine.qwen3.edge import load_stream_decoder
from engine.qwen3.serving.qwen3_engine import Qwen3Engine
from gateway.protocol import CODEC_HEADER, CodecFlag

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "streaming_agent.py"


def wav_b64(seconds: float, rate: int = 16000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base"), seed=0, model_type="base")


@pytest.fixture(scope="module")
def base_gateway(base_dir: Path) -> Iterator[str]:
    engine = load_engine(str(base_dir), max_streams=4, frames_per_token=2.0, min_frames=6)
    assert isinstance(engine, Qwen3Engine)
    try:
        yield from serve(engine)
    finally:
        engine.close()


async def test_a_registered_clone_speaks_over_the_websocket(base_gateway: str) -> None:
    _, listing = call(base_gateway, "GET", "/v1/audio/voices", None)
    assert listing["cloning"] is True
    status, body = call(base_gateway, "POST", "/v1/audio/voices", None,
                        {"voice_id": "alice", "ref_audio": wav_b64(1.5), "ref_text": "Good morning."})  # fmt: skip
    assert status == 201 and body["kind"] == "clone", body
    ws, ready = await open_session(base_gateway, voice="alice")
    try:
        assert ready["type"] == "session.ready", ready
        for text in ("Hello there, this is my cloned voice. ", "And a second turn. "):
            events, audio = await utterance(ws, text)
            assert events[-1]["type"] == "session.done", events[-1]
            assert sum(map(len, audio)) > 2 * 1920  # at least a couple of frames of 16-bit PCM
    finally:
        await ws.close()


async def test_a_clone_without_a_transcript_is_an_x_vector_voice(base_gateway: str) -> None:
    body = {"voice_id": "xavier", "ref_audio": wav_b64(1.2)}
    status, body = call(base_gateway, "POST", "/v1/audio/voices", None, body)
    assert status == 201 and body["kind"] == "clone", body
    ws, ready = await open_session(base_gateway, voice="xavier")
    try:
        assert ready["type"] == "session.ready", ready
        events, audio = await utterance(ws, "Hello. ")  # shorter than any reference: ICL would wait for the end
        assert events[-1]["type"] == "session.done" and sum(map(len, audio)) > 2 * 1920, events[-1]
    finally:
        await ws.close()


async def test_without_a_clone_a_base_checkpoint_says_why(base_gateway: str) -> None:
    ws, ready = await open_session(base_gateway, voice="default")
    try:
        if ready["type"] == "session.ready":  # refused at the first utterance instead of at config
            await ws.send(json.dumps({"type": "input.text", "text": "Hello. "}))
            await ws.send(json.dumps({"type": "input.done"}))
            ready = (await until(ws, "error"))[-1]
        assert ready["type"] == "error" and ready["code"] == "unknown_voice", ready
        assert "cloned voices only" in ready["message"]
    finally:
        await ws.close()


def test_a_clone_is_spoken_by_the_openai_endpoint(base_gateway: str) -> None:
    assert call(base_gateway, "POST", "/v1/audio/voices", None,
                {"voice_id": "bob", "ref_audio": wav_b64(2.0, 24000), "ref_text": "Hi."})[0] == 201  # fmt: skip
    import urllib.request

    req = urllib.request.Request(f"http://{base_gateway}/v1/audio/speech", json.dumps(
        {"model": "tts-1", "voice": "bob", "input": "One short answer.", "response_format": "pcm"}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200 and len(r.read()) > 2 * 1920


@pytest.mark.parametrize(("ref_audio", "needle"), [
    (base64.b64encode(b"RIFF and then nothing").decode(), "could not be decoded"),
    (wav_b64(0.3), "must last"),
])  # fmt: skip
def test_an_unreadable_or_too_short_clip_is_refused_at_registration(base_gateway: str, ref_audio: str,
                                                                    needle: str) -> None:
    status, err = call(base_gateway, "POST", "/v1/audio/voices", None,
                       {"voice_id": "carol", "ref_audio": ref_audio, "ref_text": "Hello."})  # fmt: skip
    assert status == 400 and err["error"]["code"] == "invalid_reference_audio", err
    assert needle in err["error"]["message"]


def test_the_example_agent_clones_a_voice_and_speaks_in_it(base_gateway: str, tmp_path: Path) -> None:
    ref = tmp_path / "me.wav"
    ref.write_bytes(base64.b64decode(wav_b64(1.5)))
    cmd = [sys.executable, str(AGENT), "--url", f"ws://{base_gateway}/v1/audio/speech/stream", "--out",
           str(tmp_path), "--turns", "1", "--rate", "40", "--clone", str(ref), "--clone-text", "Good morning."]
    for _ in range(2):  # the second run finds the voice registered and uses it
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
        assert "cloned voice 'me' registered" in out and "ttfa" in out, out
    with wave.open(str(tmp_path / "turn-0.wav")) as w:
        assert w.getnframes() > 2 * 1920
    _, listing = call(base_gateway, "GET", "/v1/audio/voices", None)
    assert any(v["name"] == "me" and v["kind"] == "clone" for v in listing["voices"])


async def test_codec_tokens_of_an_icl_clone_prime_the_listeners_decoder(base_gateway: str, base_dir: Path) -> None:
    """The first codec message carries the reference frames (PRIME): a device decoder that decodes them
    first, playing nothing, then the stream's frames, hears what PCM mode sends, to 2 LSB."""
    assert call(base_gateway, "POST", "/v1/audio/voices", None,
                {"voice_id": "dora", "ref_audio": wav_b64(1.2), "ref_text": "Good morning."})[0] == 201  # fmt: skip
    text = "Hi, this is a short test. "
    ws, ready = await open_session(base_gateway, voice="dora", seed=5)
    assert ready["type"] == "session.ready", ready
    _, pcm = await utterance(ws, text)
    await ws.close()
    ws, ready = await open_session(base_gateway, voice="dora", seed=5, output_mode="codec_tokens")
    events, messages = await utterance(ws, text)
    await ws.close()
    seq, n, flags = CODEC_HEADER.unpack_from(messages[0])
    assert (seq, flags) == (0, CodecFlag.RESET | CodecFlag.PRIME) and n == 15  # 1.2 s of reference at 12.5 frames/s
    done = next(e for e in events if e["type"] == "codec.done")
    decoder = load_stream_decoder(base_dir)
    decoder.step(np.frombuffer(messages[0], "<i2", offset=CODEC_HEADER.size).reshape(n, 16))  # prime
    codes = np.concatenate([np.frombuffer(m, "<i2", offset=CODEC_HEADER.size).reshape(-1, 16) for m in messages[1:]])
    assert done["total_frames"] == len(codes)
    wav = np.concatenate([decoder.step(codes[i:i + 4]) for i in range(0, len(codes), 4)])
    local = (np.clip(wav, -1, 1) * 32767).astype(np.int16)
    served = np.frombuffer(b"".join(pcm), "<i2")
    assert local.shape == served.shape and np.abs(local.astype(np.int32) - served).max() <= 2
