"""Cancel at every point, idle timeouts, random message sequences, and 64 concurrent sessions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.servers import serve

from engine import Engine, load_engine
from gateway.connection import Limits

URL = "ws://{}/v1/audio/speech/stream"
LONG = " ".join(f"This is sentence number {i} of a long answer." for i in range(30))


async def connect(addr: str, **config: Any) -> Any:
    ws = await websockets.connect(URL.format(addr), max_size=None)
    await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"} | config))
    ready = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert ready["type"] == "session.ready", ready
    return ws


async def send(ws: Any, type_: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": type_, **fields}))


async def drain_until(ws: Any, kind: str, timeout: float = 30) -> tuple[list[dict[str, Any]], int]:
    """Events up to `kind`, and how many audio bytes came with them."""
    events, audio = [], 0
    while True:
        m = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(m, bytes):
            audio += len(m)
        else:
            events.append(json.loads(m))
            if events[-1]["type"] == kind:
                return events, audio


async def assert_next_utterance_is_clean(ws: Any, index: int) -> None:
    """Nothing of an earlier utterance arrives once the next one starts: its first event is its own."""
    await send(ws, "input.text", text="Fresh start.")
    await send(ws, "input.done")
    first = await asyncio.wait_for(ws.recv(), 30)
    assert isinstance(first, str), "audio arrived after audio.cancelled"
    assert json.loads(first)["utterance_index"] == index
    events, audio = await drain_until(ws, "session.done")
    assert audio > 0 and {e.get("utterance_index", index) for e in events} == {index}


@pytest.mark.parametrize("when", ["before_audio", "after_input_done", "mid_audio", "twice"])
async def test_cancel_at_every_point(gateway: str, when: str) -> None:
    ws = await connect(gateway)
    await send(ws, "input.text", text=LONG)
    if when == "after_input_done":
        await send(ws, "input.done")
    if when == "mid_audio":
        await send(ws, "input.done")
        while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
    await send(ws, "input.cancel")
    if when == "twice":
        await send(ws, "input.cancel")  # the second finds nothing active: answered, cutting nothing
    events, _ = await drain_until(ws, "audio.cancelled")
    assert events[-1]["utterance_index"] == 0 and events[-1]["cancelled"] is True
    assert not any(e["type"] in ("session.done", "audio.done") for e in events)
    if when == "twice":
        again, audio = await drain_until(ws, "audio.cancelled")
        assert again[-1]["cancelled"] is False and audio == 0 and len(again) == 1
    await assert_next_utterance_is_clean(ws, 1)
    await ws.close()


async def test_cancel_with_nothing_active_is_harmless(gateway: str) -> None:
    ws = await connect(gateway)
    await send(ws, "input.cancel")
    answer, _ = await drain_until(ws, "audio.cancelled")  # answered all the same (docs/protocol.md)
    assert answer == [{"type": "audio.cancelled", "utterance_index": None, "played_bytes": 0, "spoken_text": "",
                       "cancelled": False}]  # fmt: skip
    await assert_next_utterance_is_clean(ws, 0)
    await ws.close()


@pytest.fixture(scope="module")
def impatient_gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=1.0, idle_timeout=1.0))


async def test_idle_session_is_closed_after_its_timeout(impatient_gateway: str) -> None:
    ws = await connect(impatient_gateway)
    events, _ = await drain_until(ws, "error", timeout=10)
    assert events[-1]["code"] == "timeout"
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 10)


MESSAGES = st.one_of(
    st.builds(lambda t: {"type": "input.text", "text": t}, st.text(max_size=40)),
    st.just({"type": "input.done"}),
    st.just({"type": "input.cancel"}),
    st.just({"type": "session.config", "voice": "joe", "split_granularity": "clause"}),
    st.just({"type": "session.config", "voice": "nobody"}),
    st.just({"type": "session.config", "sample_rate": 16000, "response_format": "ulaw"}),
    st.just({"type": "no.such.type"}),
    st.just({"type": "input.text", "text": 7}),
    st.just(b"\x00binary"),
    st.just("{broken json"),
    st.just("[1, 2, 3]"),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MESSAGES, max_size=12))
def test_random_message_sequences_never_break_the_session(gateway: str, messages: list[Any]) -> None:
    async def run() -> None:
        ws = await connect(gateway)
        for m in messages:
            await ws.send(m if isinstance(m, bytes | str) else json.dumps(m))
        # Whatever came before, the session still answers: a barge-in then a fresh utterance.
        await send(ws, "input.cancel")
        await send(ws, "input.text", text="Still here.")
        await send(ws, "input.done")
        probe = None
        while True:
            m = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(m, bytes):
                continue
            ev = json.loads(m)
            if ev["type"] == "segment.committed" and ev["text"] == "Still here.":
                probe = ev["utterance_index"]
            if ev["type"] == "session.done" and ev["utterance_index"] == probe:
                break
        await ws.close()

    asyncio.run(run())


@pytest.fixture(scope="module")
def tiny_gateway() -> Iterator[str]:
    engine = load_engine("tiny")
    # 64 sessions at once: most wait their turn to start (admission, issue 14); a wait past 8 s is
    # refused, so on a slow box the test sees refusals, never a stall or a session left hanging.
    yield from serve(engine, max_queue_wait_s=8.0)
    engine.close()


@pytest.mark.slow
async def test_64_concurrent_sessions_on_the_tiny_model(tiny_gateway: str) -> None:
    """64 sessions at once: each is either spoken whole or refused explicitly (queue_full, bound "wait"
    or "slo": heard past the first-audio SLO), and every one ends with session.done; the engine serves
    streams all the while."""
    async def one(i: int) -> tuple[int, list[str]]:
        async with websockets.connect(URL.format(tiny_gateway), max_size=None) as ws:
            await send(ws, "session.config", language="en")
            ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert ready["type"] == "session.ready", ready
            await send(ws, "input.text", text=f"Hello number {i}, this is a short reply.")
            await send(ws, "input.done")
            events, audio = await drain_until(ws, "session.done", timeout=60)
            errors = [f"{e['code']}:{e.get('bound')}" for e in events if e["type"] == "error"]
            return audio, errors

    results = await asyncio.gather(*(one(i) for i in range(64)))
    spoken = [audio for audio, errors in results if not errors]
    assert all(audio > 0 for audio in spoken)
    assert {e for _, errors in results for e in errors} <= {"queue_full:wait", "queue_full:slo"}, results
    assert all(audio == 0 for audio, errors in results if errors)  # a refused one never started
    assert spoken, results  # how many depends on the box (one stream took 5 s at load 7 on 2 cores)


async def test_a_long_reply_outlives_the_idle_timeout(impatient_gateway: str) -> None:
    ws = await connect(impatient_gateway)  # idle_timeout 1 s
    await send(ws, "input.text", text=LONG)  # a reply that plays for much longer than a second…
    await send(ws, "input.done")
    events, audio = await drain_until(ws, "session.done", timeout=60)  # …is not cut off as idle
    assert audio > 24000 * 2 * 5 and not any(e["type"] == "error" for e in events)
    await ws.close()
