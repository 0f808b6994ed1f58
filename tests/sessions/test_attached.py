"""AttachedSession: the gateway's one-call open/resume/close of a session for a connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions import SessionBusy, SessionNotFound, SessionStore

from .conftest import MakeStore


async def _next(agen: object, timeout: float = 2.0) -> object:
    return await asyncio.wait_for(agen.__anext__(), timeout)  # type: ignore[attr-defined]


async def test_session_started_on_a_resumes_on_b_with_config_and_counters(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    first = await a.attach("acme", config={"language": "en"}, voice="anna")
    first.record_utterance(0, "Hello.")
    first.record_utterance(1, "Good", cancelled=True)
    await first.close()  # waits for its queued writes before giving the lease up
    async with await b.attach("acme", session_id=first.session_id, config={"ignored": True}) as again:
        assert again.resumed
        r = again.record
        assert (r.config, r.voice, r.next_utterance, r.completed, r.cancelled) == ({"language": "en"}, "anna", 2, 1, 1)
        assert [e.text for e in r.spoken] == ["Hello.", "Good"]
        assert r.owner_replica == "b"


async def test_resume_of_unknown_or_foreign_session_is_not_found(store: SessionStore) -> None:
    s = await store.attach("acme")
    with pytest.raises(SessionNotFound):
        await store.attach("other", session_id=s.session_id)
    with pytest.raises(SessionNotFound):
        await store.attach("acme", session_id="never-made")
    await s.close()


async def test_takeover_ends_the_old_connections_events(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    old = await a.attach("acme")
    old_events = old.events()
    await b.publish_cancel("acme", old.session_id)
    assert (await _next(old_events)).kind == "cancel"  # type: ignore[attr-defined]
    new = await b.attach("acme", session_id=old.session_id)
    msg = await _next(old_events)
    assert (msg.kind, msg.target) == ("takeover", old.lease.token)  # type: ignore[attr-defined]
    with pytest.raises(StopAsyncIteration):
        await _next(old_events)
    await old.close()  # releasing after a takeover leaves the new owner's lease alone
    assert await b.lease_holder("acme", new.session_id) == new.lease.token
    await new.close()


async def test_lost_lease_without_a_message_is_reported_as_takeover(store: SessionStore) -> None:
    s = await store.attach("acme")
    events = s.events()
    await store.client.set(f"voxgate:v1:{{acme}}:session:{s.session_id}:lease", "someone-else")
    msg = await _next(events)  # found by the keep-alive within a renewal period (0.2 s)
    assert (msg.kind, msg.sender) == ("takeover", "")  # type: ignore[attr-defined]
    await s.close()


async def test_refuse_policy_leaves_nothing_held(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b", takeover="refuse")
    s = await a.attach("acme")
    with pytest.raises(SessionBusy):
        await b.attach("acme", session_id=s.session_id)
    assert await a.lease_holder("acme", s.session_id) == s.lease.token
    await s.close()
    assert await a.lease_holder("acme", s.session_id) is None
    async with await b.attach("acme", session_id=s.session_id):
        pass


async def test_update_is_applied_at_once_and_written_behind(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    async with await a.attach("acme", config={"language": "en"}) as s:
        s.update(config={"language": "zh"}, voice="mei")
        assert (s.record.config, s.record.voice) == ({"language": "zh"}, "mei")
        assert await a.write_behind.flush(2.0)
        got = await b.load_session("acme", s.session_id)
        assert got is not None and (got.config, got.voice) == ({"language": "zh"}, "mei")


async def test_records_falling_due_together_go_in_one_pipeline_in_order_and_a_gone_session_is_refused_alone(
    make_store: MakeStore,
) -> None:
    store = await make_store("a", lease_ttl_s=60.0)  # no renewal restores the deleted record meanwhile
    batches: list[int] = []
    run = store.write_behind._run_batch
    assert run is not None

    async def counted(calls: Any) -> Any:
        batches.append(len(calls))
        return await run(calls)

    store.write_behind._run_batch = counted
    sessions = [await store.attach("acme") for _ in range(4)]
    await store.write_behind.flush(5.0)
    gone = sessions[1]
    assert await store.delete_session("acme", gone.session_id)
    dropped = store.write_behind.dropped
    for i, s in enumerate(sessions):  # queued all at once: the flusher runs after
        s.begin_utterance(0)
        s.record_utterance(0, f"Hello {i}.")
        s.begin_utterance(1)
    assert await store.write_behind.flush(5.0)
    if store.backend != "cluster":  # a cluster's keys live on several nodes: one call each there
        assert batches == [12], batches
    assert store.write_behind.dropped - dropped == 3  # the gone session's three writes, refused; no others
    for i, s in enumerate(sessions):
        if s is gone:
            continue
        rec = await store.load_session("acme", s.session_id)
        assert rec is not None
        logged = [(e.utterance_index, e.text, e.finished) for e in rec.spoken]
        assert logged == [(0, f"Hello {i}.", True), (1, "", False)], logged
        assert rec.next_utterance == 2
    for s in sessions:
        await s.close()
