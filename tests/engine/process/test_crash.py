"""Crash isolation: the engine's child is killed (-9) under a real gateway on loopback, mid-stream.

Its open stream ends with an `error` (engine_restarting), the gateway keeps answering, the engine
says it is down and refuses new sessions clearly (engine_unavailable) until its restarted child is
warm, and the next session speaks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import open_session, refused_at_handshake, utterance

from engine import AudioChunk, EngineError, StreamEnd
from engine.process import RESTARTING, ProcessEngine, start_engine
from engine.process.supervisor import Backoff

from .conftest import PIPER

HANG_S = 3.0  # silence from a warm child past this: it is stuck, killed and restarted
LONG = "This answer goes on for a while, so that it is still speaking when its engine dies. " * 6


@pytest.fixture(scope="module")
def child() -> Iterator[ProcessEngine]:
    engine = ProcessEngine("piper", PIPER, backoff=Backoff(first=0.3), hang_timeout_s=HANG_S)
    try:
        engine.wait_ready(240)
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def gateway(child: ProcessEngine) -> Iterator[str]:
    yield from serve(child)  # type: ignore[arg-type]


def health(addr: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=5) as r:
            return r.status, json.load(r), time.monotonic() - t0
    except urllib.error.HTTPError as e:  # 503: no model serving (the one there is restarting)
        return e.code, json.load(e), time.monotonic() - t0


async def test_kill_9_mid_stream_ends_it_with_an_error_and_the_next_session_speaks(
        gateway: str, child: ProcessEngine) -> None:
    ws, ready = await open_session(gateway)
    assert ready["type"] == "session.ready", ready
    await ws.send(json.dumps({"type": "input.text", "text": LONG}))
    await ws.send(json.dumps({"type": "input.done"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):  # speaking
        pass
    pid = child.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    error: dict[str, Any] | None = None
    deadline = time.monotonic() + 10
    while error is None:  # audio already on its way may come first; then the error, well within seconds
        m = await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
        if isinstance(m, str) and json.loads(m)["type"] == "error":
            error = json.loads(m)
    assert error["code"] == "engine_restarting", error
    assert "SIGKILL" in error["message"]
    assert child.state in ("restarting", "ready") and "SIGKILL" in (child.last_error or "")

    status, body, took = await asyncio.to_thread(health, gateway)  # the gateway is alive and answers at once
    assert took < 2.0 and status in (200, 503), body
    if status == 503:
        assert body["status"] == "warming" and set(body.get("models", {}).values()) <= {"restarting", "ready"}, body
    if child.state == "restarting":  # a newcomer is told why (before the upgrade), it is not left waiting
        status, _, body = await refused_at_handshake(gateway)
        assert status == 503 and body["error"]["code"] == "engine_not_ready", body
    await ws.close()

    await asyncio.to_thread(child.wait_ready, 120)
    assert child.restarts == 1 and child.pid not in (None, pid)
    ws, ready = await open_session(gateway)
    assert ready["type"] == "session.ready", ready
    events, audio = await utterance(ws, "The engine is back.")
    assert events[-1]["type"] == "session.done", events[-1]
    assert sum(len(b) for b in audio) > 24000  # over half a second of 24 kHz int16
    await ws.close()


async def test_an_open_on_a_check_cache_miss_does_not_wait_for_a_stopped_child(
        gateway: str, child: ProcessEngine) -> None:
    """Two sessions' configs were checked; an eviction (or the child's restart) between the check and the
    open makes each open a cache miss while the child is stopped: the gateway's loop must not wait for
    it (it did, CHECK_TIMEOUT_S = 2 s, freezing every session and /health); once it runs, both speak."""
    from canary import HealthProbe

    await asyncio.to_thread(child.wait_ready, 120)
    sessions = [await open_session(gateway) for _ in range(2)]
    assert all(ready["type"] == "session.ready" for _, ready in sessions), sessions
    pid = child.pid
    assert pid is not None
    child._verdicts.clear()  # what an eviction or a restart leaves: the opens' request is not known
    os.kill(pid, signal.SIGSTOP)
    try:
        async with HealthProbe(f"http://{gateway}", interval=0.02) as probe:
            spoken = [asyncio.create_task(utterance(ws, "Said once the engine runs again.", 30)) for ws, _ in sessions]
            await asyncio.sleep(2.0)  # below HANG_S: stopped, not yet given up
    finally:
        os.kill(pid, signal.SIGCONT)
    for task in spoken:
        events, audio = await task
        # Spoken; or, on a box so loaded that the resumed child's beat came after HANG_S, told why not.
        assert (events[-1]["type"] == "session.done" and audio) or events[-1].get("code") == RESTARTING, events
    assert not probe.failures and probe.worst_s < 1.0, probe.latencies
    for ws, _ in sessions:
        await ws.close()


async def test_a_child_that_stops_answering_is_killed_and_restarted(child: ProcessEngine) -> None:
    await asyncio.to_thread(child.wait_ready, 120)
    restarts, pid = child.restarts, child.pid
    assert pid is not None
    stream = child.open_stream("joe", "en")
    stream.append(LONG)
    stream.finish()
    events = stream.events()
    assert isinstance(await asyncio.wait_for(anext(events), 30), AudioChunk)
    os.kill(pid, signal.SIGSTOP)  # alive, and silent: a deadlock as the parent sees it
    t0 = time.monotonic()
    rest = [ev async for ev in events]
    assert isinstance(rest[-1], StreamEnd) and rest[-1].code == "engine_restarting", rest[-1]
    assert time.monotonic() - t0 < HANG_S + 3
    assert child.restarts == restarts + 1 and "sent nothing" in (child.last_error or "")
    with pytest.raises(EngineError) as refused:  # until it is warm again (the test above saw one speak again)
        child.open_stream("joe", "en")
    assert refused.value.code == "engine_unavailable"


def test_an_engine_that_cannot_load_fails_once_and_says_why() -> None:
    engine = start_engine("piper", no_such_option=1)
    try:
        with pytest.raises(EngineError) as err:
            engine.wait_ready(120)
        assert err.value.code in ("model_unavailable", "invalid_option")
        assert engine.state == "failed" and "no_such_option" in (engine.last_error or "")
        assert engine.restarts == 0  # restarting would not help
        with pytest.raises(EngineError) as refused:
            engine.open_stream(None, "en")
        assert refused.value.code == err.value.code
    finally:
        engine.close()
