"""Tenant lexicons in the session store: shared by replicas, per tenant, bounded (one script writes the
lexicon and its index, so the bound holds on a Redis Cluster as on one server)."""

from __future__ import annotations

import msgspec
import pytest

from sessions import InvalidId, SessionStore
from sessions.lexicon import Lexicon, LexiconLimitExceeded, LexiconStore

from .conftest import MakeStore


async def test_a_lexicon_is_shared_by_replicas_and_kept_per_tenant(make_store: MakeStore) -> None:
    a, b = LexiconStore(await make_store("a")), LexiconStore(await make_store("b"), max_per_tenant=2)
    await a.put("acme", "brand", Lexicon({"voxgate": "vocks gate", "语音网关": "沃克斯网关"}))
    assert await b.get("acme", "brand") == Lexicon({"voxgate": "vocks gate", "语音网关": "沃克斯网关"})
    assert await b.get("other", "brand") is None and await b.names("other") == []
    await b.put("acme", "brand", Lexicon({"voxgate": "vox gate"}))  # replaced: not one more
    await b.put("acme", "names", Lexicon({}))
    with pytest.raises(LexiconLimitExceeded):
        await b.put("acme", "third", Lexicon({"a": "b"}))
    assert await a.names("acme") == ["brand", "names"]
    assert await a.delete("acme", "names") and not await a.delete("acme", "names")
    await b.put("acme", "third", Lexicon({"a": "b"}))  # room again
    assert (await a.get("acme", "brand")) == Lexicon({"voxgate": "vox gate"})


async def test_lexicon_bounds_hold_at_the_store() -> None:
    store = LexiconStore(SessionStore.from_url(None))  # the bounds are the store's own: one backend is enough
    with pytest.raises(msgspec.ValidationError):
        await store.put("acme", "big", Lexicon({f"w{i}": "x" for i in range(1001)}))
    with pytest.raises(msgspec.ValidationError):
        await store.put("acme", "long", Lexicon({"w": "x" * 129}))
    with pytest.raises(InvalidId):
        await store.put("acme", "bad name!", Lexicon({}))
    assert "big" not in await store.names("acme")
    await store.store.close()
