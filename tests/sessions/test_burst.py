"""A burst of callers is capacity, not an outage (hardening round two, finding 4).

Before: redis-py's default pool holds 100 connections; 128 sessions starting at once ran it out
(`MaxConnectionsError`, a `ConnectionError`), the circuit breaker counted that as Redis failing and opened,
and every session start was refused with `state_unavailable`. Now the store's calls wait their turn for a
connection of a sized pool (sessions/gate.py), only past `pool_wait_s` are they refused, with the capacity
code `queue_full` (`StoreBusy`), and nothing of that reaches the breaker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from attack import run
from redis.exceptions import MaxConnectionsError
from support.servers import serve
from support.undisturbed import assert_undisturbed

from engine import Engine
from gateway.connection import Limits
from sessions import CircuitBreaker, SessionStore, StateUnavailable, StoreBusy, StoreSettings

from ..conftest import RedisServer

pytestmark = pytest.mark.redis


async def test_a_burst_past_redis_pys_default_pool_waits_its_turn_and_never_opens_the_breaker(
    redis_stores: Callable[[str, StoreSettings], SessionStore],
) -> None:
    store = redis_stores("burst", StoreSettings(op_timeout_s=2.0, connect_timeout_s=2.0))
    await store.start()
    # 300 session starts at once: more calls in flight than redis-py's default pool (100) holds.
    records = await asyncio.gather(*(store.create_session("t", {"n": i}) for i in range(300)))
    assert len({r.session_id for r in records}) == 300
    loaded = await asyncio.gather(*(store.load_session("t", r.session_id) for r in records))
    assert all(r is not None for r in loaded)
    assert store.breaker.is_closed and store.breaker.trips == 0, store.breaker.reason


async def test_a_call_that_gets_no_connection_in_time_is_refused_as_capacity_and_redis_stays_available(
    redis_stores: Callable[[str, StoreSettings], SessionStore],
) -> None:
    # One connection for calls (3 less the pub/sub's and the heartbeat's), held 1 s by a blocking pop.
    store = redis_stores("tiny-pool", StoreSettings(max_connections=3, pool_wait_s=0.1, op_timeout_s=2.0))
    await store.start()
    holder = asyncio.create_task(store.breaker.call(store.client.blpop(["nothing"], 1), timeout=3.0))
    await asyncio.sleep(0.05)
    with pytest.raises(StoreBusy) as refused:
        await store.load_session("t", "s")
    assert refused.value.code == "queue_full"
    assert store.breaker.is_closed and store.breaker.trips == 0
    await holder
    assert await store.load_session("t", "s") is None  # the connection is back: calls go on
    assert store.health().status == "ok"


async def test_an_exhausted_pool_is_not_counted_as_redis_failing() -> None:
    async def exhausted() -> object:
        raise MaxConnectionsError("Too many connections")

    async def pong() -> object:
        return "PONG"

    breaker = CircuitBreaker(pong, op_timeout_s=0.2, failures=2, heartbeat_s=None)
    for _ in range(5):
        with pytest.raises(StoreBusy):
            await breaker.call(exhausted())
    breaker.failure(MaxConnectionsError("Too many connections"))  # as the control bus reports a loss
    assert breaker.is_closed and breaker.trips == 0
    for _ in range(2):  # while real connection errors still open it
        with pytest.raises(StateUnavailable):
            await breaker.call(_refused())
    assert not breaker.is_closed
    await breaker.close()


async def _refused() -> object:
    raise aioredis.ConnectionError("Connection refused")


# -- a real server: a reconnect storm beside a canary -------------------------------------------------------


@pytest.mark.slow
async def test_a_reconnect_storm_of_160_sessions_on_redis_is_all_ready_beside_a_canary(
    piper_engine: Engine, redis_server: RedisServer
) -> None:
    for addr in serve(piper_engine, Limits(), redis_url=redis_server.url):
        r = await run(addr, "connect_burst", sessions=160)
        assert r.seen["ready"] == 160, r.seen  # before: 0 ready, 160 state_unavailable
        assert_undisturbed(r)


@pytest.mark.slow
async def test_a_storm_past_the_stores_connections_is_refused_with_a_capacity_code(
    piper_engine: Engine, redis_server: RedisServer
) -> None:
    # 2 connections for calls, and no wait for one: most of the storm is past capacity here.
    settings: dict[str, Any] = {"redis_url": redis_server.url, "redis_max_connections": 4, "redis_pool_wait_s": 0.01}
    for addr in serve(piper_engine, Limits(), **settings):
        r = await run(addr, "connect_burst", sessions=96)
        refused = r.seen["refused"]
        assert r.seen["ready"] + refused.get("queue_full", 0) == 96, r.seen  # never state_unavailable
        assert refused.get("queue_full", 0) > 0, r.seen
        assert r.seen["close_codes"] == [1013], r.seen  # try again later
        assert_undisturbed(r)
