"""Stores for the session tests: every contract test runs on a real redis-server and on the embedded
fakeredis store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from sessions import SessionStore, StoreSettings

from ..conftest import RedisServer
from ..support.redis_topologies import Cluster, SentinelSet, flushall

# Short TTLs keep expiry tests fast; the lease renews every ttl/3. The connect timeout is not short: a
# test opening 40 connections at once on a busy 2-core box (two test workers) saw 0.5 s run out.
FAST = StoreSettings(
    session_ttl_s=5.0, lease_ttl_s=0.6, stream_ttl_s=0.5, spoken_log_max=3,
    max_voices_per_tenant=3, max_voice_bytes=1 << 20, op_timeout_s=1.0, connect_timeout_s=2.0,
)

MakeStore = Callable[..., Awaitable[SessionStore]]

# Contract tests that mostly wait out TTLs (expiry, keep-alive): the same scripts on every topology, so
# they run on one server and embedded only. A Cluster or Sentinel changes routing, atomicity across a
# slot, pub/sub and failover, which the rest of the suite covers there (and CI's time budget is tight).
TTL_WAITS = {
    "test_keepalive_holds_the_lease_past_its_ttl", "test_renewal_keeps_the_session_record_alive",
    "test_crashed_owner_lease_expires", "test_crashed_holders_slot_expires", "test_kept_alive_slot_keeps_counting",
    "test_renewing_an_expired_slot_reports_loss", "test_resume_refreshes_ttl", "test_idle_session_expires",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        name, _, param = item.name.partition("[")
        (drop if name in TTL_WAITS and param.rstrip("]") in ("cluster", "sentinel") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three primaries on loopback, started once per test session (about 2 s); tests flush it."""
    cluster = Cluster(Path(tmp_path_factory.mktemp("cluster")))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """A primary, a replica and a sentinel, once per test session; tests flush it. Not for failover
    tests (they kill its primary): those start a set of their own."""
    sentinel = SentinelSet(Path(tmp_path_factory.mktemp("sentinel")))
    try:
        yield sentinel
    finally:
        sentinel.stop()


@pytest.fixture(params=[
    pytest.param("redis", marks=pytest.mark.redis), "embedded",
    pytest.param("cluster", marks=pytest.mark.redis), pytest.param("sentinel", marks=pytest.mark.redis),
])  # fmt: skip
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    """``await make_store(replica_id=…, **settings)``: a started store; two calls are two replicas
    sharing one Redis (one server, a three-primary Cluster, or a Sentinel-watched primary with a
    replica: the same contract on each)."""
    url: str | None
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    elif request.param == "cluster":
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        flushall(*(n.port for n in cluster.nodes))
        url = cluster.url
    elif request.param == "sentinel":
        sentinel: SentinelSet = request.getfixturevalue("redis_sentinel")
        flushall(sentinel.master_port())
        url = sentinel.url
    else:
        url = None
        # The embedded server is shared by the whole process: start each test from empty.
        wipe = SessionStore.from_url(None)
        await wipe.client.flushall()
        await wipe.close()
    stores: list[SessionStore] = []

    async def make(replica_id: str | None = None, **overrides: object) -> SessionStore:
        settings = StoreSettings(**{**FAST.__dict__, **overrides})  # type: ignore[arg-type]
        store = SessionStore.from_url(url, settings=settings, replica_id=replica_id)
        await store.start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def redis_stores(redis_server: RedisServer) -> AsyncIterator[Callable[[str, StoreSettings], SessionStore]]:
    """``redis_stores(replica_id, settings)``: stores on the real redis-server, not started (the fault
    tests start them when they mean to); closed afterwards, the server resumed first (a test may leave
    it paused)."""
    made: list[SessionStore] = []

    def make(replica: str, settings: StoreSettings) -> SessionStore:
        made.append(SessionStore.from_url(redis_server.url, settings=settings, replica_id=replica))
        return made[-1]

    yield make
    redis_server.resume()
    for s in made:
        await s.close()


@pytest.fixture
async def store(make_store: MakeStore) -> SessionStore:
    return await make_store("replica-a")


async def all_keys(store: SessionStore) -> list[bytes]:
    """Every key the store's Redis holds: on a cluster, every primary's."""
    if store.backend == "cluster":
        return list(await store.client.keys("*", target_nodes="primaries"))
    return list(await store.client.keys("*"))


async def subscribers(store: SessionStore, *channels: str) -> list[int]:
    """PUBSUB NUMSUB of each channel: on a cluster, summed over the nodes (a subscriber is on one)."""
    if store.backend != "cluster":
        return [int(n) for _, n in await store.client.pubsub_numsub(*channels)]
    per_node = [await node.execute_command("PUBSUB", "NUMSUB", *channels) for node in store.client.get_nodes()]
    return [sum(int(reply[2 * i + 1]) for reply in per_node) for i in range(len(channels))]
