"""Stores for the session tests: every contract test runs on a real redis-server and on the embedded
fakeredis store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sessions import SessionStore, StoreSettings

from ..conftest import RedisServer

# Short TTLs keep expiry tests fast; the lease renews every ttl/3.
FAST = StoreSettings(
    session_ttl_s=5.0, lease_ttl_s=0.6, stream_ttl_s=0.5, spoken_log_max=3,
    max_voices_per_tenant=3, max_voice_bytes=1 << 20, op_timeout_s=1.0, connect_timeout_s=0.5,
)

MakeStore = Callable[..., Awaitable[SessionStore]]


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "embedded"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    """``await make_store(replica_id=…, **settings)``: a started store; two calls are two replicas
    sharing one Redis."""
    if request.param == "redis":
        url: str | None = request.getfixturevalue("redis_server").url
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
