"""Session records: create, load, resume, update, utterance log, TTLs, tenant scoping."""

from __future__ import annotations

import asyncio

import pytest

from sessions import InvalidId, SessionExists, SessionNotFound, SessionStore, SpokenEntry, keys

from .conftest import MakeStore, all_keys


async def test_created_session_loads_back_on_another_replica(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    rec = await a.create_session("acme", {"language": "en", "split_granularity": "auto"}, voice="vivian")
    got = await b.load_session("acme", rec.session_id)
    assert got is not None
    assert got.config == {"language": "en", "split_granularity": "auto"}
    assert (got.voice, got.tenant, got.next_utterance, got.spoken) == ("vivian", "acme", 0, [])


async def test_foreign_tenant_sees_no_session(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    assert await store.load_session("other", rec.session_id) is None
    with pytest.raises(SessionNotFound):
        await store.resume_session("other", rec.session_id)
    with pytest.raises(SessionNotFound):
        await store.publish_cancel("other", rec.session_id)
    with pytest.raises(SessionNotFound):
        await store.acquire_lease("other", rec.session_id)


async def test_create_with_existing_id_is_refused(store: SessionStore) -> None:
    await store.create_session("acme", {"a": 1}, session_id="s1")
    with pytest.raises(SessionExists):
        await store.create_session("acme", {"a": 2}, session_id="s1")
    got = await store.load_session("acme", "s1")
    assert got is not None and got.config == {"a": 1}


async def test_ids_that_could_escape_the_key_layout_are_rejected(store: SessionStore) -> None:
    for bad in ["a:b", "x}y", "", "a b", "é" * 3, "x" * 129]:
        with pytest.raises(InvalidId):
            await store.load_session("acme", bad)
    with pytest.raises(InvalidId):
        await store.create_session("acme:evil", {})


async def test_resume_refreshes_ttl(make_store: MakeStore) -> None:
    store = await make_store(session_ttl_s=1.0)
    rec = await store.create_session("acme", {})
    await asyncio.sleep(0.6)
    await store.resume_session("acme", rec.session_id)
    # Unrefreshed it would have ≤ 400 ms left; the margin above that is for a loaded box's delays.
    assert await store.client.pttl(keys.session("acme", rec.session_id)) > 500
    await asyncio.sleep(0.6)  # 1.2 s after creation: alive only because resume refreshed it
    assert await store.load_session("acme", rec.session_id) is not None


async def test_idle_session_expires(make_store: MakeStore) -> None:
    # A TTL of 1 s, not less: on a busy box creating the session and recording its utterance took
    # longer than 0.2 s once, and the session had expired before its utterance came.
    store = await make_store(session_ttl_s=1.0)
    rec = await store.create_session("acme", {})
    await store.record_utterance("acme", rec.session_id, 0, "hello")
    assert await store.client.exists(keys.spoken("acme", rec.session_id))

    async def gone() -> bool:
        return (await store.load_session("acme", rec.session_id) is None
                and not await store.client.exists(keys.spoken("acme", rec.session_id)))

    deadline = asyncio.get_running_loop().time() + 10
    while not await gone() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert await gone()


async def test_update_replaces_config_and_voice(store: SessionStore) -> None:
    rec = await store.create_session("acme", {"language": "en"}, voice="a")
    await store.update_session("acme", rec.session_id, config={"language": "zh"}, voice="b")
    got = await store.load_session("acme", rec.session_id)
    assert got is not None and (got.config, got.voice) == ({"language": "zh"}, "b")


async def test_update_of_missing_session_does_not_resurrect_it(store: SessionStore) -> None:
    with pytest.raises(SessionNotFound):
        await store.update_session("acme", "gone", voice="b")
    assert not await store.client.exists(keys.session("acme", "gone"))
    assert not await store.touch_session("acme", "gone")


async def test_utterance_counters_and_capped_spoken_log(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    sid = rec.session_id
    assert await store.record_utterance("acme", sid, 0, "one") == 1
    assert await store.record_utterance("acme", sid, 1, "tw", cancelled=True) == 2
    assert await store.record_utterance("acme", sid, 2, "three") == 3
    assert await store.record_utterance("acme", sid, 3, "four 四") == 4
    # A late write for an older index never moves the counter back; one for an utterance already
    # logged as finished (a write replayed after an outage) counts once.
    assert await store.record_utterance("acme", sid, 2, "again") == 4
    assert await store.record_utterance("acme", sid, 0, "long gone") == 4  # out of the log: logged again
    got = await store.load_session("acme", sid)
    assert got is not None
    assert (got.next_utterance, got.completed, got.cancelled) == (4, 4, 1)
    assert [(e.utterance_index, e.text, e.cancelled) for e in got.spoken] == [
        (2, "three", False), (3, "four 四", False), (0, "long gone", False),
    ]  # spoken_log_max=3 keeps the last three


async def test_begin_marks_an_utterance_started_then_record_finishes_it_in_place(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    sid = rec.session_id
    assert await store.begin_utterance("acme", sid, 0) == 1
    assert await store.begin_utterance("acme", sid, 0) == 1  # idempotent: a replay changes nothing
    got = await store.load_session("acme", sid)
    assert got is not None and got.next_utterance == 1 and got.completed == 0
    assert [(e.utterance_index, e.text, e.finished) for e in got.spoken] == [(0, "", False)]
    assert await store.begin_utterance("acme", sid, 1) == 2
    assert await store.record_utterance("acme", sid, 0, "Hello.") == 2
    assert await store.record_utterance("acme", sid, 0, "Hello.") == 2  # replayed: counted once
    got = await store.load_session("acme", sid)
    assert got is not None and (got.completed, got.cancelled) == (1, 0)
    assert [(e.utterance_index, e.text, e.finished) for e in got.spoken] == [(0, "Hello.", True), (1, "", False)]
    assert await store.begin_utterance("acme", sid, 0) == 2  # a late start of a finished one: no-op
    got = await store.load_session("acme", sid)
    assert got is not None and [e.finished for e in got.spoken] == [True, False]


async def test_begin_on_missing_session_raises(store: SessionStore) -> None:
    with pytest.raises(SessionNotFound):
        await store.begin_utterance("acme", "nope", 0)
    assert not await store.client.exists(keys.session("acme", "nope"))


def test_every_spoken_entry_begins_with_its_prefix() -> None:
    for e in (SpokenEntry(7, "x", True, 1), SpokenEntry(12, "", False, 2, finished=False)):
        assert e.to_json().startswith(SpokenEntry.prefix(e.utterance_index) + str(int(e.finished)))
        assert SpokenEntry.from_json(e.to_json()) == e
    assert SpokenEntry.from_json('{"u": 3, "t": "old", "c": false, "at": 5}').finished  # before "f" existed


async def test_record_utterance_on_missing_session_raises(store: SessionStore) -> None:
    with pytest.raises(SessionNotFound):
        await store.record_utterance("acme", "nope", 0, "x")


async def test_restore_writes_only_a_missing_record(store: SessionStore) -> None:
    rec = await store.create_session("acme", {"v": 1})
    await store.record_utterance("acme", rec.session_id, 0, "kept")
    local = await store.load_session("acme", rec.session_id)
    assert local is not None
    assert not await store.restore_session(local)  # present: untouched
    await store.client.flushall()  # what a Redis restart without persistence looks like
    assert await store.restore_session(local)
    back = await store.load_session("acme", rec.session_id)
    assert back is not None
    assert (back.config, back.next_utterance, [e.text for e in back.spoken]) == ({"v": 1}, 1, ["kept"])
    assert await store.client.pttl(keys.spoken("acme", rec.session_id)) > 0


async def test_delete_session_removes_record_log_and_lease(store: SessionStore) -> None:
    rec = await store.create_session("acme", {})
    await store.record_utterance("acme", rec.session_id, 0, "x")
    await store.acquire_lease("acme", rec.session_id)
    assert await store.delete_session("acme", rec.session_id)
    assert await all_keys(store) == []


async def test_every_key_is_prefixed_and_only_voices_lack_a_ttl(store: SessionStore) -> None:
    from sessions import Voice

    rec = await store.create_session("acme", {})
    await store.record_utterance("acme", rec.session_id, 0, "x")
    await store.acquire_lease("acme", rec.session_id)
    await store.acquire_stream("acme", 4)
    await store.put_voice("acme", Voice("v1", ref_audio=b"RIFF"))
    found = sorted(k.decode() for k in await all_keys(store))
    assert len(found) == 7  # record, spoken log, lease, streams, voice, voice index, voice sizes
    for k in found:
        assert k.startswith("voxgate:v1:{acme}:")
        ttl = await store.client.pttl(k)
        assert (ttl == -1) if (":voice" in k) else (ttl > 0), (k, ttl)
