"""Control channels: a cancel published on one replica reaches the socket's replica."""

from __future__ import annotations

import asyncio

import pytest

from sessions import SessionStore, keys

from ..support.redis_topologies import Cluster, flushall
from .conftest import MakeStore, subscribers


async def test_cancel_from_another_replica_arrives(make_store: MakeStore) -> None:
    holder, other = await make_store("a"), await make_store("b")
    rec = await holder.create_session("acme", {})
    async with await holder.subscribe("acme", rec.session_id) as sub:
        assert await other.publish_cancel("acme", rec.session_id, utterance_index=3) == 1
        msg = await sub.get(timeout=2)
    assert msg is not None
    assert (msg.kind, msg.session_id, msg.sender, msg.utterance_index) == ("cancel", rec.session_id, "b", 3)


async def test_cancel_reaches_only_its_session(store: SessionStore) -> None:
    s1 = await store.create_session("acme", {})
    s2 = await store.create_session("acme", {})
    sub1 = await store.subscribe("acme", s1.session_id)
    sub2 = await store.subscribe("acme", s2.session_id)
    await store.publish_cancel("acme", s2.session_id)
    assert await sub1.get(timeout=0.2) is None
    got = await sub2.get(timeout=2)
    assert got is not None and got.session_id == s2.session_id


async def test_cancel_with_no_listener_counts_zero(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    assert await store.publish_cancel("acme", rec.session_id) == 0
    sub = await store.subscribe("acme", rec.session_id)
    await sub.close()
    assert await store.publish_cancel("acme", rec.session_id) == 0


async def test_one_pubsub_connection_serves_many_sessions(make_store: MakeStore) -> None:
    holder, other = await make_store("a"), await make_store("b")
    recs = [await holder.create_session("acme", {}) for _ in range(20)]
    subs = await asyncio.gather(*(holder.subscribe("acme", r.session_id) for r in recs))
    counts = await asyncio.gather(*(other.publish_cancel("acme", r.session_id) for r in recs))
    assert counts == [1] * 20
    got = await asyncio.gather(*(s.get(timeout=2) for s in subs))
    assert [m.session_id for m in got if m] == [r.session_id for r in recs]
    # Each channel has exactly one subscriber: the store's single pub/sub connection.
    assert await subscribers(holder, *(keys.control("acme", r.session_id) for r in recs)) == [1] * 20
    if holder.backend == "redis":
        assert len(await holder.client.client_list(_type="pubsub")) == 1


async def test_closing_a_subscription_ends_iteration(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    sub = await store.subscribe("acme", rec.session_id)

    async def drain() -> list[str]:
        return [m.kind async for m in sub]

    task = asyncio.create_task(drain())
    await store.publish_cancel("acme", rec.session_id)
    await asyncio.sleep(0.1)
    await sub.close()
    assert await asyncio.wait_for(task, 2) == ["cancel"]


async def test_malformed_message_is_skipped_and_the_channel_keeps_working(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    sub = await store.subscribe("acme", rec.session_id)
    await store.client.publish(keys.control("acme", rec.session_id), b"\xffnot json")
    await store.publish_cancel("acme", rec.session_id)
    msg = await sub.get(timeout=2)
    assert msg is not None and msg.kind == "cancel"
    assert store.control.reconnects == 0


@pytest.mark.redis
async def test_a_cancel_reaches_a_subscriber_on_any_cluster_node(redis_cluster: Cluster) -> None:
    """On a Cluster the bus subscribes on one node, often not the one owning the session's slot (where
    the publishing script runs): PUBLISH crosses the cluster bus, and the count sums every node's."""
    flushall(*(n.port for n in redis_cluster.nodes))
    other = SessionStore.from_url(redis_cluster.url, replica_id="b")
    await other.start()
    try:
        for first_node in range(len(redis_cluster.nodes)):
            holder = SessionStore.from_url(redis_cluster.url, replica_id=f"a{first_node}")
            holder._backend._next = first_node  # type: ignore[union-attr]  # the bus's node: each in turn
            await holder.start()
            try:
                rec = await holder.create_session("acme", {})
                async with await holder.subscribe("acme", rec.session_id) as sub:
                    assert await other.publish_cancel("acme", rec.session_id) == 1
                    msg = await sub.get(timeout=2)
                assert msg is not None and msg.session_id == rec.session_id
            finally:
                await holder.close()
    finally:
        await other.close()
