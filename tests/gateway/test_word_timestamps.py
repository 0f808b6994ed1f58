"""Word timings and what the listener heard, on a real server with the Piper voice (issue 18):
`audio.words` before (or with) the audio that speaks them, monotone, inside the utterance's audio,
covering every committed word; none without `word_timestamps`; `input.cancel {played_ms}` answered with
`heard_text` cut at a word boundary; vLLM-Omni's `audio.chunk` shape for its clients."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import call, open_session, until, utterance

from engine.words import words
from gateway.settings import Limits

TEXT = "Hello there, how are you today? I paid $5 for two apples. Thanks!"


@pytest.fixture(scope="module")
def gateway(piper_engine: Any) -> Iterator[str]:
    yield from serve(piper_engine, Limits(config_timeout=5.0))


def _ms(nbytes: int, rate: int) -> float:
    return nbytes / 2 * 1000 / rate


async def _timed_utterance(addr: str, rate: int | None) -> tuple[list[tuple[float, dict[str, Any]]], float, list[dict]]:
    """(each audio.words event with the ms of audio received before it, the utterance's audio ms, events)."""
    config: dict[str, Any] = {"word_timestamps": True} | ({"sample_rate": rate} if rate else {})
    ws, ready = await open_session(addr, **config)
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        received, timed, events = 0, [], []
        while True:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                received += len(m)
                continue
            ev = json.loads(m)
            events.append(ev)
            if ev["type"] == "audio.words":
                timed.append((_ms(received, ready["sample_rate"]), ev))
            if ev["type"] in ("session.done", "error"):
                return timed, _ms(received, ready["sample_rate"]), events


@pytest.mark.parametrize("rate", [None, 16000])
async def test_words_come_before_their_audio_monotone_inside_it_covering_every_word(gateway: str,
                                                                                    rate: int | None) -> None:
    timed, total_ms, events = await _timed_utterance(gateway, rate)
    assert events[-1]["type"] == "session.done", events
    committed = [e for e in events if e["type"] == "segment.committed"]
    expected = [(w, c["segment_index"]) for c in committed for w in words(c["text"])]
    got = [(w["word"], w["segment_index"]) for _, ev in timed for w in ev["words"]]
    assert got == expected  # every committed word, as the client wrote it ("5" of "$5"), once, in order
    assert all(ev["estimated"] is False for _, ev in timed)  # Piper's own durations
    last = 0
    for before_ms, ev in timed:
        for w in ev["words"]:
            assert last <= w["start_ms"] <= w["end_ms"] <= total_ms + 1, (w, total_ms)
            # Sent before (or with) the audio that holds it: none of its audio had come yet.
            assert w["start_ms"] >= before_ms - 1 or w["start_ms"] == w["end_ms"], (w, before_ms)
            last = w["start_ms"]
    spoken = [w for _, ev in timed for w in ev["words"] if w["word"] in ("Hello", "apples", "Thanks")]
    assert all(w["end_ms"] - w["start_ms"] >= 150 for w in spoken), spoken  # real spans, not points


async def test_no_timing_events_without_the_flag(gateway: str) -> None:
    ws, _ = await open_session(gateway)
    async with ws:
        events, binary = await utterance(ws, "Hello there. How are you?")
    kinds = {e["type"] for e in events}
    assert "session.done" in kinds and binary and not kinds & {"audio.words", "audio.chunk"}


async def _cancel_after(addr: str, played_ms: float, *, http: bool = False,
                        **config: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Speak TEXT, cancel with `played_ms` once that much audio came (`http`: through POST
    /v1/sessions/{id}/cancel, the cross-replica path): (events before, audio.cancelled)."""
    ws, ready = await open_session(addr, **config)
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        received, events = 0, []
        while _ms(received, ready["sample_rate"]) < played_ms + 300:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                received += len(m)
            else:
                events.append(json.loads(m))
        if http:
            path = f"/v1/sessions/{ready['session_id']}/cancel"
            status, _ = await asyncio.to_thread(call, addr, "POST", path, None, {"played_ms": played_ms})
            assert status == 202
        else:
            await ws.send(json.dumps({"type": "input.cancel", "played_ms": played_ms}))
        while True:
            m = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(m, str) and (ev := json.loads(m))["type"] == "audio.cancelled":
                return events, ev
            if isinstance(m, str):
                events.append(ev)


@pytest.mark.parametrize("http", [False, True], ids=["input.cancel", "POST cancel"])
async def test_cancel_with_played_ms_reports_the_text_heard_cut_at_a_word(gateway: str, http: bool) -> None:
    played = 1500.0
    events, cancelled = await _cancel_after(gateway, played, http=http, word_timestamps=True)
    timed = [w for e in events if e["type"] == "audio.words" for w in e["words"]]
    heard = [w["word"] for w in timed if (w["start_ms"] + w["end_ms"]) / 2 <= played]
    assert heard and len(heard) < len(timed)  # mid-utterance
    # Piper may have sent the whole reply before the cancel came (cancelled: false); what was heard of it
    # is reported all the same.
    assert cancelled["heard_estimated"] is False
    assert words(cancelled["heard_text"]) == heard  # exactly the words played, at a word boundary
    assert TEXT.startswith(cancelled["heard_text"]) and cancelled["spoken_text"].startswith(cancelled["heard_text"])


async def test_a_cancel_posted_with_nothing_active_is_answered_on_the_socket(gateway: str) -> None:
    """As input.cancel is: a client waiting for the acknowledgement of a cross-replica cancel must not hang."""
    ws, ready = await open_session(gateway)
    async with ws:
        status, _ = await asyncio.to_thread(call, gateway, "POST", f"/v1/sessions/{ready['session_id']}/cancel",
                                            None, {"played_ms": 100.0})  # fmt: skip
        assert status == 202
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert answer["type"] == "audio.cancelled" and answer["cancelled"] is False, answer


async def test_without_timings_the_heard_text_is_estimated_and_says_so(gateway: str) -> None:
    events, cancelled = await _cancel_after(gateway, 1500.0)
    assert not any(e["type"] == "audio.words" for e in events)
    assert cancelled["heard_estimated"] is True
    heard = cancelled["heard_text"]
    assert heard and TEXT.startswith(heard) and len(heard) < len(TEXT)
    assert words(heard) == words(TEXT)[: len(words(heard))]  # whole words


async def test_a_cancel_without_played_ms_says_nothing_of_hearing(gateway: str) -> None:
    ws, _ = await open_session(gateway)
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.cancel"}))
        (ev,) = [e for e in await until(ws, "audio.cancelled") if e["type"] == "audio.cancelled"]
    assert "heard_text" not in ev and "heard_estimated" not in ev


async def test_vllm_omni_clients_get_audio_chunks_with_the_timestamps_last(gateway: str) -> None:
    config = {"task_type": "CustomVoice", "stream_audio": True, "response_format": "pcm", "word_timestamps": True}
    ws, ready = await open_session(gateway, **config)
    async with ws:
        events, binary = await utterance(ws, "Hello there. How are you?")
    assert not binary  # the audio travels in audio.chunk messages instead
    start = next(e for e in events if e["type"] == "audio.start")
    chunks = [e for e in events if e["type"] == "audio.chunk"]
    assert start["word_timestamps"] is True and len(chunks) >= 2
    *live, last = chunks
    assert all(c["timestamps"] is None and c["audio_b64"] for c in live)
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    audio_ms = _ms(sum(len(base64.b64decode(c["audio_b64"])) for c in live), ready["sample_rate"])
    assert last["audio_b64"] == "" and last["chunk_start_ms"] == 0 and abs(last["chunk_end_ms"] - audio_ms) <= 1
    assert [w["word"] for w in last["timestamps"]] == ["Hello", "there", "How", "are", "you"]
    assert all(0 <= w["start_ms"] <= w["end_ms"] <= last["chunk_end_ms"] for w in last["timestamps"])
    done = next(e for e in events if e["type"] == "audio.done")
    assert events.index(last) < events.index(done)


async def test_a_contexts_audio_chunks_carry_its_context_id(gateway: str) -> None:
    """vLLM-Omni's audio.chunk messages bypass the event path (they are audio, purged on a cancel): each
    is stamped with its context as every other event of the utterance is."""
    config = {"task_type": "CustomVoice", "stream_audio": True, "response_format": "pcm", "word_timestamps": True}
    ws, _ = await open_session(gateway, **config)
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there.", "context_id": "turn-1"}))
        await ws.send(json.dumps({"type": "input.done", "context_id": "turn-1"}))
        events = []
        while not events or events[-1]["type"] != "session.done":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
    chunks = [e for e in events if e["type"] == "audio.chunk"]
    assert len(chunks) >= 2 and all(c.get("context_id") == "turn-1" for c in chunks), chunks
    assert all(e.get("context_id") == "turn-1" for e in events), events


def test_the_engine_words_are_matched_back_to_the_committed_text() -> None:
    """A word the normaliser rewrote ("$5" → "five dollars") takes the span of what was said for it;
    the heard text ends after the last word half played, with its comma."""
    from gateway.words import UtteranceWords

    w = UtteranceWords()
    spoken = [("I", 0, 100), ("paid", 100, 300), ("five", 300, 500), ("dollars", 500, 800), ("ok", 900, 1000)]
    out = w.timed(0, "I paid $5, ok?", spoken)
    assert [(x.word, x.start_ms, x.end_ms) for x in out] == [("I", 0, 100), ("paid", 100, 300), ("5", 300, 800),
                                                               ("ok", 900, 1000)]  # fmt: skip
    assert w.heard(650, ["I paid $5, ok?"]) == ("I paid $5,", False)
    assert w.heard(0, ["I paid $5, ok?"]) == ("", False)


def test_without_engine_timings_a_segment_is_estimated_over_the_audio_it_got() -> None:
    from gateway.words import UtteranceWords

    w = UtteranceWords()
    out = w.marked(0, "Hello there friend. ", 0.0)
    assert [x.word for x in out] == ["Hello", "there", "friend"] and out[0].start_ms == 0
    w.sent_ms = 1000.0  # its audio, all sent: the heard cut spreads the words over it
    assert w.heard(500, ["Hello there friend. "]) == ("Hello there", True)


def test_a_committed_segment_that_got_no_audio_still_gets_its_words() -> None:
    """The tiny model sometimes ends a segment at once (no audio, no mark): its words must still be
    given (points at the end), or the vLLM-Omni client's last chunk and `audio.words` leave them out."""
    from gateway.words import UtteranceWords

    w = UtteranceWords()
    for i, text in enumerate(["Hello world. ", "How are you? ", "I am fine. "]):
        w.committed(i, text)
    out = w.marked(0, "Hello world. ", 0.0)
    out += w.marked(2, "I am fine. ", 900.0)  # segment 1 never sounded
    out += w.close_before(None)
    assert [x.word for x in out] == ["Hello", "world", "How", "are", "you", "I", "am", "fine"]
    assert [x.segment_index for x in out] == [0, 0, 1, 1, 1, 2, 2, 2]
    starts = [x.start_ms for x in out]
    assert starts == sorted(starts)
