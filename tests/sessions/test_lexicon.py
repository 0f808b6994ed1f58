"""Tenant lexicons in the session store: shared by replicas, per tenant, bounded (one script writes the
lexicon and its index, so the bound holds on a Redis Cluster as on one server)."""

from __future__ import annotations

import msgspec
import pytest

from sessions import InvalidId, SessionStore
from sessions.lexicon import InvalidLexiconEntry, Lexicon, LexiconLimitExceeded, LexiconStore, lexicon_key

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


async def test_words_the_matcher_cannot_find_are_refused_and_old_stored_ones_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 35: an entry's word is letters or digits, with symbols beside them ("C++") and single spaces
    between words; one of marks alone, or with other whitespace or control characters, is refused at
    the store, and one stored before the rule is skipped on reading, with a warning."""
    store = LexiconStore(SessionStore.from_url(None))
    for word in ("~~~~", "...", " voxgate", "vox  gate", "vox\tgate", "vox\x00gate", "vox\u200dgate"):
        with pytest.raises(InvalidLexiconEntry):
            await store.put("acme", "bad", Lexicon({word: "x"}))
    good = {"C++": "see plus plus", "voxgate pro": "vocks gate pro", "O'Brien": "oh bryan", "语音网关": "沃克斯网关"}
    await store.put("acme", "good", Lexicon(good))
    assert (await store.get("acme", "good")) == Lexicon(good)
    raw = msgspec.json.encode({"entries": {"~~~~": "tilde", "voxgate": "vocks gate"}})  # put before the rule
    await store.store.client.set(lexicon_key("acme", "old"), raw)
    with caplog.at_level("WARNING", logger="voxgate"):
        assert (await store.get("acme", "old")) == Lexicon({"voxgate": "vocks gate"})
    assert "no longer valid" in caplog.text and "'~~~~'" in caplog.text
    await store.store.close()
