"""Issue 13, finding 3: a Redis that accepts connections but stops answering (redis-server SIGSTOPped)
under a real gateway, with a canary session speaking throughout.

Before: every utterance waited out the store's timeouts and retries before `session.done` (canary gaps
of 6–18 s), `audio.cancelled` came 18 s after `input.cancel`, and `/health` took 6–18 s to say
"degraded" (with the Redis address in `detail`). Now audio and acknowledgements never wait on the store:
writes go behind, the circuit opens within a second, and `/health` answers from its state.

Bounds are generous (a shared 2-core machine); the numbers are printed for the record (pytest -s).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from canary import CANARY_TEXT, Canary, HealthProbe
from support.servers import serve
from support.wsclient import open_session, utterance

from engine import Engine
from sessions import SessionRecord, SessionStore, hash_api_key

from ..conftest import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

KEY = "acme-key"
LONG = " ".join(f"Sentence number {i} of a long answer, spoken while the store is stalled." for i in range(30))


@pytest.fixture
def gateway(cpu_engine: Engine, redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    # A tenant with a stream limit, so every utterance takes a stream slot (the audio path's one read).
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"tenants": {"acme": {"key_sha256": [hash_api_key(KEY)], "max_streams": 4}}}))
    try:
        yield from serve(cpu_engine, redis_url=redis_server.url, api_keys=str(keys))
    finally:
        redis_server.resume()  # a failed assert must not leave the server's shutdown waiting on it


def health(addr: str) -> tuple[float, dict[str, Any]]:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://{addr}/health", timeout=30) as r:
        body = json.load(r)
    return time.monotonic() - t0, body


def metric(addr: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def barge_in(ws: Any) -> float:
    """Start a long reply, cancel it once its audio flows: seconds from `input.cancel` to `audio.cancelled`."""
    await ws.send(json.dumps({"type": "input.text", "text": LONG}))
    await ws.send(json.dumps({"type": "input.done"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
        pass
    t0 = time.monotonic()
    await ws.send(json.dumps({"type": "input.cancel"}))
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, str) and json.loads(m)["type"] == "audio.cancelled":
            return time.monotonic() - t0


async def canary_record(url: str) -> SessionRecord:
    """The canary's session as Redis holds it (the canary does not say its id: find it by its text)."""
    async with SessionStore.from_url(url) as store:
        for k in await store.client.keys("voxgate:v1:{acme}:session:*"):
            name = k.decode()
            if name.count(":") != 4:  # the record, not its :spoken / :lease keys
                continue
            rec = await store.load_session("acme", name.rsplit(":", 1)[1])
            if rec is not None and any(e.text == CANARY_TEXT for e in rec.spoken):
                return rec
    raise AssertionError("the canary's session is not in Redis")


async def test_a_stalled_redis_stalls_no_audio_no_cancel_and_no_health_check(
    gateway: str, redis_server: RedisServer
) -> None:
    ws, ready = await open_session(gateway, KEY)
    assert ready["type"] == "session.ready"
    async with Canary(gateway, key=KEY) as canary, HealthProbe(gateway) as probe:
        await canary.keep_hearing(1)
        canary.worst_wait, before = 0.0, canary.utterances
        probe.latencies.clear()

        redis_server.pause()
        paused = time.monotonic()
        answers = []
        while True:
            answers.append(await asyncio.to_thread(health, gateway))
            if answers[-1][1]["status"] == "degraded" or time.monotonic() - paused > 10:
                break
            await asyncio.sleep(0.02)
        degraded_after = time.monotonic() - paused
        cancelled_after = await barge_in(ws)
        await canary.keep_hearing(3)  # three whole utterances while Redis says nothing
        during = canary.utterances
        worst = canary.worst_wait
        down_health = answers[-1][1]
        slowest_health = max(s for s, _ in answers)
        local_slots = metric(gateway, "voxgate_state_streams_local_total")

        redis_server.resume()
        resumed = time.monotonic()
        while (await asyncio.to_thread(health, gateway))[1]["status"] != "ok":
            assert time.monotonic() - resumed < 5, "health did not come back"
            await asyncio.sleep(0.05)
        ok_after = time.monotonic() - resumed
        await canary.keep_hearing(1)
    await ws.close()

    print({"canary_worst_wait_s": round(worst, 3), "audio_cancelled_s": round(cancelled_after, 3),
           "degraded_after_s": round(degraded_after, 3), "health_worst_s": round(slowest_health, 3),
           "probe_worst_s": probe.worst_s, "ok_after_resume_s": round(ok_after, 3)})  # fmt: skip
    c = canary.report()
    assert c.failure is None and not c.errors, c
    assert worst < 3.0  # was 6–18 s; 0.75 s on a quiet machine (the canary's own time to first audio)
    assert cancelled_after < 1.0  # was 18 s
    assert slowest_health < 0.5 and probe.worst_s < 0.5  # was 6–18 s
    assert degraded_after < 1.5
    assert down_health == {"status": "degraded", "model": "piper", "state": "redis", "models": {"piper": "ready"},
                           "detail": "the session state store is unavailable"}  # fmt: skip
    assert str(redis_server.port) not in json.dumps(down_health)
    assert local_slots >= 3  # the canary's stream slots came from this replica's own count
    assert ok_after < 3.0

    # The spoken log written while Redis was stalled landed once it answered, in order.
    await asyncio.sleep(0.5)
    rec = await canary_record(redis_server.url)
    logged = {e.utterance_index: e for e in rec.spoken}
    for index in range(before, during):
        assert index in logged and logged[index].finished and logged[index].text == CANARY_TEXT, (index, rec.spoken)
    assert rec.next_utterance >= during and rec.completed >= during


async def test_a_session_configured_while_redis_is_stalled_is_refused_at_once(
    gateway: str, redis_server: RedisServer
) -> None:
    ws, ready = await open_session(gateway, KEY)  # attached while Redis answers
    assert ready["type"] == "session.ready"
    redis_server.pause()
    while (await asyncio.to_thread(health, gateway))[1]["status"] != "degraded":
        await asyncio.sleep(0.05)
    t0 = time.monotonic()
    late, refused = await open_session(gateway, KEY)
    assert time.monotonic() - t0 < 1.0
    assert refused["type"] == "error" and refused["code"] == "state_unavailable", refused
    assert str(redis_server.port) not in refused["message"]
    await late.close()
    events, audio = await utterance(ws, "The open session keeps speaking.")  # the one attached before
    assert events[-1]["type"] == "session.done" and audio
    redis_server.resume()
    await ws.close()
