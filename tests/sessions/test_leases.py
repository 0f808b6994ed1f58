"""Ownership leases: one live connection per session; takeover and refuse; expiry of a dead holder."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sessions import SessionBusy, SessionStore, keys

from .conftest import MakeStore


async def test_second_connection_is_refused_under_refuse_policy(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b", takeover="refuse")
    rec = await a.create_session("acme", {})
    lease = await a.acquire_lease("acme", rec.session_id)
    with pytest.raises(SessionBusy):
        await b.acquire_lease("acme", rec.session_id)
    assert await a.lease_holder("acme", rec.session_id) == lease.token
    got = await b.load_session("acme", rec.session_id)
    assert got is not None and got.owner_replica == "a"


async def test_takeover_notifies_only_the_old_owner(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    rec = await a.create_session("acme", {})
    sid = rec.session_id
    old = await a.acquire_lease("acme", sid)
    old_sub = await a.subscribe("acme", sid, lease=old)
    new = await b.acquire_lease("acme", sid)  # default policy: take over
    new_sub = await b.subscribe("acme", sid, lease=new)
    assert new.took_over_from == old.token
    msg = await old_sub.get(timeout=2)
    assert msg is not None and (msg.kind, msg.target, msg.sender) == ("takeover", old.token, "b")
    assert await new_sub.get(timeout=0.2) is None
    got = await a.load_session("acme", sid)
    assert got is not None and got.owner_replica == "b"
    # The old owner's renewal reports the loss, and its release cannot delete the new lease.
    assert not await old.renew()
    assert not await old.release()
    assert await a.lease_holder("acme", sid) == new.token


async def test_takeover_on_the_same_replica_filters_by_lease(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    old = await store.acquire_lease("acme", rec.session_id)
    old_sub = await store.subscribe("acme", rec.session_id, lease=old)
    new = await store.acquire_lease("acme", rec.session_id)
    new_sub = await store.subscribe("acme", rec.session_id, lease=new)
    await store.publish_cancel("acme", rec.session_id)
    first = await old_sub.get(timeout=2)
    assert first is not None and first.kind == "takeover"
    assert [(await s.get(timeout=2)).kind for s in (old_sub, new_sub)] == ["cancel", "cancel"]  # type: ignore[union-attr]


async def test_keepalive_detects_loss_to_a_takeover(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    rec = await a.create_session("acme", {})
    async with await a.acquire_lease("acme", rec.session_id) as old:
        await b.acquire_lease("acme", rec.session_id)
        await asyncio.wait_for(old.lost.wait(), 2)  # renews every 0.2 s


async def test_keepalive_holds_the_lease_past_its_ttl(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b", takeover="refuse")
    rec = await a.create_session("acme", {})
    async with await a.acquire_lease("acme", rec.session_id) as lease:
        await asyncio.sleep(1.0)  # > 0.6 s TTL
        with pytest.raises(SessionBusy):
            await b.acquire_lease("acme", rec.session_id)
        assert not lease.lost.is_set()
    # Leaving the block released it: the next connection gets it at once.
    await b.acquire_lease("acme", rec.session_id)
    got = await b.load_session("acme", rec.session_id)
    assert got is not None and got.owner_replica == "b"


async def test_crashed_owner_lease_expires(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b", takeover="refuse")
    rec = await a.create_session("acme", {})
    await a.acquire_lease("acme", rec.session_id)  # never renewed: the owner "crashed"
    with pytest.raises(SessionBusy):
        await b.acquire_lease("acme", rec.session_id)
    await asyncio.sleep(0.7)
    lease = await b.acquire_lease("acme", rec.session_id)
    assert lease.took_over_from is None


async def test_renewal_keeps_the_session_record_alive(make_store: MakeStore) -> None:
    # The record's TTL is three renewal periods (0.2 s): a loaded box's late timer must not lose it.
    store = await make_store(session_ttl_s=0.6)
    rec = await store.create_session("acme", {})
    async with await store.acquire_lease("acme", rec.session_id):
        await asyncio.sleep(1.2)
        assert await store.load_session("acme", rec.session_id) is not None


async def test_renewal_reports_a_lost_record_and_restores_it(store: SessionStore) -> None:
    rec = await store.create_session("acme", {"k": "v"})
    lease = await store.acquire_lease("acme", rec.session_id)
    restored = asyncio.Event()

    async def restore() -> None:
        await store.restore_session(rec, lease)
        restored.set()

    lease.on_record_missing = restore
    await store.client.flushall()  # Redis came back empty
    assert await lease.renew()  # absent lease: reclaimed, not lost
    assert restored.is_set()
    assert await store.lease_holder("acme", rec.session_id) == lease.token
    got = await store.load_session("acme", rec.session_id)
    assert got is not None and got.config == {"k": "v"} and got.owner_replica == "replica-a"
    assert await store.client.pttl(keys.lease("acme", rec.session_id)) > 0


async def test_a_stores_renewals_go_together(make_store: MakeStore) -> None:
    store = await make_store("replica-a", lease_ttl_s=1.5)  # renewed every 0.5 s: a loaded box's late timer
    batches: list[int] = []
    renew_batch = store.renewals._renew_batch

    async def counted(batch: Sequence[object]) -> Sequence[object]:
        batches.append(len(batch))
        return await renew_batch(batch)  # type: ignore[arg-type]

    store.renewals._renew_batch = counted  # type: ignore[method-assign]
    recs = [await store.create_session("acme", {}) for _ in range(4)]
    leases = [await store.acquire_lease("acme", rec.session_id) for rec in recs]
    for lease in leases:  # started within well under a period of one another
        lease.start_keepalive()
    await asyncio.sleep(1.7)  # > the TTL
    assert [await store.lease_holder("acme", r.session_id) for r in recs] == [lease.token for lease in leases]
    assert sum(batches) >= 8 and len(batches) < sum(batches)  # renewed, and fewer calls than renewals
    for lease in leases:
        assert await lease.release()
    assert len(store.renewals) == 0


async def test_renewals_survive_a_redis_that_lost_its_scripts(make_store: MakeStore) -> None:
    store = await make_store("replica-a", lease_ttl_s=1.5, stream_ttl_s=1.5)
    rec = await store.create_session("acme", {})
    async with await store.acquire_lease("acme", rec.session_id) as lease:
        slot = await store.acquire_stream("acme", 2)
        slot.start_keepalive()
        await store.client.script_flush()  # as after a restart: NOSCRIPT, then loaded and sent again
        await asyncio.sleep(1.7)  # > both TTLs
        assert await store.lease_holder("acme", rec.session_id) == lease.token
        assert await store.active_streams("acme") == 1
        assert not lease.lost.is_set() and not slot.lost.is_set()
        await slot.release()
