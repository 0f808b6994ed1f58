"""Faults against a real redis-server: unreachable at start-up, lost mid-run, back on the same port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from sessions import SessionStore, StateUnavailable, StoreSettings, Voice

from ..conftest import RedisServer, free_port

pytestmark = pytest.mark.redis

SETTINGS = StoreSettings(lease_ttl_s=0.6, op_timeout_s=0.5, connect_timeout_s=0.3)


@pytest.fixture
def stores(redis_stores: Callable[[str, StoreSettings], SessionStore]) -> Callable[[str], SessionStore]:
    return lambda replica: redis_stores(replica, SETTINGS)


async def _eventually(check: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():  # type: ignore[misc]
                return
        except StateUnavailable:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_start_fails_clearly_when_redis_is_unreachable() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    store = SessionStore.from_url(url, settings=SETTINGS)
    with pytest.raises(StateUnavailable) as exc:
        await store.start()
    assert exc.value.code == "state_unavailable"
    assert "cannot reach Redis at redis://:***@127.0.0.1" in str(exc.value)
    assert "s3cret" not in str(exc.value)
    await store.close()


async def test_operations_fail_fast_while_redis_is_down_and_recover(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    store = stores("a")
    await store.start()
    rec = await store.create_session("acme", {"x": 1})
    await store.put_voice("acme", Voice("anna", ref_audio=b"pcm"))
    redis_server.stop()

    health = await store.ping()
    assert (health.status, health.backend) == ("degraded", "redis") and health.error
    t0 = time.perf_counter()
    for op in (
        store.load_session("acme", rec.session_id),
        store.create_session("acme", {}),
        store.put_voice("acme", Voice("bob")),
        store.acquire_lease("acme", rec.session_id),
        store.acquire_stream("acme", 2),
        store.publish_cancel("acme", rec.session_id),
        store.subscribe("acme", rec.session_id),
    ):
        with pytest.raises(StateUnavailable):
            await op
    assert time.perf_counter() - t0 < 5  # nothing hangs for long

    redis_server.start()  # same port, empty (no persistence)
    await _eventually(lambda: _ok(store))
    assert (await store.ping()).status == "ok"
    again = await store.create_session("acme", {"y": 2})
    assert (await store.load_session("acme", again.session_id)) is not None


async def _ok(store: SessionStore) -> bool:
    return (await store.ping()).status == "ok"


async def test_subscription_resumes_after_redis_restart(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    holder, other = stores("a"), stores("b")
    rec = await holder.create_session("acme", {})
    local = await holder.load_session("acme", rec.session_id)
    assert local is not None
    sub = await holder.subscribe("acme", rec.session_id)
    redis_server.stop()
    await asyncio.sleep(0.3)
    redis_server.start()
    # The restarted Redis is empty: the owner writes its copy back before the cancel can find it.
    await _eventually(lambda: holder.restore_session(local))
    await _eventually(lambda: _subscribed(other, holder))
    assert holder.control.reconnects >= 1
    assert await other.publish_cancel("acme", rec.session_id) == 1
    msg = await sub.get(timeout=2)
    assert msg is not None and msg.kind == "cancel"


async def _subscribed(publisher: SessionStore, holder: SessionStore) -> bool:
    return holder.control.connected and bool(await publisher.client.pubsub_channels())


async def test_owner_keeps_its_lease_through_an_outage_and_restores_its_record(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    owner, rival = stores("a"), stores("b")
    rec = await owner.create_session("acme", {"voice": "anna"})
    lease = await owner.acquire_lease("acme", rec.session_id)
    lease.on_record_missing = lambda: owner.restore_session(rec, lease)
    async with lease:
        redis_server.stop()
        await asyncio.sleep(0.5)  # renewals fail meanwhile: deferred, not lost
        assert not lease.lost.is_set()
        redis_server.start()
        await _eventually(lambda: rival.load_session("acme", rec.session_id))
        assert not lease.lost.is_set()
        assert await rival.lease_holder("acme", rec.session_id) == lease.token
        got = await rival.load_session("acme", rec.session_id)
        assert got is not None and got.owner_replica == "a" and got.config == {"voice": "anna"}


async def test_open_session_rides_out_an_outage_and_is_whole_afterwards(
    redis_server: RedisServer, stores: Callable[[str], SessionStore]
) -> None:
    holder, other = stores("a"), stores("b")
    s = await holder.attach("acme", config={"language": "en"})
    events = s.events()
    s.record_utterance(0, "before")
    assert await holder.write_behind.flush(2.0)
    redis_server.stop()
    s.record_utterance(1, "during")  # returns at once: the socket keeps speaking; the local copy has it
    assert s.record.next_utterance == 2
    redis_server.start()  # empty
    await _eventually(lambda: other.load_session("acme", s.session_id))  # restored by the lease renewal
    got = await other.load_session("acme", s.session_id)
    assert got is not None
    assert ([e.text for e in got.spoken], got.next_utterance, got.owner_replica) == (["before", "during"], 2, "a")
    await _eventually(lambda: _subscribed(other, holder))
    assert await other.publish_cancel("acme", s.session_id) == 1
    msg = await asyncio.wait_for(events.__anext__(), 2)
    assert msg.kind == "cancel"
    assert not s.lease.lost.is_set()
    await s.close()


async def test_redis_back_triggers_renewal_at_once_not_a_period_later(redis_server: RedisServer) -> None:
    slow = StoreSettings(lease_ttl_s=60.0, op_timeout_s=0.5, connect_timeout_s=0.3)  # renews every 20 s
    async with SessionStore.from_url(redis_server.url, settings=slow, replica_id="a") as holder:
        s = await holder.attach("acme")
        redis_server.stop()
        await asyncio.sleep(0.2)
        redis_server.start()  # empty
        t0 = time.monotonic()
        await _eventually(lambda: holder.load_session("acme", s.session_id), timeout=3.0)
        assert time.monotonic() - t0 < 3.0
        assert await holder.lease_holder("acme", s.session_id) == s.lease.token
        await s.close()
