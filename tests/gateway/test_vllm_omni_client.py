"""vLLM-Omni's streaming client works unchanged (docs/protocol.md: "its clients work unchanged").

`omni_client` does what vLLM-Omni's example client
(examples/online_serving/text_to_speech/qwen3_tts/streaming_speech_client.py) does, from its published
protocol: the config is its argument defaults (`speaker` Vivian, `task_type` CustomVoice, `language`
Auto, `response_format` wav, `speed` 1.0; `stream_audio` only when asked), the text goes in one
`input.text`, then `input.done`; the binary frames between `audio.start` and `audio.done` are one
sentence's audio, saved as one file, and `session.done` ends it. The tiny Qwen3 CustomVoice model has
vLLM-Omni's speaker names.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import soundfile as sf
import websockets
from support.servers import serve

from engine import load_engine
from gateway.settings import Limits

TEXT = "Hello world. How are you? I am fine."
DEFAULTS = {"speaker": "Vivian", "task_type": "CustomVoice", "language": "Auto", "response_format": "wav", "speed": 1.0}


@pytest.fixture(scope="module")
def tiny_gateway() -> Iterator[str]:
    engine = load_engine("tiny")
    try:
        yield from serve(engine, Limits(config_timeout=5.0))
    finally:
        engine.close()


async def omni_client(addr: str, config: dict[str, Any]) -> tuple[list[dict[str, Any]], list[bytes], dict[str, Any]]:
    """(the events, one audio file per sentence, session.done) as vLLM-Omni's client sees them."""
    async with websockets.connect(f"ws://{addr}/v1/audio/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        events: list[dict[str, Any]] = []
        files: list[bytes] = []
        chunks: list[bytes] = []
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                chunks.append(message)
                continue
            msg = json.loads(message)
            events.append(msg)
            if msg["type"] == "audio.start":
                chunks = []
            elif msg["type"] == "audio.done":
                files.append(b"".join(chunks))
                assert msg["total_bytes"] == len(files[-1]) and msg["error"] is False, msg
            elif msg["type"] == "session.done":
                return events, files, msg


async def test_default_arguments_get_one_wav_file_per_utterance(tiny_gateway: str) -> None:
    events, files, done = await omni_client(tiny_gateway, DEFAULTS)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, events
    assert kinds[0] == "session.ready" and done["total_sentences"] >= 1
    binary_between = kinds.index("audio.done") - kinds.index("audio.start")
    assert len(files) == 1 and binary_between >= 1  # one file (the marks come between)
    audio, rate = sf.read(io.BytesIO(files[0]), dtype="int16")
    assert rate == 24000 and len(audio) > 0 and files[0][:4] == b"RIFF"


async def test_stream_audio_pcm_streams_frames(tiny_gateway: str) -> None:
    config = DEFAULTS | {"stream_audio": True, "response_format": "pcm"}
    async with websockets.connect(f"ws://{tiny_gateway}/v1/audio/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        frames, start = 0, None
        while True:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                frames += 1
                continue
            msg = json.loads(m)
            assert msg["type"] != "error", msg
            start = msg if msg["type"] == "audio.start" else start
            if msg["type"] == "audio.done":
                total = msg["total_bytes"]
            if msg["type"] == "session.done":
                break
    assert start is not None and (start["sample_rate"], start["channels"], start["format"]) == (24000, 1, "pcm")
    assert frames > 1 and total > 0 and total % 2 == 0  # streamed as it is made, s16le


@pytest.mark.parametrize(
    "config",
    [
        {"speaker": "Ryan", "language": "English"},
        {"voice": "vivian", "task_type": "CustomVoice", "language": "Chinese"},
    ],
)
async def test_speaker_task_type_and_capitalised_languages(tiny_gateway: str, config: dict[str, Any]) -> None:
    events, files, _ = await omni_client(tiny_gateway, DEFAULTS | config)
    ready = events[0]
    assert ready["type"] == "session.ready", ready
    assert ready["voice"] == config.get("voice", config.get("speaker"))
    assert len(files) == 1 and len(files[0]) > 44


async def test_word_timestamps_come_in_vllm_omni_audio_chunks(tiny_gateway: str) -> None:
    """Its word-timestamp mode (issue 18): audio in `audio.chunk` messages instead of binary frames, then one
    empty chunk whose `timestamps` time every word. The Qwen3 talker gives no alignment, so these are the
    gateway's estimate from the segment marks — in this shape as in vLLM-Omni's, a list of words."""
    config = DEFAULTS | {"stream_audio": True, "response_format": "pcm", "word_timestamps": True}
    async with websockets.connect(f"ws://{tiny_gateway}/v1/audio/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "session.done":
            message = await asyncio.wait_for(ws.recv(), 60)
            assert isinstance(message, str), "no binary frame: the audio travels in audio.chunk messages"
            events.append(json.loads(message))
    start = next(e for e in events if e["type"] == "audio.start")
    *live, last = [e for e in events if e["type"] == "audio.chunk"]
    assert start["word_timestamps"] is True and live and all(c["timestamps"] is None for c in live)
    assert last["audio_b64"] == "" and last["chunk_start_ms"] == 0 and last["chunk_end_ms"] >= live[-1]["chunk_end_ms"]
    done = next(e for e in events if e["type"] == "audio.done")
    assert done["total_bytes"] == sum(len(base64.b64decode(c["audio_b64"])) for c in live)
    assert [w["word"] for w in last["timestamps"]] == ["Hello", "world", "How", "are", "you", "I", "am", "fine"]
    starts = [w["start_ms"] for w in last["timestamps"]]
    assert starts == sorted(starts) and all(w["start_ms"] <= w["end_ms"] for w in last["timestamps"])
