"""Per-tenant concurrent-stream limits: atomic in Redis, with leases that expire when a holder dies."""

from __future__ import annotations

import asyncio

import pytest

from sessions import SessionStore, StreamLimitExceeded, StreamSlot

from .conftest import MakeStore


async def _try(store: SessionStore, tenant: str, limit: int) -> StreamSlot | None:
    try:
        return await store.acquire_stream(tenant, limit)
    except StreamLimitExceeded:
        return None


async def test_limit_holds_under_concurrent_acquire_from_two_replicas(make_store: MakeStore) -> None:
    a, b = await make_store("a", stream_ttl_s=10), await make_store("b", stream_ttl_s=10)
    results = await asyncio.gather(*(_try(s, "acme", 5) for _ in range(20) for s in (a, b)))
    won = [r for r in results if r is not None]
    assert len(won) == 5
    assert await a.active_streams("acme") == 5
    assert await b.active_streams("other") == 0
    with pytest.raises(StreamLimitExceeded) as exc:
        await b.acquire_stream("acme", 5)
    assert (exc.value.limit, exc.value.active, exc.value.code) == (5, 5, "stream_limit")


async def test_release_frees_a_slot(store: SessionStore) -> None:
    first = await store.acquire_stream("acme", 1)
    assert await _try(store, "acme", 1) is None
    assert await first.release()  # returns at once; the Redis write is queued
    assert not await first.release()
    assert await _try(store, "acme", 1) is not None  # this replica's acquire waits for its queued release


async def test_crashed_holders_slot_expires(make_store: MakeStore) -> None:
    crashed, alive = await make_store("a"), await make_store("b")
    await crashed.acquire_stream("acme", 1)  # never renewed, never released
    assert await _try(alive, "acme", 1) is None
    await asyncio.sleep(0.6)  # stream_ttl_s=0.5
    assert await alive.active_streams("acme") == 0
    assert await _try(alive, "acme", 1) is not None


async def test_kept_alive_slot_keeps_counting(store: SessionStore) -> None:
    async with await store.acquire_stream("acme", 1) as slot:
        await asyncio.sleep(0.9)  # > TTL, renewed every ~0.17 s
        assert await _try(store, "acme", 1) is None
        assert not slot.lost.is_set()
    assert await store.active_streams("acme") == 0


async def test_renewing_an_expired_slot_reports_loss(store: SessionStore) -> None:
    slot = await store.acquire_stream("acme", 2)
    await asyncio.sleep(0.6)
    assert not await slot.renew()
    assert await store.active_streams("acme") == 0


async def test_unlimited_tenant_is_still_counted(store: SessionStore) -> None:
    slots = [await store.acquire_stream("acme", None) for _ in range(3)]
    assert await store.active_streams("acme") == 3
    for s in slots:
        await s.release()
    assert await store.active_streams("acme") == 0
