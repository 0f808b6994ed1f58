"""Two real `voxgate serve` replicas behind HAProxy (deploy/haproxy.cfg as is) and nginx
(deploy/nginx.conf, addresses substituted), one Redis, clients only ever talking to a balancer, which
has no session affinity:

- sessions through nginx, resumed through HAProxy;
- kill -9 of a replica: its sessions resume through the balancer on the other, with the next index;
- a rolling restart by SIGTERM: /health says draining at once, every utterance under way is heard to
  its end, each socket then closes with CLOSE_RECONNECT, the process exits 0, and every client resumes
  through the balancer on the other replica with the next index.

Prints the resume latency through the balancer and the drain time (run with -s)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from support.replicas import TwoReplicas
from support.wsclient import open_session, say, utterance

from gateway.protocol import CLOSE_RECONNECT
from sessions import DEFAULT_TENANT, keys

from ..conftest import RedisServer
from ..support.redis_topologies import command

pytestmark = [pytest.mark.redis]
TEXT = "This answer is under way when the replica goes away, and it goes on elsewhere afterwards."
LONG = " ".join(f"Sentence {i} of an answer still being synthesized when its replica goes." for i in range(8))
MEDIUM = " ".join(f"Sentence {i} of an answer still being synthesized when its replica goes." for i in range(3))


class Deployment(TwoReplicas):
    """Two piper replicas behind HAProxy and nginx, and the Redis they share."""

    def __init__(self, redis: RedisServer, logdir: Path) -> None:
        super().__init__(redis.url, logdir)
        self.redis = redis


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    logdir = Path(tmp_path_factory.mktemp("deployment"))
    redis = RedisServer(logdir)
    redis.start()
    d = Deployment(redis, logdir)
    try:
        yield d
    finally:
        d.stop()
        redis.stop()


def owned_by(d: Deployment, session_id: str, pid: int) -> bool:
    """Whether the replica with this pid holds the session (its record's owner: host:pid:…)."""
    owner = command(d.redis.port, "HGET", keys.session(DEFAULT_TENANT, session_id), "owner_replica")
    return f":{pid}:".encode() in owner


def health(addr: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=1) as r:
            return r.status, json.load(r)["status"]
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)["status"]


async def start_speaking(lb: str, n: int, text: str = TEXT) -> list[tuple[Any, dict[str, Any]]]:
    sessions = [await open_session(lb) for _ in range(n)]
    for ws, ready in sessions:
        assert ready["type"] == "session.ready", ready
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
    for ws, _ in sessions:  # every session is speaking
        while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
    return sessions


async def to_the_close(ws: Any) -> tuple[list[dict[str, Any]], int | None, float]:
    """Read the utterance to its end, then up to 2 s more for a close: the events, the close code (None:
    still open, or broken without one), when it ended."""
    events: list[dict[str, Any]] = []
    try:
        while not events or events[-1]["type"] not in ("session.done", "error"):
            m = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(m, str):
                events.append(json.loads(m))
        await asyncio.wait_for(ws.recv(), 2)
    except websockets.ConnectionClosed as e:
        return events, e.rcvd.code if e.rcvd else None, time.monotonic()
    except TimeoutError:
        pass
    return events, None, time.monotonic()


async def resume(lb: str, session_id: str, timeout: float = 10) -> tuple[Any, dict[str, Any]]:
    """Resume through the balancer, as a client does on a close: again at once if it says draining."""
    deadline = time.monotonic() + timeout
    while True:
        ws, ready = await open_session(lb, session_id=session_id)
        if ready["type"] == "session.ready" or time.monotonic() > deadline:
            return ws, ready
        await ws.close()
        await asyncio.sleep(0.05)


async def test_sessions_speak_through_nginx_and_resume_through_either_balancer(deployment: Deployment) -> None:
    """deploy/nginx.conf carries the WebSocket upgrade and streams audio; with no affinity anywhere, a
    session begun through nginx resumes through HAProxy with its next utterance index."""
    sessions = [await open_session(deployment.nginx.addr) for _ in range(2)]
    for ws, ready in sessions:
        assert ready["type"] == "session.ready", ready
        events, audio = await utterance(ws, "Spoken through nginx.")
        assert events[-1]["type"] == "session.done" and sum(map(len, audio)) > 0, events
        await ws.close()
    ws, resumed = await resume(deployment.haproxy.addr, sessions[0][1]["session_id"])
    assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
    assert resumed["next_utterance_index"] == 1, resumed
    await ws.close()


async def test_kill_9_of_a_replica_resumes_through_the_balancer(deployment: Deployment) -> None:
    lb, (a, _) = deployment.haproxy.addr, deployment.replicas
    sessions = await start_speaking(lb, 4, LONG)  # round robin: two on each replica
    killed = time.monotonic()
    a.kill()
    try:
        waits: list[float] = []
        ends = await asyncio.gather(*(to_the_close_or_done(ws) for ws, _ in sessions))
        cut_off = []
        for (ws, ready), (events, _, closed_at) in zip(sessions, ends, strict=True):
            if any(e["type"] == "alive" for e in events):
                await ws.close()  # on the other replica: it lives; stop its answer (the box has 2 cores)
            else:  # on the killed replica: its socket broke
                cut_off.append((ready, closed_at - killed))
        for ready, _ in cut_off:
            t = time.monotonic()
            ws2, resumed = await resume(lb, ready["session_id"])
            waits.append(time.monotonic() - t)
            assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
            assert resumed["next_utterance_index"] == 1, resumed  # the cut utterance was logged as started
            assert (await say(ws2, "Resumed through the balancer."))[-1]["utterance_index"] == 1
            await ws2.close()
        cut = len(cut_off)
        assert cut >= 1
        print(f"\nkill -9: {cut} sessions cut ({', '.join(f'{c * 1000:.0f}' for _, c in cut_off)} ms after the kill) "
              f"resumed through HAProxy: resume → session.ready {', '.join(f'{w * 1000:.0f}' for w in waits)} ms")
    finally:
        # The killed replica comes back for the next test (a restart, as an orchestrator does).
        a.spawn().wait_healthy()
        deployment.haproxy.wait_up()


async def to_the_close_or_done(ws: Any) -> tuple[list[dict[str, Any]], int | None, float]:
    """Read until the socket breaks (its replica was killed), or 1.5 s without a break (it lives)."""
    events: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(1.5):
            while True:
                m = await ws.recv()
                if isinstance(m, str):
                    events.append(json.loads(m))
    except websockets.ConnectionClosed as e:
        return events, e.rcvd.code if e.rcvd else None, time.monotonic()
    except TimeoutError:
        events.append({"type": "alive"})
    return events, None, time.monotonic()


async def test_rolling_restart_by_sigterm_through_the_balancer(deployment: Deployment) -> None:
    lb, b = deployment.haproxy.addr, deployment.replicas[1]
    await asyncio.sleep(1.2)  # both replicas in rotation again (rise 2 × inter 500 ms)
    sessions = await start_speaking(lb, 4, MEDIUM)  # still being synthesized when SIGTERM comes
    assert b.proc is not None
    while sum(owned_by(deployment, ready["session_id"], b.proc.pid) for _, ready in sessions) < 2:
        assert len(sessions) < 12, "the balancer sends no sessions to B"
        sessions += await start_speaking(lb, 1, MEDIUM)
    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.1)
    assert await asyncio.to_thread(health, b.addr) == (503, "draining")
    ends = await asyncio.gather(*(to_the_close(ws) for ws, _ in sessions))
    await asyncio.to_thread(b.proc.wait, 30)
    drained = time.monotonic() - t0
    assert b.proc.returncode == 0
    on_b = [(ready, events) for (_, ready), (events, code, _) in zip(sessions, ends, strict=True)
            if code == CLOSE_RECONNECT]  # fmt: skip
    assert len(on_b) >= 1
    # B let go of what it held: no lease of its sessions is left, and no stream slot of anyone's.
    for ready, _ in on_b:
        assert command(deployment.redis.port, "EXISTS", keys.lease(DEFAULT_TENANT, ready["session_id"])) == b":0\r\n"
    assert command(deployment.redis.port, "ZCARD", keys.streams(DEFAULT_TENANT)) == b":0\r\n"
    for (_, ready), (events, code, _) in zip(sessions, ends, strict=True):
        kinds = [e["type"] for e in events]
        assert "error" not in kinds and "session.done" in kinds, events  # no utterance cut, on either
        if code != CLOSE_RECONNECT:
            continue
        ws2, resumed = await resume(lb, ready["session_id"])
        assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
        assert resumed["next_utterance_index"] == 1, resumed
        assert (await say(ws2, "Resumed after the drain."))[-1]["utterance_index"] == 1
        await ws2.close()
    for ws, _ in sessions:
        await ws.close()
    print(f"\ndrain: SIGTERM → exit 0 in {drained:.2f} s ({len(on_b)} utterances finished first); "
          f"{len(on_b)} sessions resumed on the other replica")
