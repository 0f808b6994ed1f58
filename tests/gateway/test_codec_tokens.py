"""codec_tokens output over the WebSocket: the wire format, multi-turn, cancel, refusal by CPU voices,
the edge client, and parity: PCM mode and codec mode + local decoding give the same waveform."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets
from support.servers import serve
from support.wsclient import utterance

from engine import load_engine
from engine.qwen3.edge import decoder_id, load_stream_decoder
from engine.qwen3.serving.qwen3_engine import tiny_checkpoint

HEADER = struct.Struct("<IHB")
EOS, SEGMENT_END, RESET = 1, 2, 4
REPO = Path(__file__).resolve().parents[2]
TEXT = "Hello there, this is a codec stream. It has two sentences."


@pytest.fixture(scope="module")
def tiny_gateway() -> Iterator[str]:
    engine = load_engine("tiny")
    yield from serve(engine)
    engine.close()


async def open_ws(addr: str, **config: Any) -> Any:
    ws = await websockets.connect(f"ws://{addr}/v1/audio/speech/stream", max_size=None)
    await ws.send(json.dumps({"type": "session.config", "language": "en", "seed": 5} | config))
    ready = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert ready["type"] == "session.ready", ready
    return ws


def unpack(frames: list[bytes]) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    headers, codes = [], []
    for m in frames:
        seq, n, flags = HEADER.unpack_from(m)
        headers.append((seq, n, flags))
        body = np.frombuffer(m, "<i2", offset=HEADER.size)
        assert body.size == n * 16
        codes.append(body.reshape(n, 16))
    return headers, np.concatenate(codes)


async def test_wire_format_and_multi_turn(tiny_gateway: str) -> None:
    ws = await open_ws(tiny_gateway, output_mode="codec_tokens")
    for turn in range(2):
        events, frames = await utterance(ws, TEXT)
        start = next(e for e in events if e["type"] == "codec.start")
        assert start["utterance_index"] == turn and start["codebooks"] == 16 and start["codebook_size"] == 2048
        assert start["frame_rate_hz"] == 12.5 and start["sample_rate"] == 24000 and start["header_format"] == "<IHB"
        assert start["decoder_id"] == decoder_id(tiny_checkpoint())
        headers, codes = unpack(frames)
        assert [h[0] for h in headers] == list(range(len(headers)))  # seq from 0, no gaps, per utterance
        assert headers[0][2] & RESET and headers[-1] == (len(headers) - 1, 0, SEGMENT_END | EOS)
        segments = [e for e in events if e["type"] == "segment.committed"]
        assert sum(1 for h in headers if h[2] & SEGMENT_END) == len(segments) == 3  # one per segment
        done = next(e for e in events if e["type"] == "codec.done")
        timing = done.pop("timing")  # codec mode: audio counted in frames, no PCM to trim or judge
        assert timing["audio_ms"] == round(len(codes) / 12.5 * 1000) and timing["trimmed_ms"] == 0
        assert timing["audible_ttfa_ms"] is None and 0 <= timing["ttfa_ms"] <= timing["synthesis_ms"]
        assert done == {"type": "codec.done", "utterance_index": turn, "total_frames": len(codes),
                        "seq_last": len(headers) - 1, "error": False, "cancelled": False}  # fmt: skip
        assert codes.min() >= 0 and codes.max() < 2048
    await ws.close()


async def test_codec_mode_and_local_decoding_equal_pcm_mode(tiny_gateway: str) -> None:
    ws = await open_ws(tiny_gateway)
    _, pcm_frames = await utterance(ws, TEXT)
    await ws.close()
    served = np.frombuffer(b"".join(pcm_frames), "<i2")
    ws = await open_ws(tiny_gateway, output_mode="codec_tokens")
    _, frames = await utterance(ws, TEXT)
    await ws.close()
    _, codes = unpack(frames)
    decoder = load_stream_decoder(tiny_checkpoint())
    wav = np.concatenate([decoder.step(codes[i : i + 5]) for i in range(0, len(codes), 5)])
    local = (np.clip(wav, -1, 1) * 32767).astype(np.int16)
    assert local.shape == served.shape
    assert np.abs(local.astype(np.int32) - served.astype(np.int32)).max() <= 2


async def test_cancel_ends_with_codec_done_and_no_frame_after(tiny_gateway: str) -> None:
    ws = await open_ws(tiny_gateway, output_mode="codec_tokens")
    await ws.send(json.dumps({"type": "input.text", "text": "A long answer, " * 20}))
    await ws.send(json.dumps({"type": "input.done"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
        pass
    await ws.send(json.dumps({"type": "input.cancel"}))
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, str) and json.loads(m)["type"] == "codec.done":
            assert json.loads(m)["cancelled"] is True
            break
    events, frames = await utterance(ws, "Next one.")
    assert HEADER.unpack_from(frames[0])[0] == 0  # the next utterance's own first message
    assert events[0]["utterance_index"] == 1
    await ws.close()


async def test_a_cancel_with_played_ms_says_what_was_heard_in_codec_mode(tiny_gateway: str) -> None:
    """heard_text from the frames played (12.5 a second), cut at a word as in PCM mode; the talker times
    no words, so their places are estimated from the segment's mark (heard_estimated)."""
    ws = await open_ws(tiny_gateway, output_mode="codec_tokens")
    text = "A long answer, " * 20
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    played = 0.0
    while played < 1200:  # ms of frames received
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, bytes):
            played += HEADER.unpack_from(m)[1] * 1000 / 12.5
    await ws.send(json.dumps({"type": "input.cancel", "played_ms": 1000}))
    while not (isinstance(m := await asyncio.wait_for(ws.recv(), 30), str) and json.loads(m)["type"] == "codec.done"):
        pass
    done = json.loads(m)
    assert done["cancelled"] is True and done["heard_estimated"] is True, done
    heard = done["heard_text"]
    assert heard and text.startswith(heard) and len(heard) < len(text.rstrip()) and text[len(heard)] == " ", done
    await ws.close()


async def test_cpu_voices_refuse_codec_tokens(gateway: str) -> None:
    async with websockets.connect(f"ws://{gateway}/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "joe", "output_mode": "codec_tokens"}))
        err = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert err["type"] == "error" and err["code"] == "codec_tokens_unsupported"


def test_edge_decoder_client(tiny_gateway: str, tmp_path: Path) -> None:
    out = tmp_path / "edge.wav"
    cmd = [sys.executable, str(REPO / "examples" / "agents" / "edge_decoder_client.py"),
           "--url", f"ws://{tiny_gateway}/v1/audio/speech/stream", "--checkpoint", str(tiny_checkpoint()),
           "--text", TEXT, "--out", str(out)]  # fmt: skip
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout)
    assert report["audio_s"] > 1 and report["time_to_first_frame_s"] <= report["playback_start_s"]
    assert report["wire_bytes_per_audio_s"] < 1000  # ~12.5 frames × 32 bytes + headers
    with wave.open(str(out)) as w:
        assert w.getnframes() == round(report["audio_s"] * 24000)
