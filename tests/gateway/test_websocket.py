"""The WebSocket protocol against a real server on loopback, with a real voice and a real client."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.request
import wave
from typing import Any

import pytest
import websockets

URL = "ws://{}/v1/audio/speech/stream"


class Client:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, type_: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": type_, **fields}))

    async def recv(self, timeout: float = 30) -> dict[str, Any] | bytes:
        m = await asyncio.wait_for(self.ws.recv(), timeout)
        return m if isinstance(m, bytes) else json.loads(m)

    async def until(self, type_: str, timeout: float = 60) -> tuple[list[dict[str, Any]], bytes]:
        """Everything up to and including the first event of `type_`: (events, audio)."""
        events, audio = [], bytearray()
        while True:
            m = await self.recv(timeout)
            if isinstance(m, bytes):
                audio += m
                continue
            events.append(m)
            if m["type"] == type_:
                return events, bytes(audio)


async def connect(gateway: str, **config: Any) -> Client:
    ws = await websockets.connect(URL.format(gateway), max_size=None)
    c = Client(ws)
    await c.send("session.config", **({"voice": "joe", "language": "en"} | config))
    ready = await c.recv()
    assert isinstance(ready, dict) and ready["type"] == "session.ready", ready
    return c


async def speak(c: Client, text: str, piece: int = 3) -> tuple[list[dict[str, Any]], bytes]:
    for i in range(0, len(text), piece):
        await c.send("input.text", text=text[i : i + piece])
    await c.send("input.done")
    return await c.until("session.done")


async def test_one_connection_carries_many_utterances(gateway: str) -> None:
    c = await connect(gateway)
    texts = ["Hello there, my friend. This is the first turn.", "And here, as promised, is a second one."]
    for index, text in enumerate(texts):
        events, audio = await speak(c, text)
        committed = [e for e in events if e["type"] == "segment.committed"]
        assert "".join(e["text"] for e in committed) == text
        assert all(e["utterance_index"] == index for e in committed)
        done = next(e for e in events if e["type"] == "audio.done")
        assert done["total_bytes"] == len(audio) > 24000  # real speech: well over half a second
        marks = [e for e in events if e["type"] == "audio.mark"]
        assert [m["segment_index"] for m in marks] == list(range(len(committed)))
        offsets = [m["sample_offset"] for m in marks]
        assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] < len(audio) // 2
        types = [e["type"] for e in events]
        assert types.index("audio.start") < types.index("audio.done") < types.index("session.done")
    await c.ws.close()


async def test_text_for_the_next_utterance_is_queued_in_order(gateway: str) -> None:
    c = await connect(gateway)
    for text in ("First utterance is here.", "Second utterance follows."):
        await c.send("input.text", text=text)
        await c.send("input.done")
    first, _ = await c.until("session.done")
    second, _ = await c.until("session.done")
    assert first[-1]["utterance_index"] == 0 and second[-1]["utterance_index"] == 1
    assert all(e.get("utterance_index", 1) == 1 for e in second)
    await c.ws.close()


async def test_cancel_stops_audio_and_reports_what_was_spoken(gateway: str) -> None:
    c = await connect(gateway)
    long = " ".join(f"This is sentence number {i} of a long answer." for i in range(40))
    await c.send("input.text", text=long)
    await c.send("input.done")
    while not isinstance(await c.recv(), bytes):
        pass
    await c.send("input.cancel")
    events, _ = await c.until("audio.cancelled")
    cancelled = events[-1]
    assert cancelled["utterance_index"] == 0 and cancelled["played_bytes"] > 0
    assert long.startswith(cancelled["spoken_text"]) and cancelled["spoken_text"]
    assert not any(e["type"] == "session.done" for e in events)
    # Nothing of the cancelled utterance follows: the next thing heard belongs to the next one.
    await c.send("input.text", text="Fresh start.")
    await c.send("input.done")
    m = await c.recv()
    assert isinstance(m, dict) and m["type"] == "segment.committed" and m["utterance_index"] == 1, m
    events, audio = await c.until("session.done")
    assert all(e.get("utterance_index") == 1 for e in events if "utterance_index" in e)
    assert len(audio) > 0
    await c.ws.close()


async def test_bad_messages_get_errors_and_the_session_goes_on(gateway: str) -> None:
    c = await connect(gateway)
    await c.ws.send("{not json")
    assert (await c.recv())["code"] == "invalid_json"
    await c.send("input.bogus")
    assert (await c.recv())["code"] == "unknown_type"
    await c.ws.send(b"\x00\x01")
    assert (await c.recv())["code"] == "binary_not_supported"
    await c.send("input.text", text="x" * (200 * 1024))
    assert (await c.recv())["code"] == "message_too_large"
    await c.send("input.text", text=42)
    assert (await c.recv())["code"] == "invalid_message"
    await c.send("input.text", text="bad \ud83d")
    assert (await c.recv())["code"] == "invalid_text"
    await c.send("input.text", text="Half a")
    await c.send("session.config", voice="joe")
    assert (await c.recv())["code"] == "utterance_in_progress"
    events, audio = await speak(c, " sentence, still fine.")
    assert audio and events[-1]["type"] == "session.done"
    await c.ws.close()


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"type": "input.text", "text": "hi"}, "config_required"),
        ({"type": "session.config", "voice": "nobody"}, "unknown_voice"),
        ({"type": "session.config", "language": "klingon"}, "unsupported_language"),
        ({"type": "session.config", "sample_rate": 1000}, "invalid_config"),
        ({"type": "session.config", "response_format": "mp3", "stream_audio": True}, "unsupported_format"),
        ({"type": "session.config", "response_format": "ogg", "stream_audio": False}, "unsupported_format"),
    ],
)
async def test_a_bad_first_message_gets_an_error_and_closes(gateway: str, config: dict[str, Any], code: str) -> None:
    async with websockets.connect(URL.format(gateway)) as ws:
        await ws.send(json.dumps(config))
        err = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert err["type"] == "error" and err["code"] == code, err
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)


async def test_no_config_in_time_closes_the_session(gateway: str) -> None:
    async with websockets.connect(URL.format(gateway)) as ws:
        err = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert err["code"] == "timeout"


async def test_split_granularity_none_speaks_at_input_done(gateway: str) -> None:
    c = await connect(gateway, split_granularity="none")
    events, audio = await speak(c, "One sentence. Another sentence, with a clause.")
    committed = [e for e in events if e["type"] == "segment.committed"]
    assert [e["reason"] for e in committed] == ["flush"] and audio
    await c.ws.close()


async def test_non_streamed_wav_is_one_file_per_utterance(gateway: str) -> None:
    c = await connect(gateway, response_format="wav", stream_audio=False, sample_rate=16000)
    _, audio = await speak(c, "A whole file, please.")
    with wave.open(io.BytesIO(audio)) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getnframes() > 8000
    await c.ws.close()


async def test_input_done_without_text_closes_an_empty_utterance(gateway: str) -> None:
    c = await connect(gateway)
    await c.send("input.done")
    done = await c.recv()
    assert done.pop("timing")["audio_ms"] == 0  # nothing said: a record of no audio
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    await c.ws.close()


def test_health_and_metrics(gateway: str) -> None:
    with urllib.request.urlopen(f"http://{gateway}/health") as r:
        assert r.status == 200 and json.load(r)["status"] == "ok"
    with urllib.request.urlopen(f"http://{gateway}/metrics") as r:
        body = r.read().decode()
    for name in ("voxgate_utterances_total", "voxgate_ttfa_seconds_bucket", "voxgate_underruns_total",
                 "voxgate_outbox_frames", "voxgate_cancels_total", 'voxgate_errors_total{code="invalid_json"}',
                 'voxgate_segments_total{reason="sentence"}', "voxgate_sessions",
                 "voxgate_event_loop_lag_seconds_bucket"):  # fmt: skip
        assert name in body, name


def test_every_garbage_collection_is_timed_by_generation() -> None:
    import gc

    from prometheus_client import REGISTRY

    from gateway import metrics

    metrics.watch_gc()
    metrics.watch_gc()  # once per process, however often the app starts
    count = lambda: REGISTRY.get_sample_value("voxgate_gc_pause_seconds_count", {"generation": "2"}) or 0.0  # noqa: E731
    before = count()
    gc.collect()
    assert count() == before + 1


@pytest.mark.parametrize(("fmt", "width"), [("pcm", 2), ("ulaw", 1), ("alaw", 1)])
async def test_streamed_formats_at_a_telephony_rate(gateway: str, fmt: str, width: int) -> None:
    c = await connect(gateway, response_format=fmt, sample_rate=8000)
    events, audio = await speak(c, "Your call is important to us.")
    marks = [e["sample_offset"] for e in events if e["type"] == "audio.mark"]
    seconds = len(audio) / width / 8000
    assert 0.8 < seconds < 5, seconds
    assert marks[0] == 0 and all(m < len(audio) / width for m in marks)
    await c.ws.close()


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus"])
async def test_non_streamed_compressed_files_decode(gateway: str, fmt: str) -> None:
    import soundfile

    c = await connect(gateway, response_format=fmt, stream_audio=False)
    _, audio = await speak(c, "Compressed, please.")
    data, rate = soundfile.read(io.BytesIO(audio))
    assert len(data) / rate > 0.5
    await c.ws.close()


async def test_no_empty_binary_frames(gateway: str) -> None:
    c = await connect(gateway)  # 24 kHz, the engine's rate after its own resampling: no edge resampling
    for _ in range(2):
        await c.send("input.text", text="Short and sweet.")
        await c.send("input.done")
        while True:
            m = await c.recv()
            assert not (isinstance(m, bytes) and len(m) == 0), "an empty audio frame"
            if isinstance(m, dict) and m["type"] == "session.done":
                break
    await c.ws.close()
