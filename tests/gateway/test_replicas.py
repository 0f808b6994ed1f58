"""Sessions shared by gateway replicas through a real redis-server: resume, takeover, cancel from
anywhere, tenants, stream limits, and a Redis outage."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import websockets
from support.servers import serve
from support.wsclient import open_session, post, say, until

from engine import Engine
from gateway.connection import Limits
from sessions import hash_api_key

pytestmark = pytest.mark.redis

KEYS = f"acme={hash_api_key('acme-key')},beta={hash_api_key('beta-key')}"


@contextmanager
def replicas(engine: Engine, n: int, **settings: Any) -> Iterator[list[str]]:
    with ExitStack() as stack:
        addrs = []
        for _ in range(n):
            gen = serve(engine, Limits(config_timeout=5.0), **settings)
            addrs.append(next(gen))
            stack.callback(lambda g=gen: next(g, None))
        yield addrs


def get(addr: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}{path}") as r:
        return json.load(r)


async def test_a_session_resumes_on_another_replica(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 2, redis_url=redis_server.url) as (a, b):
        ws, ready = await open_session(a, sample_rate=16000, split_granularity="sentence")
        assert ready["resumed"] is False and ready["next_utterance_index"] == 0
        await say(ws, "First turn on replica A.")
        await ws.close()
        ws, ready = await open_session(b, session_id=ready["session_id"], voice=None)
        assert ready["resumed"] is True and ready["next_utterance_index"] == 1
        assert ready["sample_rate"] == 16000  # the stored config came back
        events = await say(ws, "Second turn on the other replica. Still the same session.")
        committed = [e for e in events if e["type"] == "segment.committed"]
        assert {e["utterance_index"] for e in committed} == {1}
        assert [e["reason"] for e in committed] == ["sentence", "flush"]  # split_granularity restored
        await ws.close()


async def test_a_second_connection_takes_over_and_the_first_is_told(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 2, redis_url=redis_server.url) as (a, b):
        old, ready = await open_session(a)
        new, ready2 = await open_session(b, session_id=ready["session_id"])
        assert ready2["type"] == "session.ready" and ready2["resumed"]
        err = await until(old, "error", timeout=10)
        assert err[-1]["code"] == "session_taken_over"
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(old.recv(), 10)
        await say(new, "The new owner speaks.")
        await new.close()


async def test_refuse_policy_keeps_the_first_connection(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 1, redis_url=redis_server.url, takeover="refuse") as (a,):
        first, ready = await open_session(a)
        _, refused = await open_session(a, session_id=ready["session_id"])
        assert refused["type"] == "error" and refused["code"] == "session_busy"
        await say(first, "Still mine.")
        await first.close()


async def test_cancel_from_any_replica_reaches_the_socket(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 2, redis_url=redis_server.url) as (a, b):
        ws, ready = await open_session(a)
        long = " ".join(f"Sentence number {i} of a long answer." for i in range(40))
        await ws.send(json.dumps({"type": "input.text", "text": long}))
        await ws.send(json.dumps({"type": "input.done"}))
        while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
        status, body = post(b, f"/v1/sessions/{ready['session_id']}/cancel")
        assert status == 202 and body["replicas"] >= 1
        events = await until(ws, "audio.cancelled")
        assert events[-1]["utterance_index"] == 0 and events[-1]["played_bytes"] > 0
        assert post(b, "/v1/sessions/no-such-session/cancel")[0] == 404
        await ws.close()


async def test_tenants_are_isolated_and_keys_required(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 1, redis_url=redis_server.url, api_keys=KEYS) as (a,):
        _, refused = await open_session(a)
        assert refused["code"] == "unauthorized"
        _, refused = await open_session(a, key="wrong-key")
        assert refused["code"] == "unauthorized"
        ws, ready = await open_session(a, key="acme-key")
        sid = ready["session_id"]
        # Another tenant cannot see the session: not found, never "forbidden".
        _, other = await open_session(a, key="beta-key", session_id=sid)
        assert other["code"] == "session_not_found"
        assert post(a, f"/v1/sessions/{sid}/cancel", "beta-key")[0] == 404
        assert post(a, f"/v1/sessions/{sid}/cancel")[0] == 401
        assert post(a, f"/v1/sessions/{sid}/cancel", "acme-key")[0] == 202
        await ws.close()


async def test_per_tenant_stream_limit(cpu_engine: Engine, redis_server: Any, tmp_path: Any) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"tenants": {"acme": {"key_sha256": [hash_api_key("k")], "max_streams": 1}}}))
    with replicas(cpu_engine, 1, redis_url=redis_server.url, api_keys=str(keys)) as (a,):
        one, _ = await open_session(a, key="k")
        two, _ = await open_session(a, key="k")
        long = " ".join(f"Sentence number {i} of a long answer." for i in range(30))
        await one.send(json.dumps({"type": "input.text", "text": long}))
        await one.send(json.dumps({"type": "input.done"}))
        while not isinstance(await asyncio.wait_for(one.recv(), 30), bytes):
            pass
        await two.send(json.dumps({"type": "input.text", "text": "Me too, please. "}))
        err = await until(two, "error")
        assert err[-1]["code"] == "stream_limit"
        await one.send(json.dumps({"type": "input.cancel"}))
        await until(one, "audio.cancelled")
        await asyncio.sleep(0.2)  # the slot is released as the stream ends
        await two.send(json.dumps({"type": "input.done"}))
        await until(two, "session.done")
        events = await say(two, "Now there is room.")
        assert events[-1]["type"] == "session.done"
        await one.close()
        await two.close()


async def test_redis_outage_keeps_open_sessions_speaking(cpu_engine: Engine, redis_server: Any) -> None:
    with replicas(cpu_engine, 1, redis_url=redis_server.url) as (a,):
        ws, ready = await open_session(a)
        redis_server.stop()
        deadline = asyncio.get_running_loop().time() + 2  # /health reads the store's breaker: it trips within ~1 s
        while get(a, "/health")["status"] != "degraded":
            assert asyncio.get_running_loop().time() < deadline, "/health did not say degraded"
            await asyncio.sleep(0.05)
        events = await say(ws, "Redis is down but I keep talking.")  # from the local copy
        assert events[-1]["type"] == "session.done"
        _, refused = await open_session(a, session_id=ready["session_id"])
        assert refused["code"] == "state_unavailable"
        redis_server.start()
        deadline = asyncio.get_running_loop().time() + 15
        while get(a, "/health")["status"] != "ok":
            assert asyncio.get_running_loop().time() < deadline, "no recovery"
            await asyncio.sleep(0.2)
        events = await say(ws, "And Redis is back.")
        assert events[-1]["type"] == "session.done"
        await ws.close()
