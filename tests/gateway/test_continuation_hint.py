"""A session's next utterance, opened while its listener still hears the one before, is a continuation: the
gateway tells the engine how long that audio lasts (`listener_buffer_s`), so the CPU voices' pool makes its
first audio due by then instead of ranking it as a newcomer's (engine/cpu/engine.py). Real gateway, real
Piper, a real WebSocket client; the engine's `open_stream` is only recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import open_session


@pytest.fixture
def opened(piper_engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """A gateway on Piper whose engine streams' options are recorded as they open."""
    log: list[dict[str, object]] = []
    real = piper_engine.open_stream

    def recording(voice: str | None, language: str, **options: object) -> Any:
        log.append(options)
        return real(voice, language, **options)

    monkeypatch.setattr(piper_engine, "open_stream", recording)
    yield from ((addr, log) for addr in serve(piper_engine))


async def test_the_next_utterance_opens_with_the_audio_its_listener_has_left(
        opened: tuple[str, list[dict[str, object]]]) -> None:
    addr, log = opened
    ws, ready = await open_session(addr)
    assert ready["type"] == "session.ready", ready
    first = "This first sentence is long enough that it is still playing when the next one comes."
    await ws.send(json.dumps({"type": "input.text", "text": first}))
    await ws.send(json.dumps({"type": "input.done"}))
    heard, done = 0, 0
    while True:  # the first utterance's audio begins: its listener is hearing speech
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, bytes):
            heard += len(m)
            break
    await ws.send(json.dumps({"type": "input.text", "text": "And this one follows it."}))
    await ws.send(json.dumps({"type": "input.done"}))
    while done < 2:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, bytes):
            heard += len(m)
        elif (event := json.loads(m))["type"] == "session.done":
            done += 1
        else:
            assert event["type"] != "error", event
    await ws.close()
    assert len(log) == 2, log
    assert "listener_buffer_s" not in log[0]  # nothing played before the first: a newcomer
    left = log[1].get("listener_buffer_s")
    # It opened while the first sentence (about 5 s of speech) still played: some of it was left, and
    # no more than the first utterance's audio in all.
    assert isinstance(left, float) and 0.0 < left <= heard / 2 / 24000, (left, heard)


async def test_after_a_barge_in_the_next_utterance_is_a_new_listeners(
        opened: tuple[str, list[dict[str, object]]]) -> None:
    # The client drops what it was playing at input.cancel: the reply to the interruption must not wait as
    # the continuation of audio nobody hears.
    addr, log = opened
    ws, ready = await open_session(addr)
    assert ready["type"] == "session.ready", ready
    long = "This answer goes on and on, long enough that the listener interrupts it while it plays. " * 3
    await ws.send(json.dumps({"type": "input.text", "text": long}))
    await ws.send(json.dumps({"type": "input.done"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
        pass  # until its audio plays
    await ws.send(json.dumps({"type": "input.cancel"}))
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, str) and json.loads(m)["type"] == "audio.cancelled":
            break
    await ws.send(json.dumps({"type": "input.text", "text": "Sorry, go ahead."}))
    await ws.send(json.dumps({"type": "input.done"}))
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, str) and (event := json.loads(m))["type"] == "session.done" and event.get(
                "utterance_index") == 1:
            break
    await ws.close()
    assert len(log) == 2, log
    assert "listener_buffer_s" not in log[1], log[1]
