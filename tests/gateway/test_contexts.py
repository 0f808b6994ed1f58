"""Several contexts on one socket (issue 18): `context_id` on input.text/input.done/input.cancel, echoed by
every event of the context; contexts play in order, a cancel of one leaves the others alone, and the
number open at once is bounded. Against a real gateway with the Piper voice."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from attack import run
from support.wsclient import open_session, utterance

UTTERANCE_EVENTS = {"segment.committed", "audio.start", "audio.mark", "audio.done", "session.done",
                    "audio.cancelled", "audio.waiting", "audio.words"}  # fmt: skip


async def send(ws: Any, kind: str, context_id: str | None = None, **fields: Any) -> None:
    msg = {"type": kind, **fields} | ({} if context_id is None else {"context_id": context_id})
    await ws.send(json.dumps(msg))


async def events_until(ws: Any, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 60) -> list[Any]:
    """Everything the socket sends (events decoded, audio as bytes) until `done(events)` holds."""
    got: list[Any] = []
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not done(events):
            m = await ws.recv()
            if isinstance(m, str):
                events.append(json.loads(m))
                m = events[-1]
            got.append(m)
    return got


def finished(*contexts: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda evs: all(any(e["type"] in ("session.done", "audio.cancelled") and e.get("context_id") == c
                               for e in evs) for c in contexts)  # fmt: skip


def audio_by_context(stream: list[Any]) -> dict[str | None, int]:
    """Audio bytes per context: binary frames belong to the utterance whose audio.start came last."""
    owner, sizes = None, {}
    for m in stream:
        if isinstance(m, bytes):
            sizes[owner] = sizes.get(owner, 0) + len(m)
        elif m["type"] == "audio.start":
            owner = m.get("context_id")
    return sizes


async def test_two_contexts_interleaved_keep_their_text_and_play_in_order(gateway: str) -> None:
    ws, ready = await open_session(gateway)
    assert "context_id" not in ready
    await send(ws, "input.text", "a", text="The first context says hello ")
    await send(ws, "input.text", "b", text="and the second one answers ")
    await send(ws, "input.text", "a", text="to everyone here.")
    await send(ws, "input.text", "b", text="right after it.")
    await send(ws, "input.done", "b")
    await send(ws, "input.done", "a")
    stream = await events_until(ws, finished("a", "b"))
    events = [m for m in stream if isinstance(m, dict)]
    for e in events:
        if e["type"] in UTTERANCE_EVENTS:
            assert e.get("context_id") in ("a", "b"), e
    by = {c: [e for e in events if e.get("context_id") == c] for c in ("a", "b")}
    text = {c: "".join(e["text"] for e in by[c] if e["type"] == "segment.committed") for c in by}
    assert text == {"a": "The first context says hello to everyone here.",
                    "b": "and the second one answers right after it."}  # fmt: skip
    index = {c: {e["utterance_index"] for e in by[c]} for c in by}
    assert len(index["a"]) == len(index["b"]) == 1 and index["a"] != index["b"], index
    # In order: a began first, so all of a's audio is sent before b's starts (b synthesised meanwhile).
    kinds = [(e["type"], e.get("context_id")) for e in events]
    assert kinds.index(("session.done", "a")) < kinds.index(("audio.start", "b")), kinds
    sizes = audio_by_context(stream)
    assert sizes.get("a", 0) > 9600 and sizes.get("b", 0) > 9600 and None not in sizes, sizes
    # The default context is the session as before: no context_id anywhere.
    plain, audio = await utterance(ws, "Back to no context at all.")
    assert plain[-1]["type"] == "session.done" and audio
    assert all("context_id" not in e for e in plain), plain
    await ws.close()


async def test_cancelling_one_context_leaves_the_others_alone(gateway: str) -> None:
    ws, _ = await open_session(gateway)
    long = "This context speaks for a good while, sentence after sentence, so it is still playing. " * 3
    await send(ws, "input.text", "a", text=long)
    await send(ws, "input.done", "a")
    await send(ws, "input.text", "b", text="The second context is next in line.")
    await send(ws, "input.done", "b")
    await send(ws, "input.text", "c", text="The third context waits behind them both.")
    await send(ws, "input.done", "c")
    started = await events_until(ws, lambda evs: any(e["type"] == "audio.start" for e in evs))
    assert started[-1]["context_id"] == "a"
    await send(ws, "input.cancel", "b")  # queued behind a: cancelled, while a goes on
    stream = started + await events_until(ws, finished("a", "b", "c"))
    events = [m for m in stream if isinstance(m, dict)]
    cancelled = [e for e in events if e["type"] == "audio.cancelled"]
    assert [(e["context_id"], e["cancelled"]) for e in cancelled] == [("b", True)], cancelled
    assert not [e for e in events if e.get("context_id") == "b" and e["type"] == "audio.start"]
    done = [e["context_id"] for e in events if e["type"] == "session.done"]
    assert done == ["a", "c"], done  # a spoke to its end, then c: the order kept
    sizes = audio_by_context(stream)
    of_c = [e for e in events if e.get("context_id") == "c"]
    assert sizes.get("a", 0) > 5 * 24000 * 2 and sizes.get("c", 0) > 9600, (sizes, of_c)  # a not cut
    # A cancel of a context with nothing active is answered for that context.
    await send(ws, "input.cancel", "b")
    late = (await events_until(ws, lambda evs: any(e["type"] == "audio.cancelled" for e in evs)))[-1]
    assert late["context_id"] == "b" and late["cancelled"] is False, late
    await ws.close()


async def test_cancelling_the_playing_context_lets_the_next_one_play(gateway: str) -> None:
    ws, _ = await open_session(gateway)
    await send(ws, "input.text", "a", text="This context is cut off while it speaks, so it never ends. " * 3)
    await send(ws, "input.done", "a")
    await send(ws, "input.text", "b", text="The next context speaks in full.")
    await send(ws, "input.done", "b")
    started = await events_until(ws, lambda evs: any(e["type"] == "audio.start" for e in evs))
    await send(ws, "input.cancel", "a")
    stream = await events_until(ws, finished("a", "b"))
    events = [m for m in stream if isinstance(m, dict)]
    kinds = [(e["type"], e.get("context_id")) for e in events]
    order = [kinds.index(k) for k in (("audio.cancelled", "a"), ("audio.start", "b"), ("session.done", "b"))]
    assert order == sorted(order), kinds
    assert ("session.done", "a") not in kinds and started[-1]["context_id"] == "a"
    assert audio_by_context(stream[kinds.index(("audio.start", "b")) :]).get("b", 0) > 9600
    await ws.close()


async def test_contexts_are_bounded_with_an_error_naming_the_one_refused(gateway: str) -> None:
    ws, _ = await open_session(gateway)
    for i in range(5):  # Limits.max_contexts, like ElevenLabs
        await send(ws, "input.text", f"c{i}", text=f"Context {i} is open, and ")
    await send(ws, "input.text", "c5", text="one too many.")
    err = (await events_until(ws, lambda evs: any(e["type"] == "error" for e in evs)))[-1]
    assert err["code"] == "too_many_contexts" and err["context_id"] == "c5" and err["rejected_chars"] == 13, err
    # The session goes on: a cancel of every context closes them, and the next one opens.
    await send(ws, "input.cancel")
    await events_until(ws, lambda evs: sum(e["type"] == "audio.cancelled" for e in evs) == 5)
    await send(ws, "input.text", "c5", text="Now there is room for me.")
    await send(ws, "input.done", "c5")
    stream = await events_until(ws, finished("c5"))
    assert stream[-1]["type"] == "session.done" and audio_by_context(stream).get("c5", 0) > 9600
    await ws.close()


@pytest.mark.parametrize("context_id", ["", "x" * 129, 7])
async def test_a_bad_context_id_is_an_error_and_the_session_goes_on(gateway: str, context_id: object) -> None:
    ws, _ = await open_session(gateway)
    await ws.send(json.dumps({"type": "input.text", "text": "Hi.", "context_id": context_id}))
    err = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert err["type"] == "error" and err["code"] == "invalid_message" and "context_id" in err["message"], err
    events, _ = await utterance(ws, "Still here.")
    assert events[-1]["type"] == "session.done"
    await ws.close()


async def test_a_context_flood_is_refused_and_the_canary_keeps_speaking(
    gateway: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="voxgate.ws"):
        r = await run(f"http://{gateway}", "context_flood", sockets=3, contexts=100, seconds=2.5)
    # Clients leaving while they are sent to are clients leaving, not failures of the server.
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text[-2000:]
    assert r.seen["too_many_contexts"] >= 3 * (100 - 5), r.seen  # every context past the bound was refused
    # Open contexts holding admitted streams while the canary waits are finished early (utterance_timeout);
    # the flood's streams opened together that could not be heard within the first-audio SLO are refused
    # (queue_full).
    assert set(r.seen["codes"]) <= {"too_many_contexts", "backlog_full", "utterance_timeout", "queue_full"}, r.seen
    assert r.canary.failure is None and not r.canary.errors, r.canary
    assert r.canary.worst_wait_s < 5.0, r.canary
    assert r.health_worst_s < 1.0 and r.rss_growth_mb < 150, r
