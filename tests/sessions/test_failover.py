"""A Sentinel failover under live sessions: two gateways on one Sentinel-watched primary (with a replica);
the primary is killed with SIGKILL while a session speaks. Audio keeps flowing through it, the voice
registered before it is still there (its write waited for the replica), and after it a session resumes
on the other gateway with the next utterance index and a cancel posted to one gateway stops the other's
stream. Prints the failover time and the worst audio gap (run with -s to see them)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import call, open_session, post, say, until

from ..support.redis_topologies import SentinelSet, command

pytestmark = [pytest.mark.redis]
VOICE_KEY = "voxgate:v1:{default}:voice:agent"
LONG = " ".join(f"Sentence number {i} of a long answer that keeps speaking." for i in range(7))


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path, down_after_ms=400, failover_ready=True)
    try:
        yield s
    finally:
        s.stop()


async def play(ws: Any, rate: int) -> tuple[dict[str, Any], float]:
    """Read to the utterance's end as a real-time player would play it (from its first frame on): the
    last event and the longest silence the player would have had (audio not there when due). Message
    gaps alone say little: the gateway sends audio ahead of real time."""
    due: float | None = None  # when what has arrived runs out
    worst = 0.0
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        now = time.monotonic()
        if isinstance(m, bytes):
            due = now if due is None else due
            if now > due:
                worst, due = max(worst, now - due), now
            due += len(m) / 2 / rate  # 16-bit mono PCM
        elif json.loads(m)["type"] in ("session.done", "error"):
            return json.loads(m), worst


async def watch_failover(s: SentinelSet, a: str, b: str, killed: float) -> tuple[float, float]:
    """Seconds from the kill until the sentinel names the replica as primary, and until both gateways'
    /health is ok again (their circuits closed on the new primary)."""
    promoted = None
    while True:
        if promoted is None and s.master_port() == s.replica.port:
            promoted = time.monotonic() - killed
        ha, hb = await asyncio.gather(asyncio.to_thread(health, a), asyncio.to_thread(health, b))
        if promoted is not None and not ha.get("detail") and not hb.get("detail"):
            return promoted, time.monotonic() - killed
        await asyncio.sleep(0.05)


def health(addr: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}/health", timeout=2) as r:
        return dict(json.load(r))


async def test_sentinel_failover_during_a_live_session(sentinel_set: SentinelSet, piper_engine: Any) -> None:
    for a in serve(piper_engine, redis_url=sentinel_set.url):
        for b in serve(piper_engine, redis_url=sentinel_set.url):
            assert health(a)["state"] == "sentinel"
            assert call(a, "POST", "/v1/audio/voices", None, {"voice_id": "agent", "base_voice": "joe"})[0] == 201
            # Its write waited for the replica, at most 0.2 s (sessions/store.py `_acked`); on a busy box the
            # replica may take longer, and only what it holds survives the kill: let it catch up first.
            deadline = time.monotonic() + 10
            while not command(sentinel_set.replica.port, "EXISTS", VOICE_KEY).startswith(b":1"):
                assert time.monotonic() < deadline, "the replica never held the registered voice"
                await asyncio.sleep(0.02)

            ws, ready = await open_session(a, voice="agent")
            assert ready["type"] == "session.ready", ready
            sid = ready["session_id"]
            await ws.send(json.dumps({"type": "input.text", "text": LONG}))
            await ws.send(json.dumps({"type": "input.done"}))
            while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
                pass
            killed = time.monotonic()
            sentinel_set.primary.kill()  # kill -9: no goodbye to clients or to the replica
            watch = asyncio.create_task(watch_failover(sentinel_set, a, b, killed))
            done, worst = await play(ws, ready["sample_rate"])
            assert done["type"] == "session.done", done
            spoke_for = time.monotonic() - killed
            await ws.close()
            promoted, healthy = await asyncio.wait_for(watch, 20)
            print(f"\nfailover: sentinel promoted the replica {promoted:.2f} s after kill -9; both gateways "
                  f"healthy {healthy:.2f} s after the kill; worst audio gap at the listener {worst * 1000:.0f} ms "
                  f"over the {spoke_for:.1f} s it kept speaking")
            assert worst < 3.0  # audio never waits on Redis

            # The voice acknowledged before the kill survived it (the write waited for the replica).
            status, listed = call(b, "GET", "/v1/audio/voices", None)
            assert status == 200 and "agent" in {v["name"] for v in listed["voices"]}, listed

            # The session resumes on B with the next index (A replayed its spoken log once Redis was back).
            deadline = time.monotonic() + 10
            while True:
                ws2, resumed = await open_session(b, session_id=sid)
                if resumed.get("next_utterance_index") == 1 or time.monotonic() > deadline:
                    break
                await ws2.close()
                await asyncio.sleep(0.1)
            assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
            assert resumed["next_utterance_index"] == 1, resumed

            # A cancel posted to A reaches B's stream.
            await ws2.send(json.dumps({"type": "input.text", "text": LONG}))
            await ws2.send(json.dumps({"type": "input.done"}))
            while not isinstance(await asyncio.wait_for(ws2.recv(), 30), bytes):
                pass
            assert post(a, f"/v1/sessions/{sid}/cancel")[0] == 202
            assert (await until(ws2, "audio.cancelled"))[-1]["utterance_index"] == 1
            assert (await say(ws2, "After the failover."))[-1]["utterance_index"] == 2
            await ws2.close()
