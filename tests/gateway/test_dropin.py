"""The providers' protocols (gateway/protocols/): ElevenLabs' stream-input and multi-stream-input sockets
and Cartesia's /tts/websocket, with their HTTP routes, against a real gateway on loopback with the Piper
voice, spoken to by a real `websockets` client in the providers' published message shapes."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import websockets
from attack import run
from support.servers import serve
from support.undisturbed import assert_undisturbed

from engine import Engine
from gateway.connection import Limits
from sessions import hash_api_key

Message = dict[str, Any]


def el_url(gateway: str, path: str = "multi-stream-input", voice: str = "joe", **query: str) -> str:
    query = {"output_format": "pcm_16000", "model_id": "eleven_flash_v2_5"} | query
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"ws://{gateway}/v1/text-to-speech/{voice}/{path}?{q}"


async def until(ws: Any, done: Callable[[list[Message]], bool], timeout: float = 60) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(timeout):
        while not done(got):
            got.append(json.loads(await ws.recv()))
    return got


def final(context_id: str | None = None) -> Callable[[list[Message]], bool]:
    return lambda got: any(m.get("isFinal") is True and m.get("contextId") == context_id for m in got)


def audio_of(got: list[Message], context_id: str | None = None) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in got if m.get("audio") and m.get("contextId") == context_id)


def heard_words(got: list[Message], context_id: str | None = None) -> list[tuple[str, float]]:
    """Words and their start (s) as Pipecat reads `alignment`: each message's times from its own start,
    the clock advanced by its last start + duration."""
    clock, words, word, start = 0.0, [], "", None
    for m in got:
        a = m.get("alignment")
        if not a or m.get("contextId") != context_id:
            continue
        for ch, t in zip(a["chars"], a["charStartTimesMs"], strict=True):
            if ch == " ":
                if word:
                    words.append((word, start))
                word, start = "", None
            else:
                if start is None and ch:
                    start = clock + t / 1000
                word += ch
        clock += (a["charStartTimesMs"][-1] + a["charDurationsMs"][-1]) / 1000
    if word:
        words.append((word, start))
    return words


@pytest.fixture(scope="module")
def gateway(cpu_engine: Engine) -> Iterator[str]:
    # The garbage sockets never send a valid first message: the config timeout must outlast their rounds
    # on a loaded box, or its `timeout` error joins the codes they are checked for.
    yield from serve(cpu_engine, Limits(config_timeout=30.0))


# -- ElevenLabs: stream-input ---------------------------------------------------------------------------


async def test_stream_input_speaks_with_alignment_and_closes_after_is_final(gateway: str) -> None:
    async with websockets.connect(el_url(gateway, "stream-input")) as ws:
        await ws.send(json.dumps({"text": " ", "voice_settings": {"stability": 0.5}, "xi_api_key": "ignored"}))
        await ws.send(json.dumps({"text": "Hello there, how are you today? ", "try_trigger_generation": True}))
        await ws.send(json.dumps({"text": ""}))  # the end of input
        got = await until(ws, final())
        with pytest.raises(websockets.ConnectionClosedOK):
            async with asyncio.timeout(10):
                await ws.recv()
    pcm = audio_of(got)
    assert len(pcm) > 16000 and len(pcm) % 2 == 0  # > 0.5 s of 16 kHz s16le
    words = heard_words(got)
    assert [w for w, _ in words] == ["Hello", "there,", "how", "are", "you", "today?"]
    starts = [t for _, t in words]
    assert starts == sorted(starts) and starts[-1] < len(pcm) / 32000
    # Each message's alignment spans exactly its audio: the reader's clock ends where the audio does.
    spans = sum((m["alignment"]["charStartTimesMs"][-1] + m["alignment"]["charDurationsMs"][-1])
                for m in got if m.get("audio"))  # fmt: skip
    assert abs(spans - len(pcm) / 32) <= len([m for m in got if m.get("audio")])  # 1 ms of rounding a message
    normalized = [t for m in got if m.get("normalizedAlignment") for t in m["normalizedAlignment"]["charStartTimesMs"]]
    shown = [m.get("normalizedAlignment") for m in got]
    assert normalized == sorted(normalized) and normalized[-1] <= len(pcm) / 32, shown


# -- ElevenLabs: multi-stream-input ---------------------------------------------------------------------


async def test_multi_stream_turns_keepalives_and_is_final_per_context(gateway: str) -> None:
    """Pipecat's sequence: open with " ", text, flush, close_context; keep-alives with and without a
    context between; a second turn on the same socket; a late close of a finished context is ignored."""
    async with websockets.connect(el_url(gateway), additional_headers={"xi-api-key": "any"}) as ws:
        await ws.send(json.dumps({"text": ""}))  # a keep-alive before anything: opens nothing
        for turn in ("t1", "t2"):
            await ws.send(json.dumps({"text": " ", "context_id": turn, "voice_settings": {"speed": 1.0}}))
            await ws.send(json.dumps({"text": f"This is turn {turn[1]}. ", "context_id": turn}))
            await ws.send(json.dumps({"text": "", "context_id": turn}))  # keep-alive inside the context
            await ws.send(json.dumps({"context_id": turn, "flush": True}))
            await ws.send(json.dumps({"context_id": turn, "close_context": True}))
            got = await until(ws, final(turn))
            assert len(audio_of(got, turn)) > 8000
            assert [w for w, _ in heard_words(got, turn)] == ["This", "is", "turn", turn[1] + "."]
            assert all(m.get("contextId") == turn for m in got)
        await ws.send(json.dumps({"context_id": "t1", "close_context": True}))  # long finished: nothing
        await ws.send(json.dumps({"close_socket": True}))
        async with asyncio.timeout(10):
            rest = [json.loads(m) async for m in ws]
        assert not [m for m in rest if m.get("error")], rest
    assert ws.close_code == 1000


async def test_multi_stream_second_close_is_a_barge_in(gateway: str) -> None:
    """Pipecat's interruption: close_context again for a context still speaking cuts its audio, isFinal
    follows at once, and the next context speaks in full."""
    long = "This reply goes on for a long while, sentence after sentence, so that it can be cut. " * 6
    async with websockets.connect(el_url(gateway)) as ws:
        await ws.send(json.dumps({"text": long, "context_id": "a"}))
        await ws.send(json.dumps({"context_id": "a", "flush": True}))
        await ws.send(json.dumps({"context_id": "a", "close_context": True}))
        await until(ws, lambda got: any(m.get("audio") for m in got))
        await ws.send(json.dumps({"context_id": "a", "close_context": True}))
        got = await until(ws, final("a"), timeout=10)
        assert len(audio_of(got, "a")) < len(long) * 16000 * 2 / 15  # far less than the whole (~15 chars/s)
        await ws.send(json.dumps({"text": "And now the next turn. ", "context_id": "b"}))
        await ws.send(json.dumps({"context_id": "b", "flush": True}))
        await ws.send(json.dumps({"context_id": "b", "close_context": True}))
        got = await until(ws, final("b"))
        assert [w for w, _ in heard_words(got, "b")] == ["And", "now", "the", "next", "turn."]


async def test_livekit_sentence_flushes_then_empty_flush_and_close(gateway: str) -> None:
    """LiveKit's sequence: each sentence with flush, then {"text": "", "flush": true} and close_context."""
    async with websockets.connect(el_url(gateway, sync_alignment="true", auto_mode="true")) as ws:
        for sentence in ("First sentence here.", "Second one."):
            await ws.send(json.dumps({"text": sentence + " ", "context_id": "lk", "flush": True}))
        await ws.send(json.dumps({"text": "", "context_id": "lk", "flush": True}))
        await ws.send(json.dumps({"context_id": "lk", "close_context": True}))
        got = await until(ws, final("lk"))
    text = "".join(c for m in got if m.get("normalizedAlignment") for c in m["normalizedAlignment"]["chars"])
    assert text.split() == ["First", "sentence", "here.", "Second", "one."]
    starts = [t for m in got if m.get("normalizedAlignment") for t in m["normalizedAlignment"]["charStartTimesMs"]]
    assert starts == sorted(starts) and starts[-1] > 500  # the context's clock, not each message's


# A reply of ~460 characters (~25 s of audio): long enough to be still sending when the next context begins.
LONG_REPLY = "This reply goes on for a long while, sentence after sentence, so that it outlasts the next. " * 5


def sent_as(client: str, context_id: str, text: str) -> list[str]:
    """A reply's messages as each plugin sends them, all its text then its graceful close_context."""
    cid = context_id
    if client == "pipecat":  # the context's opening " ", the text, then flush + close_context at the turn's end
        msgs = [{"text": " ", "context_id": cid}, {"text": text, "context_id": cid}, {"context_id": cid, "flush": True}]
    else:  # LiveKit: its text with flush (one chunk of its tokenizer's here: see below), then an empty flush
        msgs = [{"text": text, "context_id": cid, "flush": True}, {"text": "", "context_id": cid, "flush": True}]
    return [json.dumps(m) for m in [*msgs, {"context_id": cid, "close_context": True}]]


def words_of(got: list[Message], context_id: str) -> list[str]:
    """The context's words as its normalizedAlignment spells them (LiveKit's reading)."""
    return "".join(c for m in got if m.get("contextId") == context_id and m.get("normalizedAlignment")
                   for c in m["normalizedAlignment"]["chars"]).split()  # fmt: skip


@pytest.mark.parametrize("client", ["livekit", "pipecat"])
async def test_a_context_begun_while_a_closed_one_still_sends_speaks_beside_it_and_neither_loses_speech(
    gateway: str, client: str
) -> None:
    """Contexts interleave, as ElevenLabs' do: context b, begun while a (its text all sent, closed gracefully)
    is still being sent, gets its first audio before a ends, which LiveKit needs (interrupted after its
    text was all sent, it tells the server nothing and drops a's audio itself); and all of a is sent, which
    Pipecat needs (a second reply in the same turn follows the first's flush + close_context, and Pipecat
    plays a, then b). Each context keeps its own clock.

    a is one utterance here. Sent a sentence a message with flush, as LiveKit's tokenizer may, a is five
    utterances, each an engine stream opened at once: on this box (capacity 4–5 streams) b's stream then
    waits in admission, where a slot freed by a's stream passes to a's next (FairQueue.hand_over), and
    b's first audio came after a's end (8.2 s against 6.0 s): that wait is admission's, not the wire's."""
    b_text = "And this is the next turn. "
    loop = asyncio.get_running_loop()
    async with websockets.connect(el_url(gateway)) as ws:
        for m in sent_as(client, "a", LONG_REPLY):
            await ws.send(m)
        got = await until(ws, lambda got: any(m.get("audio") for m in got))
        for m in sent_as(client, "b", b_text):
            await ws.send(m)
        b_sent, seen = loop.time(), len(got)
        at: dict[str, float] = {}

        def both_final(more: list[Message]) -> bool:  # noting when b's first audio and each end came (printed)
            last = more[-1] if more else {}
            if "b" not in at and last.get("audio") and last.get("contextId") == "b":
                at["b"] = loop.time()
            if last.get("isFinal"):
                at.setdefault(f"{last.get('contextId')} final", loop.time())
            return "a final" in at and "b final" in at

        got += await until(ws, both_final, timeout=120)
    print(f"{client}: after b's text, b's first audio {at.get('b', b_sent) - b_sent:.2f} s, "
          f"a's isFinal {at.get('a final', b_sent) - b_sent:.2f} s")
    assert not [m for m in got if m.get("error")], [m for m in got if m.get("error")]
    b_first = next(i for i, m in enumerate(got) if m.get("audio") and m.get("contextId") == "b")
    a_end = next(i for i, m in enumerate(got) if m.get("isFinal") and m.get("contextId") == "a")
    assert seen <= b_first < a_end, (b_first, a_end)  # b spoke while a was still being sent
    assert words_of(got, "a") == LONG_REPLY.split()  # all of a: nothing cut
    assert len(audio_of(got, "a")) > 15 * 32000  # > 15 s of its ~25 s at 16 kHz s16le (the words say "all")
    assert words_of(got, "b") == b_text.split()
    assert [w for w, _ in heard_words(got, "b")] == b_text.split()  # Pipecat's reading too
    for cid in ("a", "b"):  # each context's normalizedAlignment is on its own clock, from 0
        starts = [t for m in got if m.get("contextId") == cid and m.get("normalizedAlignment")
                  for t in m["normalizedAlignment"]["charStartTimesMs"]]  # fmt: skip
        assert starts == sorted(starts) and starts[0] < 1000, (cid, starts[:5])


@pytest.mark.parametrize(("fmt", "check"), [
    ("ulaw_8000", lambda audio, ms: abs(len(audio) - ms * 8) < 400),
    ("pcm_24000", lambda audio, ms: len(audio) % 2 == 0 and abs(len(audio) - ms * 48) < 2400),
    ("mp3_22050_32", lambda audio, ms: audio[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xe3", b"ID")),
])  # fmt: skip
async def test_output_formats(gateway: str, fmt: str, check: Callable[[bytes, float], bool]) -> None:
    async with websockets.connect(el_url(gateway, "stream-input", output_format=fmt)) as ws:
        await ws.send(json.dumps({"text": "Formats are honoured. "}))
        await ws.send(json.dumps({"text": ""}))
        got = await until(ws, final())
    ms = sum(m["alignment"]["charStartTimesMs"][-1] + m["alignment"]["charDurationsMs"][-1]
             for m in got if m.get("audio") is not None and m.get("alignment"))  # fmt: skip
    assert check(audio_of(got), ms), (fmt, len(audio_of(got)), ms)


@pytest.mark.parametrize("fmt", ["opus_48000_32", "pcm_12345", "wav", "mp3_44100"])
async def test_unsupported_output_format_is_refused_in_elevenlabs_shape(gateway: str, fmt: str) -> None:
    async with websockets.connect(el_url(gateway, output_format=fmt)) as ws:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert msg["error"] == "unsupported_format" and msg["message"] and msg["code"] == 1008
    assert ws.close_code == 1008


async def test_malformed_messages_get_stable_errors_and_the_socket_goes_on(gateway: str) -> None:
    async with websockets.connect(el_url(gateway)) as ws:
        await ws.send("{not json")
        await ws.send(json.dumps({"text": 5, "context_id": "x"}))
        await ws.send(json.dumps({"text": "x" * 200_000, "context_id": "x"}))
        await ws.send(b"\x00\x01")
        await ws.send(json.dumps({"text": "hi", "context_id": "c" * 500}))
        got = await until(ws, lambda got: len(got) >= 5, timeout=10)
        assert [m["error"] for m in got] == ["invalid_json", "invalid_message", "message_too_large",
                                             "binary_not_supported", "invalid_message"]  # fmt: skip
        assert all(isinstance(m["message"], str) and len(m["message"]) <= 300 for m in got)
        await ws.send(json.dumps({"text": "Still here. ", "context_id": "ok", "flush": True}))
        await ws.send(json.dumps({"context_id": "ok", "close_context": True}))
        got = await until(ws, final("ok"))
        assert audio_of(got, "ok")


async def test_unknown_voice_is_refused_and_closed(gateway: str) -> None:
    async with websockets.connect(el_url(gateway, voice="no-such-voice")) as ws:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert msg["error"] == "unknown_voice" and ws.close_code == 1008


# -- keys -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=2.0), api_keys=f"acme={hash_api_key('acme-key')}")


async def test_xi_api_key_is_a_voxgate_key(keyed_gateway: str) -> None:
    url = el_url(keyed_gateway, "stream-input")
    async with websockets.connect(url, additional_headers={"xi-api-key": "acme-key"}) as ws:
        await ws.send(json.dumps({"text": "Keyed. "}))
        await ws.send(json.dumps({"text": ""}))
        assert audio_of(await until(ws, final()))
    async with websockets.connect(el_url(keyed_gateway), additional_headers={"xi-api-key": "wrong"}) as ws:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert msg["error"] == "unauthorized" and ws.close_code == 1008


# -- attacks, with a canary speaking beside them (bench/attack.py) ---------------------------------------


# Each protocol's errors in its own shape (the sorted field names of every error message the attack got), with
# voxgate's stable codes; the garbage closes no socket, and a frame past the server's frame bound closes its
# socket 1009 (the WebSocket's own "message too big"; 1006 where the server dropped the connection while the
# client was still writing the frame).
EL_SHAPE = "code,error,message"  # {"error": CODE, "message": …, "code": close code}; contextId when one applies
CARTESIA_SHAPE = "code,context_id,done,error,status_code,type"
EL_CODES = ["binary_not_supported", "invalid_json", "invalid_message", "message_too_large"]
GARBAGE = {  # attack: (error shape, codes, errors per socket and round: every bad message answered once)
    "elevenlabs_garbage": (EL_SHAPE, EL_CODES, 7),  # a Cartesia-shaped message is one with no text: nothing
    "elevenlabs_single_garbage": (EL_SHAPE, EL_CODES, 7),
    "cartesia_garbage": (CARTESIA_SHAPE, ["binary_not_supported", "invalid_config", "invalid_json",
                                          "invalid_message", "message_too_large"], 8),
}  # fmt: skip


@pytest.mark.parametrize("name", list(GARBAGE))
def test_malformed_and_oversized_messages_get_stable_errors_in_each_protocols_shape_beside_a_canary(
    gateway: str, name: str
) -> None:
    r = asyncio.run(run(f"http://{gateway}", name, sockets=3, seconds=3.0, rounds=5))
    assert_undisturbed(r)
    shape, codes, per_round = GARBAGE[name]
    assert r.seen["shapes"] == [shape] and r.seen["codes"] == codes and r.seen["errors"] == 3 * 5 * per_round, r.seen
    assert r.seen["open_after_garbage"] == 3 and set(r.seen["closes"]) <= {1006, 1009}, r.seen


@pytest.mark.parametrize("name", ["elevenlabs_unread", "elevenlabs_single_unread", "cartesia_unread"])
def test_sockets_that_never_read_leave_the_canary_undisturbed(gateway: str, name: str) -> None:
    r = asyncio.run(run(f"http://{gateway}", name, sockets=3, seconds=2.0))
    assert_undisturbed(r)


@pytest.fixture(scope="module")
def three_contexts_gateway(cpu_engine: Engine) -> Iterator[str]:
    # Three contexts a socket: each reply here is two utterances (its text's, and the bare one its close_context
    # ends), so three stay within max_open_utterances (8) and max_contexts is the bound the extra one meets.
    yield from serve(cpu_engine, Limits(config_timeout=30.0, max_contexts=3))


def test_interleaved_contexts_and_one_past_the_bound_leave_the_canary_undisturbed(three_contexts_gateway: str) -> None:
    """A socket opens as many contexts as it may at once, each a reply sent as LiveKit sends it, and one more:
    the contexts speak beside each other, each in full; the one past the bound is refused by a stable code
    naming it (too_many_contexts), never dropped silently; a canary session beside it keeps speaking."""
    r = asyncio.run(run(f"http://{three_contexts_gateway}", "elevenlabs_contexts", contexts=3, chars=300))
    assert_undisturbed(r)
    assert r.seen["codes"] == ["too_many_contexts"] and r.seen["refused"] == ["extra"], r.seen
    assert r.seen["ended"] == ["c0", "c1", "c2"] and r.seen["whole"] == 3, r.seen
    assert r.seen["overlapped"] >= 1, r.seen  # a context's first audio came before the one before it ended


# -- Cartesia: /tts/websocket ----------------------------------------------------------------------------


def cartesia_request(context_id: str, transcript: str, more: bool, **fields: Any) -> str:
    """A generation request as Pipecat's CartesiaTTSService sends it."""
    fmt = fields.pop("output_format", {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000})
    return json.dumps({"transcript": transcript, "continue": more, "context_id": context_id,
                       "model_id": "sonic-3", "voice": {"mode": "id", "id": "joe"}, "output_format": fmt,
                       "add_timestamps": True, "max_buffer_delay_ms": 0, "language": "en",
                       "generation_config": {"speed": 1.0, "emotion": "calm"}} | fields)  # fmt: skip


def cartesia_done(context_id: str) -> Callable[[list[Message]], bool]:
    return lambda got: any(m.get("type") == "done" and m.get("context_id") == context_id for m in got)


def cartesia_audio(got: list[Message], context_id: str) -> bytes:
    return b"".join(
        base64.b64decode(m["data"]) for m in got if m.get("type") == "chunk" and m["context_id"] == context_id
    )


async def test_cartesia_turns_with_word_timestamps(gateway: str) -> None:
    url = f"ws://{gateway}/tts/websocket?cartesia_version=2025-04-16"
    async with websockets.connect(url, additional_headers={"Cartesia-Version": "2024-11-13"}) as ws:
        offset = 0.0
        for turn, pieces in (("c1", ["Hello from ", "Cartesia's socket. "]), ("c2", ["A second turn. "])):
            for piece in pieces:
                await ws.send(cartesia_request(turn, piece, True))
            await ws.send(cartesia_request(turn, "", False))
            got = await until(ws, cartesia_done(turn))
            assert all(m["context_id"] == turn for m in got)  # Pipecat reads it from every message
            done = got[-1]
            assert done["type"] == "done" and done["done"] is True and done["status_code"] == 200
            audio = cartesia_audio(got, turn)
            assert len(audio) > 8000 and len(audio) % 2 == 0
            stamps = [m["word_timestamps"] for m in got if m["type"] == "timestamps"]
            words = [w for s in stamps for w in s["words"]]
            starts = [t for s in stamps for t in s["start"]]
            assert " ".join(words) == " ".join(pieces).replace("  ", " ").strip().replace(".", "")
            assert starts == sorted(starts) and starts[-1] < len(audio) / 32000
            offset += len(audio) / 32000
        assert offset > 1.0


async def test_cartesia_cancel_cuts_a_context_and_the_next_one_speaks(gateway: str) -> None:
    long = "This answer runs on and on, one clause after another, so that it can be cut short. " * 6
    async with websockets.connect(f"ws://{gateway}/tts/websocket") as ws:
        await ws.send(cartesia_request("a", long, True))
        await until(ws, lambda got: any(m.get("type") == "chunk" for m in got))
        await ws.send(json.dumps({"context_id": "a", "cancel": True}))
        await ws.send(cartesia_request("b", "After the cut. ", False))
        got = await until(ws, cartesia_done("b"))
    # What of "a" was on the wire before the cancel was read may still arrive; nothing of it after "b" began.
    first_b = next(i for i, m in enumerate(got) if m.get("context_id") == "b")
    assert not [m for m in got[first_b:] if m.get("context_id") == "a"]
    assert not [m for m in got if m.get("context_id") == "a" and m["type"] == "done"]
    assert [w for m in got if m["type"] == "timestamps" and m["context_id"] == "b"
            for w in m["word_timestamps"]["words"]] == ["After", "the", "cut"]  # fmt: skip


async def test_cartesia_flush_then_done(gateway: str) -> None:
    async with websockets.connect(f"ws://{gateway}/tts/websocket") as ws:
        await ws.send(cartesia_request("f", "First part. ", True, flush=True))
        await ws.send(cartesia_request("f", "Second part. ", False))
        got = await until(ws, cartesia_done("f"))
    kinds = [m["type"] for m in got if m["type"] in ("flush_done", "done")]
    assert kinds == ["flush_done", "done"]
    assert next(m for m in got if m["type"] == "flush_done")["flush_id"] == 1


@pytest.mark.parametrize(("encoding", "rate", "width"), [("pcm_f32le", 16000, 4), ("pcm_mulaw", 8000, 1)])
async def test_cartesia_encodings(gateway: str, encoding: str, rate: int, width: int) -> None:
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": rate}
    async with websockets.connect(f"ws://{gateway}/tts/websocket") as ws:
        await ws.send(cartesia_request("e", "Encodings work. ", False, output_format=fmt))
        got = await until(ws, cartesia_done("e"))
    audio = cartesia_audio(got, "e")
    last = [m for m in got if m["type"] == "timestamps"][-1]["word_timestamps"]["end"][-1]
    assert len(audio) % width == 0 and len(audio) / width / rate > last * 0.9
    if encoding == "pcm_f32le":
        import numpy as np

        samples = np.frombuffer(audio, "<f4")
        assert 0.01 < float(np.abs(samples).max()) <= 1.0


async def test_cartesia_errors_in_its_shape(gateway: str) -> None:
    async with websockets.connect(f"ws://{gateway}/tts/websocket") as ws:
        await ws.send("{nope")
        await ws.send(json.dumps({"transcript": "no voice", "context_id": "x"}))
        await ws.send(cartesia_request("ok", "Fine. ", False))
        await ws.send(cartesia_request("other", "Another voice. ", False, voice={"mode": "id", "id": "ryan"}))
        got = await until(
            ws, lambda got: cartesia_done("ok")(got) and len([m for m in got if m["type"] == "error"]) >= 3
        )
    errors = [m for m in got if m["type"] == "error"]
    assert [(m["code"], m["context_id"]) for m in errors] == [("invalid_json", ""), ("invalid_config", "x"),
                                                              ("invalid_config", "other")]  # fmt: skip
    assert all(m["status_code"] == 400 and m["done"] is True and m["error"] for m in errors)
    async with websockets.connect(f"ws://{gateway}/tts/websocket") as ws:
        await ws.send(cartesia_request("v", "Hi. ", False, voice={"mode": "id", "id": "no-such-voice"}))
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert msg["type"] == "error" and msg["code"] == "unknown_voice" and msg["status_code"] == 404
    assert ws.close_code == 1008


async def test_cartesia_keys_by_header_and_query(keyed_gateway: str) -> None:
    for url, headers in ((f"ws://{keyed_gateway}/tts/websocket", {"X-API-Key": "acme-key"}),
                         (f"ws://{keyed_gateway}/tts/websocket?api_key=acme-key", {})):  # fmt: skip
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(cartesia_request("k", "Keyed. ", False))
            assert cartesia_audio(await until(ws, cartesia_done("k")), "k")
    async with websockets.connect(f"ws://{keyed_gateway}/tts/websocket", additional_headers={"X-API-Key": "no"}) as ws:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert msg["code"] == "unauthorized" and msg["status_code"] == 401 and ws.close_code == 1008


# -- HTTP routes -----------------------------------------------------------------------------------------


def post(gateway: str, path: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{gateway}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"} | (headers or {}))  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


EL_BODY = {"text": "The HTTP route speaks too.", "model_id": "eleven_flash_v2_5",
           "voice_settings": {"stability": 0.5, "similarity_boost": 0.8}}  # fmt: skip


def test_elevenlabs_http_stream(gateway: str) -> None:
    status, media, body = post(gateway, "/v1/text-to-speech/joe/stream?output_format=pcm_16000", EL_BODY)
    assert status == 200 and media.startswith("audio/pcm") and len(body) > 16000 and len(body) % 2 == 0
    status, media, body = post(gateway, "/v1/text-to-speech/joe/stream", EL_BODY)  # ElevenLabs' default: mp3
    assert status == 200 and media.startswith("audio/mpeg") and body[:2] in (b"\xff\xfb", b"\xff\xf3", b"ID")


def test_elevenlabs_http_stream_with_timestamps(gateway: str) -> None:
    status, media, body = post(gateway, "/v1/text-to-speech/joe/stream/with-timestamps?output_format=pcm_16000",
                               EL_BODY)  # fmt: skip
    assert status == 200 and media.startswith("application/json")
    lines = [json.loads(line) for line in body.splitlines()]
    audio = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
    chars = [c for line in lines if line.get("alignment") for c in line["alignment"]["characters"]]
    starts = [t for line in lines if line.get("alignment") for t in line["alignment"]["character_start_times_seconds"]]
    assert "".join(chars).split() == EL_BODY["text"].split()  # type: ignore[union-attr]
    assert starts == sorted(starts) and starts[-1] <= len(audio) / 32000, [
        (line.get("alignment"), len(line["audio_base64"])) for line in lines
    ]


@pytest.mark.parametrize(("container", "encoding", "media", "magic"), [
    ("raw", "pcm_s16le", "audio/pcm", None), ("raw", "pcm_f32le", "audio/pcm", None),
    ("wav", "pcm_s16le", "audio/wav", b"RIFF"), ("mp3", "pcm_s16le", "audio/mpeg", b"\xff"),
])  # fmt: skip
def test_cartesia_bytes(gateway: str, container: str, encoding: str, media: str, magic: bytes | None) -> None:
    body = {"model_id": "sonic-3", "transcript": "Bytes over HTTP.", "voice": {"mode": "id", "id": "joe"},
            "output_format": {"container": container, "encoding": encoding, "sample_rate": 22050},
            "language": "en"}  # fmt: skip
    status, got_media, audio = post(gateway, "/tts/bytes", body, {"Cartesia-Version": "2025-04-16"})
    assert status == 200 and got_media.startswith(media) and len(audio) > 8000
    assert magic is None or audio.startswith(magic)


def test_http_errors_in_each_providers_shape(gateway: str, keyed_gateway: str) -> None:
    status, _, body = post(gateway, "/v1/text-to-speech/nobody/stream?output_format=pcm_16000", EL_BODY)
    assert status == 404 and json.loads(body)["detail"]["status"] == "unknown_voice"
    status, _, body = post(gateway, "/v1/text-to-speech/joe/stream?output_format=opus_48000_64", EL_BODY)
    assert status == 400 and json.loads(body)["detail"]["status"] == "unsupported_format"
    status, _, body = post(gateway, "/v1/text-to-speech/joe/stream", b"{nope")
    assert status == 400 and json.loads(body)["detail"]["status"] == "invalid_request"
    status, _, body = post(keyed_gateway, "/v1/text-to-speech/joe/stream", EL_BODY, {"xi-api-key": "wrong"})
    assert status == 401 and json.loads(body)["detail"]["status"] == "unauthorized"
    assert post(keyed_gateway, "/v1/text-to-speech/joe/stream?output_format=pcm_16000", EL_BODY,
                {"xi-api-key": "acme-key"})[0] == 200  # fmt: skip
    bytes_body = {"transcript": "Hi.", "voice": {"mode": "id", "id": "nobody"}}
    status, _, body = post(gateway, "/tts/bytes", bytes_body)
    assert status == 404 and json.loads(body)["code"] == "unknown_voice"
    status, _, body = post(keyed_gateway, "/tts/bytes", bytes_body | {"voice": {"id": "joe"}}, {"X-API-Key": "no"})
    assert status == 401 and json.loads(body)["code"] == "unauthorized"
    status, _, body = post(gateway, "/tts/bytes", {"transcript": "", "voice": {"id": "joe"}})
    assert status == 400 and json.loads(body)["code"] == "invalid_request"
