"""A Redis that accepts connections but stops answering (redis-server SIGSTOPped: the kernel still
completes TCP handshakes into its backlog; nothing is ever read). The store must notice within a
second, fail fast after that, keep writes queued and replay them in order when Redis answers again."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import pytest

from sessions import SessionStore, StateUnavailable, StoreSettings, StreamLimitExceeded

from ..conftest import RedisServer

pytestmark = pytest.mark.redis

SETTINGS = StoreSettings(lease_ttl_s=3.0, stream_ttl_s=3.0, op_timeout_s=0.5, connect_timeout_s=0.3)


@pytest.fixture
def stores(redis_stores: Callable[[str, StoreSettings], SessionStore]) -> Callable[[str], SessionStore]:
    return lambda replica: redis_stores(replica, SETTINGS)


async def _until(check: Callable[[], bool], timeout: float) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


async def test_a_stall_is_noticed_without_traffic_and_then_costs_nobody_a_wait(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    store = stores("a")
    await store.start()
    rec = await store.create_session("acme", {})
    assert store.health().status == "ok"
    redis_server.pause()
    noticed = await _until(lambda: store.health().status == "degraded", 2.0)  # heartbeat + op timeout
    assert noticed < 1.5
    h = store.health()
    assert h.error == "the session state store is unavailable" and str(redis_server.port) not in h.error
    t0 = time.monotonic()
    for op in (
        store.load_session("acme", rec.session_id),
        store.create_session("acme", {}),
        store.acquire_lease("acme", rec.session_id),
        store.acquire_stream("acme", 2),
        store.publish_cancel("acme", rec.session_id),
        store.subscribe("acme", rec.session_id),
        store.get_voice("acme", "anna"),
    ):
        with pytest.raises(StateUnavailable):
            await op
    # Fail fast: no op waits out the 0.5 s op timeout while the circuit is open (half of it: a loaded box).
    assert time.monotonic() - t0 < 0.25
    redis_server.resume()
    back = await _until(lambda: store.health().status == "ok", 3.0)
    assert back < 2.0  # probes back off to at most 1 s
    assert await store.load_session("acme", rec.session_id) is not None


async def test_spoken_log_written_during_a_stall_lands_in_order_after_it(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    holder, other = stores("a"), stores("b")
    s = await holder.attach("acme", config={"language": "en"})
    s.begin_utterance(0)
    s.record_utterance(0, "before.")
    assert await holder.write_behind.flush(2.0)
    redis_server.pause()
    t0 = time.monotonic()
    for i in range(1, 4):
        s.begin_utterance(i)
        s.record_utterance(i, f"during {i}.", cancelled=i == 2)
    s.update(config={"language": "de"})
    assert time.monotonic() - t0 < 0.25  # returns at once: well inside the 0.5 s op timeout
    await _until(lambda: not holder.breaker.is_closed, 2.0)
    assert len(holder.write_behind) == 7
    await asyncio.sleep(0.5)
    redis_server.resume()
    assert await holder.write_behind.flush(3.0)
    got = await other.load_session("acme", s.session_id)
    assert got is not None
    assert [(e.utterance_index, e.text, e.cancelled, e.finished) for e in got.spoken] == [
        (0, "before.", False, True), (1, "during 1.", False, True), (2, "during 2.", True, True),
        (3, "during 3.", False, True),
    ]
    assert (got.next_utterance, got.completed, got.cancelled, got.config) == (4, 3, 1, {"language": "de"})
    assert holder.write_behind.dropped == 0
    await s.close()


async def test_stream_slots_fall_back_to_this_replicas_count_and_enter_redis_after(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    store = stores("a")
    await store.start()
    held = await store.acquire_stream("acme", 2, local_fallback=True)
    held.start_keepalive(0.2)
    redis_server.pause()
    t0 = time.monotonic()
    local = await store.acquire_stream("acme", 2, local_fallback=True)  # the first op pays the op timeout
    assert time.monotonic() - t0 < 0.8 and local.local
    t0 = time.monotonic()
    with pytest.raises(StreamLimitExceeded):  # the limit still holds, counted here
        await store.acquire_stream("acme", 2, local_fallback=True)
    assert time.monotonic() - t0 < 0.25  # no op timeout (0.5 s) paid again
    local.start_keepalive(0.2)
    redis_server.resume()
    await store.breaker.wait_closed(3.0)
    await _until(lambda: not local.local, 2.0)  # its next renewal entered it into Redis
    assert await store.active_streams("acme") == 2
    await local.release()
    await held.release()
    assert await store.active_streams("acme") == 0


async def test_releases_during_a_stall_are_queued_and_land_after_it(
    redis_server: RedisServer, redis_stores: Callable[[str, StoreSettings], SessionStore]
) -> None:
    # A 2 s op timeout, so "queued" (milliseconds) and "waited it out" (2 s) stay apart on a loaded box
    # (with 0.5 s, a busy CI worker once took 0.49 s to queue them).
    slow = dataclasses.replace(SETTINGS, op_timeout_s=2.0)
    store, other = redis_stores("a", slow), redis_stores("b", slow)
    s = await store.attach("acme")
    slot = await store.acquire_stream("acme", 1)
    redis_server.pause()
    await _until(lambda: not store.breaker.is_closed, 5.0)
    t0 = time.monotonic()
    assert await slot.release()
    await s.close()
    assert time.monotonic() - t0 < 1.0  # queued, not waiting out the 2 s op timeout
    assert len(store.write_behind) > 0
    redis_server.resume()
    assert await store.write_behind.flush(3.0)
    assert await other.active_streams("acme") == 0
    assert await other.lease_holder("acme", s.session_id) is None
