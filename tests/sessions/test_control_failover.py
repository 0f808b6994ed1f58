"""The control bus across topology faults (hardening round two, finding 9), on real redis-server processes.

- Sentinel: after a failover away from a primary that still answers (a partition cut it off from its
  replica and the sentinels, so nothing demotes it), the bus's pub/sub connection must leave it: cancels
  and takeover notices are published on the new primary, and the old one relays none of them. Here the
  old primary cannot be demoted (its REPLICAOF is renamed) and the failover is forced (SENTINEL FAILOVER),
  which is that partition as the gateway sees it. Before: the bus stayed subscribed there for good.
- Cluster: with one node down, a cancel that was delivered is reported as delivered. Before: counting
  the receivers asked every node and the dead one's error failed the whole cancel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions import SessionStore, StoreSettings, keys

from ..support.redis_topologies import Cluster, SentinelSet, command

pytestmark = pytest.mark.redis

SETTINGS = StoreSettings(connect_timeout_s=2.0, op_timeout_s=1.0, heartbeat_s=0.2)
UNDEMOTABLE = ("--rename-command", "REPLICAOF", "voxgate-test-replicaof", "--rename-command", "SLAVEOF",
               "voxgate-test-slaveof")  # fmt: skip


@pytest.fixture
def cut_off(tmp_path: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path, failover_ready=True, primary_args=UNDEMOTABLE)
    try:
        yield s
    finally:
        s.stop()


async def _until(what: str, ok: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_the_control_bus_leaves_an_old_primary_that_still_answers_after_a_failover(cut_off: SentinelSet) -> None:
    holder = SessionStore.from_url(cut_off.url, settings=SETTINGS, replica_id="holder")
    publisher: SessionStore | None = None
    await holder.start()
    try:
        rec = await holder.create_session("acme", {})
        sub = await holder.subscribe("acme", rec.session_id)
        old, new = cut_off.primary.port, cut_off.replica.port
        await _until("the replica never held the session", lambda: command(new, "EXISTS", keys.session(
            "acme", rec.session_id)).startswith(b":1"))  # fmt: skip
        assert command(cut_off.sentinel.port, "SENTINEL", "FAILOVER", SentinelSet.MASTER).startswith(b"+OK")
        await _until("the sentinel did not promote the replica", lambda: cut_off.master_port() == new, 20)
        await _until("the replica is not a primary", lambda: b"master" in command(new, "ROLE"))
        assert b"master" in command(old, "ROLE")  # the old one still answers, as a primary

        publisher = SessionStore.from_url(cut_off.url, settings=SETTINGS, replica_id="publisher")
        await publisher.start()  # connects to the new primary, where a cancel is published now
        deadline = time.monotonic() + 10
        while (n := await publisher.publish_cancel("acme", rec.session_id)) == 0:
            assert time.monotonic() < deadline, "the control bus never left the old primary"
            await asyncio.sleep(0.1)
        assert n == 1
        msg = await sub.get(timeout=2)
        assert msg is not None and msg.kind == "cancel" and msg.session_id == rec.session_id
        assert holder.control.repoints == 1 and holder.control.node == ("127.0.0.1", new)
        assert holder.breaker.trips == 0  # moving is not an outage
    finally:
        for store in (holder, publisher):
            if store is not None:
                await store.close()


async def test_with_one_cluster_node_down_a_delivered_cancel_counts_and_scripts_still_load(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)  # its own: a node is killed
    for n in cluster.nodes:  # the slots of the live nodes stay served (as on a cluster that fails over)
        assert command(n.port, "CONFIG", "SET", "cluster-require-full-coverage", "no").startswith(b"+OK")
    holder = SessionStore.from_url(cluster.url, settings=SETTINGS, replica_id="holder")
    other = SessionStore.from_url(cluster.url, settings=SETTINGS, replica_id="other")
    try:
        await holder.start()
        await other.start()
        rec = await holder.create_session("acme", {})
        owner = other.client.get_node_from_key(keys.session("acme", rec.session_id)).port
        ports = sorted(cluster.nodes, key=lambda n: f"127.0.0.1:{n.port}")
        holder._backend._next = [n.port for n in ports].index(owner)  # type: ignore[union-attr]  # bus on the owner
        sub = await holder.subscribe("acme", rec.session_id)
        assert holder.control.node == ("127.0.0.1", owner)
        assert await other.publish_cancel("acme", rec.session_id) == 1  # every node up (its script loaded)
        assert await sub.get(timeout=2) is not None

        victim = next(n for n in cluster.nodes if n.port != owner)
        victim.kill()
        assert await other.publish_cancel("acme", rec.session_id) == 1  # before: ConnectionError, state_unavailable
        msg = await sub.get(timeout=2)
        assert msg is not None and msg.kind == "cancel"
        assert other.breaker.is_closed and other.breaker.trips == 0

        # A script's first call on a live slot: before, redis-py loaded it on every primary, the dead one too.
        slot = await other.acquire_stream("acme", 4)
        assert slot.active_at_acquire == 1
        await other.release_stream(slot)
        await asyncio.sleep(1.0)  # heartbeats: one node down is not the store down
        assert other.breaker.is_closed and other.breaker.trips == 0, other.breaker.reason
    finally:
        await holder.close()
        await other.close()
        cluster.stop()
