"""Admission at a real gateway (Piper, loopback, real clients): waiting in turn, bounded waits refused with
`queue_full` on the WebSocket and 429 on HTTP, cancels that withdraw, weighted tenants from a keys file.

The gateways admit one stream at a time (`max_active_streams=1`), so a session that holds an open
utterance (text committed, no input.done) holds the engine and the others queue behind it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from attack import run
from support.servers import serve
from support.wsclient import open_session, until

from engine import AudioChunk, Capacity, Engine, StreamEnd, StreamEvent, Waiting
from gateway.admission import Admission, QueueFull
from gateway.connection import Limits
from gateway.playback import Playback
from gateway.queued_stream import TicketedStream, spoken_language
from gateway.settings import Settings, load_settings
from sessions import ApiKeys, hash_api_key

KEYS = {"acme": "key-acme", "beta": "key-beta", "gamma": "key-gamma", "canary": "key-canary"}
WEIGHTS = {"acme": 2.0, "beta": 1.0, "gamma": 1.0, "canary": 1.0}


def keys_file(directory: Path) -> Path:
    path = directory / "keys.json"
    tenants = {t: {"key_sha256": [hash_api_key(k)], "weight": WEIGHTS[t]} for t, k in KEYS.items()}
    path.write_text(json.dumps({"tenants": tenants}))
    return path


def gateway_with(engine: Engine, directory: Path, **settings: Any) -> Iterator[str]:
    # The tests hold the one stream with an open utterance (`hold`): keep the pressure rule, which would
    # finish it after 2 s while others wait, out of the way (tests/gateway/test_hardening.py covers it).
    limits = Limits(utterance_idle_timeout=20.0, utterance_idle_under_pressure=20.0)
    # The waits these tests make are long by design: the first-audio SLO (tests/gateway/test_overload_slo.py)
    # would refuse them at once.
    settings.setdefault("first_audio_slo_s", 0.0)
    yield from serve(engine, limits, api_keys=str(keys_file(directory)), max_active_streams=1, **settings)


@pytest.fixture(scope="module")
def gateway(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("admission")
    # continuation_lead_s: a session's next utterance counts as due however much audio it has left (the
    # test cannot time a listener's last seconds on a loaded box)
    yield from gateway_with(piper_engine, directory, max_waiting_per_tenant=1, max_waiting_per_model=2,
                            max_queue_wait_s=20.0, continuation_lead_s=60.0)  # fmt: skip


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on the CPU voices' Piper (English) and Kokoro (Mandarin), their costs held where a busy
    2-core box has them: Kokoro 1.2 worker-seconds per audio second, Piper 0.1, and two workers promising
    1.6. Counted as streams at the mixed cost (Kokoro's), that is one stream."""
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    from engine import load_engine

    engine = load_engine("cpu", workers=2)
    limits = Limits(utterance_idle_timeout=20.0, utterance_idle_under_pressure=20.0)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine.meter, "_rtf", {"piper": 0.1, "kokoro": 1.2})
            patch.setattr(engine.meter, "_share", {"piper": 0.0, "kokoro": 1.0})
            patch.setattr(engine.meter, "record", lambda *a: None)  # keep the busy box's costs
            assert engine.capacity().streams == 1
            yield from serve(engine, limits, model="cpu", api_keys=str(keys_file(tmp_path_factory.mktemp("mixed"))),
                             max_active_streams=8, max_queue_wait_s=30.0, first_audio_slo_s=0.0)  # fmt: skip
    finally:
        engine.close()


@pytest.fixture(scope="module")
def impatient(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("impatient")
    yield from gateway_with(piper_engine, directory, max_waiting_per_tenant=4, max_queue_wait_s=1.0)


@pytest.fixture(scope="module")
def shared(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("shared")
    yield from gateway_with(piper_engine, directory, max_waiting_per_tenant=4, max_waiting_per_model=16,
                            max_queue_wait_s=30.0)  # fmt: skip


async def send(ws: Any, type_: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": type_, **fields}))


async def hold(addr: str, tenant: str) -> Any:
    """A session of `tenant` whose open utterance holds the one stream: its audio has begun, and its
    stream stays open until it sends input.done (`let_go`)."""
    ws, ready = await open_session(addr, KEYS[tenant])
    assert ready["type"] == "session.ready", ready
    await send(ws, "input.text", text="I am holding the engine for a moment. ")
    await until(ws, "audio.start")
    return ws


async def let_go(ws: Any) -> None:
    await send(ws, "input.done")
    await until(ws, "session.done")
    await ws.close()


async def ask(addr: str, tenant: str, text: str = "May I speak now, please?") -> Any:
    ws, ready = await open_session(addr, KEYS[tenant])
    assert ready["type"] == "session.ready", ready
    await send(ws, "input.text", text=text)
    await send(ws, "input.done")
    return ws


async def rest(ws: Any, timeout: float = 30) -> tuple[list[dict[str, Any]], int]:
    """Events up to session.done, and the audio bytes that came with them."""
    events, audio = [], 0
    while True:
        m = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(m, bytes):
            audio += len(m)
            continue
        events.append(json.loads(m))
        if events[-1]["type"] == "session.done":
            return events, audio


def first(events: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    return next(e for e in events if e["type"] == type_)


async def test_a_stream_waits_its_turn_hears_why_then_speaks(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    ws = await ask(gateway, "beta")
    before = await until(ws, "audio.waiting")
    waiting = before[-1]
    assert waiting["reason"] == "queue" and waiting["utterance_index"] == 0 and waiting["ahead"] == 0, waiting
    assert "audio.start" not in [e["type"] for e in before]
    time.sleep(0.3)  # held a while, so the wait is measurable
    await let_go(holder)
    events, audio = await rest(ws)
    assert audio > 8000 and not [e for e in events if e["type"] == "error"], events
    done = first(events, "audio.done")
    assert done["error"] is False
    if "timing" in done:  # slice T's record: the wait is counted apart
        assert done["timing"]["queue_wait_ms"] >= 250, done
    await ws.close()


async def test_a_listener_already_hearing_speech_goes_before_a_newcomer(gateway: str) -> None:
    """The next utterance of a session whose audio still plays continues its listener (sentence-mode
    clients send each sentence as an utterance): once due it takes the next free stream before a
    newcomer that waited longer, so the listener hears no gap; the newcomer waits a little longer."""
    speaker, ready = await open_session(gateway, KEYS["beta"])
    assert ready["type"] == "session.ready", ready
    # Long enough that its engine stream is still synthesising when the next utterance asks (a stream
    # that had already ended would have handed its slot to the newcomer, who alone was waiting then).
    first = ("This first sentence is long enough to keep a listener busy for a few seconds while another "
             "client is waiting for its turn. ") * 6
    await send(speaker, "input.text", text=first)
    await until(speaker, "audio.start")  # its audio plays: the listener is hearing speech
    newcomer = await ask(gateway, "gamma")
    await until(newcomer, "audio.waiting")
    await send(speaker, "input.done")
    await send(speaker, "input.text", text="And this is the next sentence.")
    await send(speaker, "input.done")
    order: list[str] = []

    async def start_of(ws: Any, who: str, utterance_index: int) -> None:
        while True:
            m = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(m, str) and (e := json.loads(m))["type"] == "audio.start" and \
                    e["utterance_index"] == utterance_index:
                order.append(who)
                return

    await asyncio.gather(start_of(speaker, "continuation", 1), start_of(newcomer, "newcomer", 0))
    assert order == ["continuation", "newcomer"], order
    await speaker.close()
    await newcomer.close()


async def test_a_sentence_sent_while_the_one_before_waits_starts_with_it(shared: str) -> None:
    """Sentence by sentence at capacity one: both sentences of a session wait behind another tenant's
    stream. When the first is admitted the second starts beside it (its listener hears them one after
    the other), not once the first stream has ended: a short first sentence left the second only its
    fraction of a second to make its first audio, a gap. Both play, in order, whole. A lone "…" between
    them (a sentence splitter's) says nothing and takes no stream: it would have taken the second's place."""
    holder = await hold(shared, "acme")
    speaker, ready = await open_session(shared, KEYS["beta"])
    assert ready["type"] == "session.ready", ready
    first_text = "Doctor Smith is ready for you now, and the room at the end of the hall is free. " * 2
    for text in (first_text, "…", "Please bring your card with you."):
        await send(speaker, "input.text", text=text)
        await send(speaker, "input.done")
    await until(speaker, "audio.waiting")  # they wait behind the holder
    await let_go(holder)
    (events0, audio0), (marks, silence), (events1, audio1) = [await rest(speaker) for _ in range(3)]
    t0, t1 = first(events0, "session.done")["timing"], first(events1, "session.done")["timing"]
    assert first(events0, "audio.start")["utterance_index"] == 0 and audio0 > 0
    assert [e["type"] for e in marks if e["type"] != "segment.committed"] == ["session.done"] and silence == 0
    assert first(events1, "audio.start")["utterance_index"] == 2 and audio1 > 0
    # Admitted together: the second waited about as long as the first, not that plus the first's synthesis.
    assert t1["queue_wait_ms"] - t0["queue_wait_ms"] < t0["synthesis_ms"] / 2, (t0, t1)
    await speaker.close()


@pytest.mark.parametrize(("mandarin", "english"), [("zh", "en"), ("Chinese", "en-US")])
async def test_an_english_reply_starts_beside_a_mandarin_one_where_a_second_mandarin_one_waits(
        mixed: str, mandarin: str, english: str) -> None:  # fmt: skip
    """Admission charges each stream what it costs: a Kokoro stream most of the engine, a Piper one a
    sliver. Counted as streams at the mixed cost, the English reply waited out the whole Mandarin one it
    fitted beside many times over (issue 14: the `cpu` model's en-support gap). A second Mandarin reply
    does not fit and waits its turn; it speaks once the first lets go. A language named by another
    spelling ("en-US", as many clients send it) costs the same: priced as the costliest voice, it waited."""
    holder, ready = await open_session(mixed, KEYS["acme"], voice="jf_gongitsune", language=mandarin)
    assert ready["type"] == "session.ready", ready
    await send(holder, "input.text", text="好的，我正在占用引擎。")
    await until(holder, "audio.start")
    reply, ready = await open_session(mixed, KEYS["beta"], language=english)
    assert ready["type"] == "session.ready", ready
    await send(reply, "input.text", text="Sure, the English answer goes ahead.")
    await send(reply, "input.done")
    events, audio = await rest(reply)
    assert "audio.waiting" not in [e["type"] for e in events] and audio > 8000
    assert first(events, "session.done")["timing"]["queue_wait_ms"] < 1000
    await a_second_mandarin_reply_waits_for(mixed, holder)
    await reply.close()


async def a_second_mandarin_reply_waits_for(addr: str, holder: Any) -> None:
    """A Mandarin reply does not fit beside `holder`'s stream: it waits its turn, and speaks once that
    one lets go."""
    mandarin, ready = await open_session(addr, KEYS["gamma"], voice="jf_gongitsune", language="zh")
    assert ready["type"] == "session.ready", ready
    await send(mandarin, "input.text", text="我也想说话。")
    await send(mandarin, "input.done")
    waiting = (await until(mandarin, "audio.waiting"))[-1]
    assert waiting["reason"] == "queue", waiting
    await let_go(holder)
    events, audio = await rest(mandarin)
    assert audio > 8000 and first(events, "session.done")["timing"]["queue_wait_ms"] > 0
    await mandarin.close()


async def test_an_english_reply_passes_a_waiting_mandarin_one_in_the_room_it_leaves(mixed: str) -> None:
    """One tenant's line (a bench's, a single agent's): a Mandarin reply waits for the Mandarin stream
    ahead of it, and an English reply behind it fits the room it leaves (0.4 of 1.6: Piper's 0.1). It
    starts at once; it had waited out the whole Mandarin stream (English first audio 9 s p50 on `cpu`
    at 1 reply/s). The Mandarin one still starts once the stream it waited for lets go."""
    holder, ready = await open_session(mixed, KEYS["acme"], voice="jf_gongitsune", language="zh")
    assert ready["type"] == "session.ready", ready
    await send(holder, "input.text", text="好的，我正在占用引擎。")
    await until(holder, "audio.start")
    mandarin, ready = await open_session(mixed, KEYS["acme"], voice="jf_gongitsune", language="zh")
    assert ready["type"] == "session.ready", ready
    await send(mandarin, "input.text", text="我也想说话。")
    await send(mandarin, "input.done")
    assert (await until(mandarin, "audio.waiting"))[-1]["reason"] == "queue"
    english = await ask(mixed, "acme", "Sure, the English answer goes ahead.")
    events, audio = await rest(english)
    assert "audio.waiting" not in [e["type"] for e in events] and audio > 8000
    assert first(events, "session.done")["timing"]["queue_wait_ms"] < 1000
    await let_go(holder)
    events, audio = await rest(mandarin)
    assert audio > 8000 and first(events, "session.done")["timing"]["queue_wait_ms"] > 0
    await mandarin.close()
    await english.close()


@pytest.mark.parametrize(("language", "text", "spoken"), [
    ("auto", "Sure, the English answer.", "en"), (None, "好的，我来查一下。", "zh"),
    ("Auto", "Of course，我来查一下。", "zh"),  # vLLM-Omni's clients capitalise it
    (" AUTO ", "Hello.", "en"), ("zh", "Hello.", "zh"),
    ("English", "好的。", "en"), ("zh-CN", "Hello.", "zh"),  # as given, by its canonical name
])
def test_auto_is_read_from_the_text_and_a_language_given_is_kept(language: str | None, text: str,
                                                                 spoken: str) -> None:
    assert spoken_language(language, text) == spoken


async def test_an_auto_language_reply_costs_what_its_text_is_spoken_in(mixed: str) -> None:
    """"auto" is the protocol's default language and OpenAI's clients send none. Priced as the costliest
    voice, an English reply in such a session waited out the Mandarin stream it fitted beside many times
    over; read from its text, it costs Piper's sliver and starts at once, over WS and over HTTP."""
    zh = {"voice": "jf_gongitsune", "language": "zh"}
    holder, ready = await open_session(mixed, KEYS["acme"], **zh)
    assert ready["type"] == "session.ready", ready
    await send(holder, "input.text", text="好的，我正在占用引擎。")
    await until(holder, "audio.start")
    english, ready = await open_session(mixed, KEYS["beta"], language="auto")
    assert ready["type"] == "session.ready", ready
    await send(english, "input.text", text="Sure, the English answer goes ahead.")
    await send(english, "input.done")
    events, audio = await rest(english)
    assert "audio.waiting" not in [e["type"] for e in events] and audio > 8000
    assert first(events, "session.done")["timing"]["queue_wait_ms"] < 1000
    client = openai.OpenAI(base_url=f"http://{mixed}/v1", api_key=KEYS["gamma"], max_retries=0, timeout=20)
    speech = await asyncio.to_thread(client.audio.speech.with_raw_response.create, model="cpu", voice="joe",
                                     input="And the HTTP answer too.", response_format="pcm")  # fmt: skip
    assert int(speech.headers["x-queue-wait-ms"]) < 1000 and len(speech.content) > 8000
    await let_go(holder)
    await english.close()


async def test_an_auto_language_stream_that_turns_to_mandarin_costs_mandarin_from_then_on(mixed: str) -> None:
    """An "auto" reply read as English when it began, admitted at Piper's cost, then speaks Han text: its
    cost is Kokoro's from the next look on. Held at Piper's, a Mandarin stream would be let in beside it
    on a box that keeps one Kokoro stream ahead of its listener."""
    mixed_reply, ready = await open_session(mixed, KEYS["acme"], language="auto")
    assert ready["type"] == "session.ready", ready
    await send(mixed_reply, "input.text", text="Let me check that for you. ")
    await until(mixed_reply, "audio.start")
    await send(mixed_reply, "input.text", text="好的，我来查一下您的订单，请稍等。")
    committed = []
    while not any(re.search("[\u4e00-\u9fff]", e["text"]) for e in committed):
        committed = [e for e in await until(mixed_reply, "segment.committed") if e["type"] == "segment.committed"]
    await a_second_mandarin_reply_waits_for(mixed, mixed_reply)


async def test_past_the_tenant_bound_an_utterance_is_refused_named_and_the_session_goes_on(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    waiter = await ask(gateway, "beta")
    await until(waiter, "audio.waiting")
    refused = await ask(gateway, "beta", "One more from beta. And another sentence.")  # beta's one place is taken
    events, audio = await rest(refused)
    errors = [e for e in events if e["type"] == "error"]
    committed = [e["segment_index"] for e in events if e["type"] == "segment.committed"]
    assert committed == [0, 1]
    for error in errors:  # one, or a second for text committed after the refusal came
        assert error["code"] == "queue_full" and error["bound"] == "tenant", error
        assert error["utterance_index"] == 0 and error["retry_after_s"] >= 1.0, error
        which = ", ".join(map(str, error["segment_indexes"]))
        assert f"segment {which} of utterance 0 will not be spoken" in error["message"], error
    assert sorted(i for e in errors for i in e["segment_indexes"]) == committed, errors  # each named once
    assert audio == 0 and first(events, "audio.done")["error"] is True
    await let_go(holder)
    _, audio = await rest(waiter)
    assert audio > 8000
    # The refused session goes on: its next utterance is admitted and spoken.
    await send(refused, "input.text", text="Now there is room for me.")
    await send(refused, "input.done")
    events, audio = await rest(refused)
    assert audio > 8000 and events[-1]["utterance_index"] == 1 and not [e for e in events if e["type"] == "error"]
    for ws in (waiter, refused):
        await ws.close()


async def test_past_the_model_bound_any_tenant_is_refused(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    waiters = [await ask(gateway, "beta"), await ask(gateway, "gamma")]  # two waiting: the model's bound
    for ws in waiters:
        await until(ws, "audio.waiting")
    refused = await ask(gateway, "acme")  # acme has nobody waiting: the model bound refuses it
    events, _ = await rest(refused)
    error = first(events, "error")
    assert error["code"] == "queue_full" and error["bound"] == "model", error
    await let_go(holder)
    for ws in waiters:
        _, audio = await rest(ws)
        assert audio > 8000
        await ws.close()
    await refused.close()


async def test_a_cancel_while_waiting_withdraws_the_wait(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    for _ in range(3):  # a leaked wait would fill beta's one place: the next would be refused
        ws = await ask(gateway, "beta")
        await until(ws, "audio.waiting")
        await send(ws, "input.cancel")
        cancelled = (await until(ws, "audio.cancelled"))[-1]
        assert cancelled["utterance_index"] == 0 and cancelled["played_bytes"] == 0
        await ws.close()
    last = await ask(gateway, "beta")
    await until(last, "audio.waiting")  # waiting, not refused
    await let_go(holder)
    events, audio = await rest(last)
    assert audio > 8000 and not [e for e in events if e["type"] == "error"], events
    await last.close()


async def test_a_socket_closed_while_waiting_withdraws_the_wait(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    for _ in range(2):
        ws = await ask(gateway, "beta")
        await until(ws, "audio.waiting")
        await ws.close()
    await asyncio.sleep(0.5)  # the server notices the close
    last = await ask(gateway, "beta")
    await until(last, "audio.waiting")
    await let_go(holder)
    _, audio = await rest(last)
    assert audio > 8000
    await last.close()


async def test_a_wait_past_its_bound_is_refused_instead_of_starting_late(impatient: str) -> None:
    holder = await hold(impatient, "acme")
    ws = await ask(impatient, "beta")
    events, audio = await rest(ws, timeout=20)
    kinds = [e["type"] for e in events]
    error = first(events, "error")
    committed = [e["segment_index"] for e in events if e["type"] == "segment.committed"]
    assert error["code"] == "queue_full" and error["bound"] == "wait", error
    assert error["segment_indexes"] == committed and committed, (error, committed)  # every one named
    assert kinds.index("audio.waiting") < kinds.index("error") and audio == 0, kinds
    await let_go(holder)
    await send(ws, "input.text", text="I am back with room to speak.")
    await send(ws, "input.done")
    events, audio = await rest(ws)
    assert audio > 8000 and events[-1]["utterance_index"] == 1
    await ws.close()


async def test_text_sent_after_a_refusal_is_named_too_and_the_utterance_still_ends(impatient: str) -> None:
    holder = await hold(impatient, "acme")
    ws, _ = await open_session(impatient, KEYS["beta"])
    await send(ws, "input.text", text="I will wait for my turn. ")
    events = await until(ws, "error", timeout=20)  # refused after its wait, while still open
    assert events[-1]["bound"] == "wait" and events[-1]["segment_indexes"] == [0], events
    await send(ws, "input.text", text="And then I say a little more.")
    await send(ws, "input.done")
    events, audio = await rest(ws, timeout=10)  # before: no session.done until the utterance timed out
    error = first(events, "error")
    assert error["code"] == "queue_full" and error["bound"] == "wait" and error["segment_indexes"] == [1], error
    assert audio == 0 and events[-1]["utterance_index"] == 0
    await let_go(holder)
    await ws.close()


def raw_speech(addr: str, key: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"model": "piper", "input": "Hello from the queue.", "voice": "joe", "response_format": "pcm"})
    req = urllib.request.Request(f"http://{addr}/v1/audio/speech", body.encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


async def test_http_past_a_bound_is_a_429_with_retry_after_and_openais_body(gateway: str) -> None:
    holder = await hold(gateway, "acme")
    waiter = await ask(gateway, "beta")
    await until(waiter, "audio.waiting")
    status, headers, body = await asyncio.to_thread(raw_speech, gateway, KEYS["beta"])
    assert status == 429, body
    assert int(headers["retry-after"]) >= 1
    error = json.loads(body)["error"]
    assert error["code"] == "queue_full" and error["type"] == "invalid_request_error" and error["message"]

    client = openai.OpenAI(base_url=f"http://{gateway}/v1", api_key=KEYS["beta"], max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        await asyncio.to_thread(client.audio.speech.create, model="piper", voice="joe", input="Hello again.")
    assert e.value.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.code == "queue_full"

    # Once there is room, the same request waits its turn and is answered.
    speech = asyncio.create_task(asyncio.to_thread(raw_speech, gateway, KEYS["gamma"]))
    await asyncio.sleep(0.3)
    await let_go(holder)
    status, _, audio = await speech
    assert status == 200 and len(audio) > 8000
    _, audio_ws = await rest(waiter)
    assert audio_ws > 8000
    await waiter.close()


async def test_an_http_client_that_leaves_while_waiting_gives_its_place_up(gateway: str) -> None:
    """Beta has one place in the line. A speech request that waits and whose client then hangs up must
    give it up at once: else the next beta utterance is refused while nobody waits, and the engine
    later speaks the request to nobody."""
    holder = await hold(gateway, "acme")
    body = json.dumps({"model": "piper", "input": "Hello from the queue.", "voice": "joe", "response_format": "mp3"})
    _, writer = await asyncio.open_connection(*gateway.rsplit(":", 1))
    writer.write((f"POST /v1/audio/speech HTTP/1.1\r\nHost: {gateway}\r\nContent-Type: application/json\r\n"
                  f"Authorization: Bearer {KEYS['beta']}\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    await writer.drain()
    await asyncio.sleep(0.5)  # queued behind the holder
    writer.close()  # the client hangs up while it waits
    await writer.wait_closed()
    await asyncio.sleep(0.5)
    ws = await ask(gateway, "beta")  # beta's one place is free again: waiting, not refused
    assert (await until(ws, "audio.waiting"))[-1]["ahead"] == 0
    await let_go(holder)
    _, audio = await rest(ws)
    assert audio > 8000
    await ws.close()


async def talk(addr: str, tenant: str, seconds: float) -> float:
    """One session of `tenant` speaking utterances back to back for `seconds`: audio seconds heard."""
    ws, ready = await open_session(addr, KEYS[tenant])
    heard, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        await send(ws, "input.text", text="Share the engine fairly, by the weights of the keys.")
        await send(ws, "input.done")
        events, audio = await rest(ws, timeout=60)
        assert not [e for e in events if e["type"] == "error"], events
        heard += audio
    await ws.close()
    return heard / 2 / ready["sample_rate"]  # s16 mono


async def test_two_weighted_tenants_under_saturation_are_both_served(shared: str, tmp_path: Path) -> None:
    keys = ApiKeys.from_file(keys_file(tmp_path))  # the gateway's file: the weights are read from it
    assert {t.name: t.weight for t in keys.tenants} == WEIGHTS
    heard = await asyncio.gather(*(talk(shared, t, 6.0) for t in ["acme"] * 3 + ["beta"] * 3))
    acme, beta = sum(heard[:3]), sum(heard[3:])
    print(f"served audio: acme (weight 2) {acme:.1f} s, beta (weight 1) {beta:.1f} s")
    assert acme > 0 and beta > 0


async def test_a_tenant_flooding_admission_is_refused_and_another_tenant_is_still_served(shared: str) -> None:
    r = await run(shared, "queue_flood", key=KEYS["canary"], flood_key=KEYS["acme"], sockets=8, seconds=5.0)
    print(r)
    assert r.seen.get("error:queue_full:tenant", 0) >= 1, r.seen  # 8 sockets, 4 places
    errors = {k for k in r.seen if k.startswith("error:")}
    assert errors <= {"error:queue_full:tenant", "error:queue_full:model"}, r.seen  # each names its bound
    assert r.seen.get("waiting:queue", 0) >= 1 and r.seen["session.done"] >= 4, r.seen
    c = r.canary
    assert c.failure is None and not c.errors, c
    assert c.worst_wait_s < 6.0, c  # one stream of the flood at most, on a shared 2-core box
    assert r.health_worst_s < 1.0 and set(r.health_statuses) == {"ok"}, r
    assert r.rss_growth_mb < 100, r


async def test_a_tenant_flooding_admission_sentence_by_sentence_is_bounded_too(shared: str) -> None:
    # Each flooding listener sends three sentences at once: two start (the one heard and the next beside
    # it), the third waits or is refused. The canary's tenant is still served in turn.
    r = await run(shared, "queue_flood", key=KEYS["canary"], flood_key=KEYS["acme"], sockets=6, seconds=5.0,
                  sentences=3)  # fmt: skip
    print(r)
    assert r.seen.get("error:queue_full:tenant", 0) >= 1, r.seen  # 18 utterances asking, 4 places
    errors = {k for k in r.seen if k.startswith("error:")}
    assert errors <= {"error:queue_full:tenant", "error:queue_full:model"}, r.seen
    assert r.seen["session.done"] >= 6, r.seen
    c = r.canary
    assert c.failure is None and not c.errors, c
    assert c.worst_wait_s < 6.0, c  # one listener of the flood at most (its two streams heard in turn)
    assert r.health_worst_s < 1.0 and set(r.health_statuses) == {"ok"}, r
    assert r.rss_growth_mb < 100, r


# -- Admission on the event loop, against an engine's capacity() (no server) ---------------------------


class Judged:
    """What admission reads of an engine: only its capacity() (a real engine's moves as it measures)."""

    def __init__(self, streams: int, follows_listener: bool = True, budget: float | None = None,
                 costs: dict[str, float] | None = None, voice_costs: dict[str, float] | None = None,
                 first_audio_s: dict[str, float] | None = None, classes: dict[str, str] | None = None) -> None:
        self.streams = streams
        self.follows_listener = follows_listener
        self.budget = budget
        self.costs = costs or {}
        self.voice_costs = voice_costs or {}
        self.first_audio_s = first_audio_s or {}  # by class of voice
        self.classes = classes or {}  # language → class
        self.fail = False

    def capacity(self) -> Capacity:
        if self.fail:
            raise RuntimeError("no measurement")
        return Capacity(self.streams, 0, follows_listener=self.follows_listener, budget=self.budget,
                        costs=tuple(self.costs.items()), voice_costs=tuple(self.voice_costs.items()),
                        first_audio_s=tuple(self.first_audio_s.items()), language_classes=tuple(self.classes.items()))


async def test_capacity_growing_admits_waiters_without_any_release() -> None:
    engine = Judged(1)
    admission = Admission(engine, Settings(first_audio_slo_s=0, max_active_streams=8))  # type: ignore[arg-type]
    held = await admission.admit("a", 1.0)
    waiting = asyncio.create_task(admission.admit("b", 1.0))
    await asyncio.sleep(0.25)
    assert not waiting.done() and admission.waiting == 1
    engine.streams = 2  # the engine measured it can keep two ahead
    ticket = await asyncio.wait_for(waiting, 1.0)  # the timer looked again
    assert ticket.waited_s >= 0.2 and admission.admitted == 2
    for t in (held, ticket):
        t.release()
        t.release()  # idempotent
    assert admission.admitted == 0
    await admission.close()


async def test_the_setting_caps_the_engine_and_stands_in_when_it_cannot_tell() -> None:
    engine = Judged(100)
    admission = Admission(engine, Settings(max_active_streams=3))  # type: ignore[arg-type]
    assert admission.capacity() == 3
    engine.streams = 0
    assert admission.capacity() == 1  # one stream always has room: never a deadlock
    engine.fail = True
    assert admission.capacity() == 3  # advice that fails is not a stop
    assert Admission(object(), Settings(max_active_streams=5)).capacity() == 5  # type: ignore[arg-type]


async def test_where_the_engine_tells_costs_a_stream_holds_its_languages_cost() -> None:
    # The CPU voices: Kokoro (Mandarin) about ten times Piper (English). An English stream starts beside a
    # Mandarin one that a second Mandarin one waits behind. A voice named costs its own where that is more
    # (one that does not speak the language leaves it to the default); a language or voice the engine did
    # not cost ("auto" among them) costs the costliest: it may be spoken with that voice.
    engine = Judged(1, budget=1.6, costs={"en": 0.1, "zh": 1.2}, voice_costs={"joe": 0.1, "jf_alpha": 1.2})
    admission = Admission(engine, Settings(first_audio_slo_s=0, max_active_streams=8))  # type: ignore[arg-type]
    assert admission.capacity() == 1.6
    assert admission.cost("en") == admission.cost("en", "default") == admission.cost("en", "joe") == 0.1
    assert admission.cost("zh") == admission.cost("en", "jf_alpha") == admission.cost("zh", "joe") == 1.2
    assert admission.cost("auto") == admission.cost("en", "nobody") == admission.cost("fr") == 1.2
    mandarin = await admission.admit("a", 1.0, language="zh")
    english = admission.try_admit("b", 1.0, language="en")
    assert english is not None and admission.load == pytest.approx(1.3)
    assert admission.try_admit("c", 1.0, language="zh") is None
    waiting = asyncio.create_task(admission.admit("c", 1.0, language="zh"))
    await asyncio.sleep(0.05)
    english.release()
    await asyncio.sleep(0.25)  # the timer looked again: 0.1 freed is not room for 1.2
    assert not waiting.done()
    engine.costs["zh"] = engine.voice_costs["jf_alpha"] = 1.55  # the box got busier: Mandarin costs more
    assert admission.try_admit("b", 1.0, language="en") is None  # (c waits: it goes first)
    assert admission.load == pytest.approx(1.55)  # that look held the admitted one at its cost now
    mandarin.release()
    (await asyncio.wait_for(waiting, 1.0)).release()
    engine.costs = engine.voice_costs = {}  # costs untold: a stream fills the budget, one at a time
    assert admission.cost("en") == 1.6
    engine.budget = None  # an engine that counts streams: one each
    assert admission.cost("zh") == 1.0 and admission.capacity() == 1
    await admission.close()


async def test_a_cancelled_wait_is_withdrawn_and_a_wait_past_its_bound_refused() -> None:
    admission = Admission(Judged(1), Settings(first_audio_slo_s=0, max_queue_wait_s=0.3))  # type: ignore[arg-type]
    held = await admission.admit("a", 1.0)
    gone = asyncio.create_task(admission.admit("b", 1.0))
    await asyncio.sleep(0.05)
    gone.cancel()
    await asyncio.sleep(0)
    assert admission.waiting == 0
    with pytest.raises(QueueFull) as e:
        await asyncio.wait_for(admission.admit("b", 1.0), 2.0)
    assert e.value.bound == "wait" and e.value.retry_after_header.isdigit()
    held.release()
    assert (await admission.admit("b", 1.0)).waited_s == 0.0  # room again: at once
    await admission.close()


async def test_with_room_and_nobody_waiting_a_stream_is_admitted_without_waiting_for_the_loop() -> None:
    admission = Admission(Judged(1), Settings(first_audio_slo_s=0))  # type: ignore[arg-type]
    first = admission.try_admit("a", 1.0)
    assert first is not None and first.waited_s == 0.0
    assert admission.try_admit("b", 1.0) is None  # no room: admit() decides (waits or refuses)
    waiting = asyncio.create_task(admission.admit("b", 1.0))
    await asyncio.sleep(0.05)
    first.release()
    assert admission.try_admit("c", 1.0) is None  # room, but b was first: it goes first
    (await waiting).release()
    await admission.close()


async def test_on_a_box_measured_slow_a_stream_the_slo_leaves_no_room_for_is_refused_as_it_asks() -> None:
    # The engine says four streams fit; its leaders were heard 1.0 s after they started alone (twice the
    # prior): beside two of four a stream takes 1.5 s, beside three it would miss the 1.5 s SLO.
    now = [100.0]
    admission = Admission(Judged(4), Settings(first_audio_slo_s=1.5), clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(3):
        alone = admission.try_admit("m", 1.0)
        assert alone is not None
        now[0] += 1.0
        alone.heard()
        alone.release()
    held = [admission.try_admit("a", 1.0) for _ in range(3)]
    assert all(t is not None for t in held)
    assert admission.try_admit("b", 1.0) is None  # the engine has room, the SLO does not
    with pytest.raises(QueueFull) as e:
        admission.enqueue("b", 1.0)
    assert e.value.bound == "slo" and admission.waiting == 0
    assert e.value.args and "first_audio_slo_s" in str(e.value)
    for t in held:
        assert t is not None
        t.release()
    await admission.close()


async def test_a_streams_first_audio_is_forecast_by_its_voice_class_as_the_engine_tells_it() -> None:
    # The engine's cost model: an English (Piper) stream is heard 0.2 s after it starts alone, a Mandarin
    # (Kokoro) one 1.0 s. Beside three of four, only the English one makes the 1.5 s SLO; the Mandarin
    # ones measured slow do not move the English forecast.
    now = [100.0]
    engine = Judged(4, first_audio_s={"piper": 0.2, "kokoro": 1.0}, classes={"en": "piper", "zh": "kokoro"})
    admission = Admission(engine, Settings(first_audio_slo_s=1.5), clock=lambda: now[0])  # type: ignore[arg-type]
    assert admission.first_audio_alone_s() == {"kokoro": 1.0, "piper": 0.2}
    held = [admission.try_admit("a", 1.0, language="en") for _ in range(3)]
    assert all(t is not None for t in held)
    assert admission.try_admit("b", 1.0, language="zh") is None
    with pytest.raises(QueueFull) as e:
        admission.enqueue("b", 1.0, language="zh")
    assert e.value.bound == "slo"
    english = admission.try_admit("b", 1.0, language="en")
    assert english is not None
    for t in [*held, english]:
        assert t is not None
        t.release()
    for _ in range(3):  # Mandarin heard in 3 s alone: Kokoro is slow on this box now
        alone = admission.try_admit("m", 1.0, language="zh")
        assert alone is not None
        now[0] += 3.0
        alone.heard()
        alone.release()
    alone_s = admission.first_audio_alone_s()
    assert alone_s["kokoro"] == pytest.approx(3.0) and alone_s["piper"] == pytest.approx(0.2)
    assert admission.slo_room()["piper"] == 4
    held = [admission.try_admit("a", 1.0, language="en") for _ in range(4)]
    assert all(t is not None for t in held)
    for t in held:
        assert t is not None
        t.release()
    await admission.close()


class Paced:
    """An engine stream as admission's ticket sees it, on a fake clock: its first audio made 0.3 s after
    it opens, then held 3 s for pacing, as the CPU voices hold one whose next text has not come; `says`:
    the engine says so (`Waiting("pacing")`)."""

    def __init__(self, now: list[float], says: bool) -> None:
        self._now, self._says = now, says

    async def events(self) -> AsyncIterator[StreamEvent]:
        self._now[0] += 0.3
        if self._says:
            yield Waiting("pacing")
        self._now[0] += 3.0
        yield AudioChunk(np.zeros(240, np.int16), 24000, 0, 0)
        yield StreamEnd("done")


@pytest.mark.parametrize(("says", "alone_s"), [(True, 0.3), (False, 3.3)])
async def test_a_first_audio_held_for_pacing_is_measured_as_it_was_made_not_as_it_was_let_go(
        says: bool, alone_s: float) -> None:
    # The CPU voices hold a short first sentence's audio until the client's next sentence has come: a
    # wait on the client's text, not this box's speed. Counted in, replies of short sentences made a box
    # heard at 0.3 s read as 3.3 s slow, and admission refused callers it would have served in time.
    now = [100.0]
    engine = Judged(4, first_audio_s={"piper": 0.2}, classes={"en": "piper"})
    admission = Admission(engine, Settings(first_audio_slo_s=1.5), clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(3):
        ticket = admission.try_admit("a", 1.0, language="en")
        assert ticket is not None
        events = [ev async for ev in TicketedStream(Paced(now, says), ticket).events()]  # type: ignore[arg-type]
        assert isinstance(events[-1], StreamEnd) and (Waiting("pacing") in events) == says
    assert admission.first_audio_alone_s()["piper"] == pytest.approx(alone_s)
    await admission.close()


async def test_a_stream_admitted_at_once_while_its_listener_hears_audio_is_not_measured_as_a_leader() -> None:
    # Sentence by sentence: the next sentence's stream is admitted at once while its listener still hears
    # the one before; its first audio is due when that audio runs out (3 s later here), by design. It was
    # taken for a leader (its listener's timeline was told only to a stream that waited), and that 3 s
    # read as this box's time to first audio: the SLO then refused callers the box would serve in time.
    now = [100.0]
    engine = Judged(4, first_audio_s={"piper": 0.2}, classes={"en": "piper"})
    admission = Admission(engine, Settings(first_audio_slo_s=1.5), clock=lambda: now[0])  # type: ignore[arg-type]
    player = Playback()
    player.add(10.0)  # ten seconds of audio sent to it: it hears speech
    for _ in range(3):
        ticket = admission.try_admit("a", 1.0, listener=player, language="en")
        assert ticket is not None
        now[0] += 3.0
        ticket.heard()
        ticket.release()
    assert admission.first_audio_alone_s()["piper"] == pytest.approx(0.2)  # the engine's word: nothing measured
    await admission.close()


async def test_an_utterance_queued_before_its_listener_heard_anything_becomes_a_continuation() -> None:
    # Sentence by sentence: a session's second sentence is queued while its first still waits, so when
    # it asks its listener hears nothing. Once the first sentence plays, the second goes before a
    # newcomer that asked earlier: its listener would otherwise hear a gap.
    admission = Admission(Judged(1), Settings(first_audio_slo_s=0, continuation_lead_s=2.0))  # type: ignore[arg-type]
    held = await admission.admit("a", 1.0)
    listener = Playback()
    newcomer = asyncio.create_task(admission.admit("a", 1.0))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(admission.admit("a", 1.0, listener=listener))
    await asyncio.sleep(0.01)
    listener.add(0.5)  # the first sentence plays now: half a second of it is left
    held.release()
    ticket = await asyncio.wait_for(second, 1.0)
    assert not newcomer.done()
    ticket.release()
    (await asyncio.wait_for(newcomer, 1.0)).release()
    await admission.close()


async def test_a_listeners_next_utterance_starts_beside_the_one_it_hears_and_takes_its_slot() -> None:
    # Sentence by sentence: the next sentence of a session asks while the one before is still made. It
    # starts at once beside it, past the capacity, ahead of another session's newcomer; a third waits
    # (a listener holds at most two) and takes the slot when the first ends. Streams of another
    # listener, or with none (HTTP), never start so.
    admission = Admission(Judged(1), Settings(first_audio_slo_s=0, continuation_lead_s=2.0))  # type: ignore[arg-type]
    player, other = Playback(), Playback()
    player.add(10.0)  # ten seconds of audio sent: far from running dry, so not due
    held = admission.try_admit("a", 1.0, listener=player)
    assert held is not None
    newcomer = asyncio.create_task(admission.admit("b", 1.0, listener=other))
    await asyncio.sleep(0.01)
    following = await asyncio.wait_for(admission.admit("a", 1.0, listener=player), 1.0)
    assert admission.admitted == 2 and following.waited_s < 0.05  # at once
    third = asyncio.create_task(admission.admit("a", 1.0, listener=player))
    unrelated = asyncio.create_task(admission.admit("a", 1.0))  # no listener: waits in turn
    await asyncio.sleep(0.01)
    assert not third.done() and not unrelated.done() and not newcomer.done()
    held.served(8.0)  # "a" has been served more than "b": in fair order "b" would go first
    held.release()
    last = await asyncio.wait_for(third, 1.0)  # the slot passes on within the listener
    await asyncio.sleep(0.01)
    assert admission.admitted == 2 and not newcomer.done() and not unrelated.done()
    following.release()
    last.release()  # nothing of this listener waits: the slot is free, and goes in fair order
    done, _ = await asyncio.wait({newcomer, unrelated}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and admission.admitted == 1
    done.pop().result().release()
    for task in (newcomer, unrelated):
        (await asyncio.wait_for(task, 1.0)).release()
    assert admission.admitted == 0 and admission.waiting == 0
    await admission.close()


@pytest.mark.parametrize("follows_listener", [True, False])
async def test_a_listener_whose_streams_ended_while_it_hears_them_gets_its_next_in_at_once(
    follows_listener: bool,
) -> None:
    # Sentence by sentence, English beside Mandarin on the CPU voices: an English sentence is made in a
    # tenth of the time it plays, so its stream ends and its slot goes; the next sentence then waited in
    # fair order for room behind a Mandarin stream past the capacity, 3 s, a second past its listener
    # running dry (issue 14). Now it takes the slot back as it asks. The Qwen3 core (not
    # `follows_listener`) would run it beside the streams it steps at once: there it waits its turn.
    engine = Judged(1, follows_listener=follows_listener, budget=1.6, costs={"en": 0.1, "zh": 2.0})
    admission = Admission(engine, Settings(first_audio_slo_s=0))  # type: ignore[arg-type]
    english, mandarin = Playback(), Playback()
    first = admission.try_admit("a", 1.0, listener=english, language="en")
    assert first is not None
    english.add(5.0)  # its audio is out: five seconds of it to hear
    first.release()  # made: its stream ended
    costly = admission.try_admit("a", 1.0, listener=mandarin, language="zh")
    assert costly is not None  # alone, it starts, costlier than the whole capacity
    newcomer = asyncio.create_task(admission.admit("a", 1.0, language="en"))  # nobody hears it yet
    await asyncio.sleep(0.01)
    nxt = asyncio.create_task(admission.admit("a", 1.0, listener=english, language="en"))
    await asyncio.sleep(0.2)
    assert nxt.done() is follows_listener and not newcomer.done()
    if follows_listener:
        assert admission.load == pytest.approx(2.1)  # past the capacity: its listener's slot
        nxt.result().release()
        costly.release()
    else:
        costly.release()  # room for both
        (await asyncio.wait_for(nxt, 1.0)).release()
    (await asyncio.wait_for(newcomer, 1.0)).release()
    assert admission.admitted == 0 and admission.waiting == 0
    await admission.close()


async def test_on_an_engine_that_runs_a_listeners_streams_at_once_the_next_waits_for_the_slot() -> None:
    # The Qwen3 core steps every stream it holds from its start: a next sentence beside the one heard
    # would slow every row. There it takes the slot when the one before ends, before anyone else.
    admission = Admission(Judged(1, follows_listener=False), Settings(first_audio_slo_s=0))  # type: ignore[arg-type]
    player, other = Playback(), Playback()
    held = admission.try_admit("a", 1.0, listener=player)
    assert held is not None
    newcomer = asyncio.create_task(admission.admit("b", 1.0, listener=other))
    await asyncio.sleep(0.01)
    following = asyncio.create_task(admission.admit("a", 1.0, listener=player))
    await asyncio.sleep(0.05)
    assert not following.done() and admission.admitted == 1
    held.release()
    ticket = await asyncio.wait_for(following, 1.0)
    assert not newcomer.done()  # the slot passed on within the listener
    ticket.release()
    (await asyncio.wait_for(newcomer, 1.0)).release()
    assert admission.admitted == 0 and admission.waiting == 0
    await admission.close()


def test_admission_settings_load_and_are_checked() -> None:
    env = {"VOXGATE_MAX_ACTIVE_STREAMS": "3", "VOXGATE_MAX_WAITING_PER_TENANT": "2",
           "VOXGATE_MAX_WAITING_PER_MODEL": "9", "VOXGATE_MAX_QUEUE_WAIT_S": "2.5",
           "VOXGATE_CONTINUATION_LEAD_S": "1.5", "VOXGATE_FIRST_AUDIO_SLO_S": "0.8"}  # fmt: skip
    s = load_settings(env=env)
    assert (s.max_active_streams, s.max_waiting_per_tenant, s.max_waiting_per_model, s.max_queue_wait_s,
            s.continuation_lead_s, s.first_audio_slo_s) == (3, 2, 9, 2.5, 1.5, 0.8)  # fmt: skip
    assert Settings().first_audio_slo_s == 1.5  # a voice agent's target, on by default
    for bad in ({"max_active_streams": 0}, {"max_waiting_per_tenant": -1}, {"max_queue_wait_s": 0.0},
                {"first_audio_slo_s": -1.0}, {"first_audio_slo_s": float("nan")},
                {"max_queue_wait_s": float("nan")}, {"continuation_lead_s": -1.0},
                {"continuation_lead_s": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError):
            Settings(**bad)  # type: ignore[arg-type]


def test_weights_come_from_the_keys_file_and_the_spec_form(tmp_path: Path) -> None:
    keys = ApiKeys.from_file(keys_file(tmp_path))
    assert keys.verify(KEYS["acme"]).weight == 2.0 and keys.verify(KEYS["beta"]).weight == 1.0  # type: ignore[union-attr]
    spec = ApiKeys.from_spec(f"acme:2.5={hash_api_key('x')},beta={hash_api_key('y')}")
    assert spec.verify("x").weight == 2.5 and spec.verify("y").weight == 1.0  # type: ignore[union-attr]
    for bad in ("acme:0", "acme:-1", "acme:inf", "acme:two"):
        with pytest.raises(ValueError):
            ApiKeys.from_spec(f"{bad}={hash_api_key('x')}")
    with pytest.raises(ValueError):
        ApiKeys.from_config({"tenants": {"acme": {"key_sha256": [hash_api_key("x")], "weight": True}}})


def test_metrics_show_admission_and_the_engines_load(gateway: str) -> None:
    with urllib.request.urlopen(f"http://{gateway}/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in ("voxgate_admission_waiting", "voxgate_admission_admitted", "voxgate_engine_capacity_streams",
                 "voxgate_engine_active_streams", "voxgate_engine_workers", "voxgate_engine_busy_seconds_total",
                 "voxgate_admission_load", "voxgate_engine_capacity_budget",
                 "voxgate_admission_first_audio_alone_seconds", "voxgate_admission_slo_room"):
        assert re.search(rf"^{name}[ {{]", text, re.M), name  # labelled by model
    # Per class of voice: the piper model's one voice is Piper's (the engine's word, or what this box measured).
    alone = re.search(r'^voxgate_admission_first_audio_alone_seconds\{model="piper",voice_class="piper"\} (\S+)$',
                      text, re.M)
    assert alone is not None and 0 < float(alone.group(1)) < 60, alone
