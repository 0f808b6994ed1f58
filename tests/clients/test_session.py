"""voxgate_client against a real gateway on loopback (the Piper voice): streamed deltas, flush, several
utterances on one socket, cancel with the playback position, typed events, refusals. The client's own
types are checked against the server's (gateway/protocol.py), and the client never imports the server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import voxgate_client
from voxgate_client import Audio, AudioCancelled, AudioStart, SegmentCommitted, SessionDone, VoxgateError, events

ROOT = Path(__file__).resolve().parents[2]
LONG = ("This is a long answer that keeps going for a while, so that a listener can interrupt it. "
        "It has several sentences, each of them long enough to take a few seconds to say out loud.")  # fmt: skip
# A cancel cuts only what is not sent yet. Piper (RTF ~0.13 here) makes LONG's ~10 s in ~1.3 s, so a cancel
# sent 0.3 s after its first audio can come after its last: an answer several times as long cannot.
INTERRUPTIBLE = " ".join([LONG] * 6)


@pytest.fixture(scope="module")
def gateway(piper_engine: object) -> Iterator[str]:
    from support.servers import serve

    from gateway.settings import Limits

    yield from serve(piper_engine, Limits(config_timeout=2.0))  # type: ignore[arg-type]


async def open_session(gateway: str, **config: object) -> voxgate_client.Session:
    return await voxgate_client.connect(f"ws://{gateway}", **({"voice": "joe", "language": "en"} | config))


def words_of(text: str) -> list[str]:
    return text.replace(",", " ").replace(".", " ").split()


async def test_streamed_deltas_flush_and_a_second_utterance_on_one_socket(gateway: str) -> None:
    async with await open_session(gateway) as session:
        assert session.ready.sample_rate > 0 and session.ready.format == "pcm"
        first = session.speech()
        for piece in ("Hello there, ", "my friend. ", "How are ", "you today?"):
            await first.send(piece)
        await first.done()
        second = await session.say("And a second turn on the same socket.")
        audio, evs = await first.collect()
        audio2, evs2 = await second.collect()
    assert first.utterance_index == 0 and second.utterance_index == 1
    assert len(audio) > 0.5 * 2 * session.ready.sample_rate and len(audio2) > 0
    assert isinstance(evs[-1], SessionDone) and isinstance(evs2[-1], SessionDone) and first.result is evs[-1]
    assert any(isinstance(e, AudioStart) for e in evs)
    committed = "".join(e.text for e in evs if isinstance(e, SegmentCommitted))
    assert words_of(committed) == words_of("Hello there, my friend. How are you today?")
    assert all(getattr(e, "utterance_index", 0) == 0 for e in evs)
    assert first.received_ms == pytest.approx(len(audio) / 2 / session.ready.sample_rate * 1000)


async def test_audio_frames_carry_their_utterance_and_offsets(gateway: str) -> None:
    async with await open_session(gateway) as session:
        speech = await session.say("Counting the bytes of one short answer.")
        offset = 0
        async for item in speech:
            if isinstance(item, Audio):
                assert item.utterance_index == speech.utterance_index and item.offset == offset
                offset += len(item.data)
        assert offset == speech.received_bytes > 0


async def test_cancel_with_the_playback_position_drops_queued_audio_and_is_answered(gateway: str) -> None:
    async with await open_session(gateway) as session:
        speech = await session.say(INTERRUPTIBLE)
        async for item in speech:  # wait for the first audio, then "play" for a moment
            if isinstance(item, Audio):
                break
        await asyncio.sleep(0.3)
        answer = await speech.cancel(played_ms=300)
        assert isinstance(answer, AudioCancelled) and answer.cancelled
        assert answer.utterance_index == speech.utterance_index
        rest = [item async for item in speech]
        assert not any(isinstance(item, Audio) for item in rest), "audio after the cancel"
        assert rest[-1] is answer and speech.result is answer
        # The socket goes on: a new utterance after the cancel speaks whole.
        after = await session.say("Still here after the interruption.")
        audio, evs = await after.collect()
        assert audio and isinstance(evs[-1], SessionDone)


async def test_a_cancel_with_nothing_playing_is_answered(gateway: str) -> None:
    async with await open_session(gateway) as session:
        answers = await session.cancel()
        assert len(answers) == 1 and answers[0].cancelled is False and answers[0].utterance_index is None
        speech = await session.say("Short.")
        await speech.collect()
        late = await speech.cancel()  # it had ended: the answer names it, with nothing cut
        assert late is None or late.cancelled is False


async def test_a_refused_config_raises_with_its_code(gateway: str) -> None:
    with pytest.raises(VoxgateError) as refused:
        await open_session(gateway, voice="no-such-voice")
    assert refused.value.code == "unknown_voice"


async def test_an_error_naming_no_utterance_reaches_the_session(gateway: str) -> None:
    async with await open_session(gateway) as session:
        speech = session.speech()
        await speech.send("x" * (200 * 1024))  # past the 128 KiB message limit
        await speech.done()
        errors = []
        async with asyncio.timeout(10):
            async for item in session:  # the server names no utterance for an oversized message
                errors.append(item)
                break
        assert isinstance(errors[0], events.Error) and errors[0].code == "message_too_large"


async def test_reconfigure_between_utterances(gateway: str) -> None:
    async with await open_session(gateway) as session:
        await (await session.say("First.")).collect()
        ready = await session.configure(voice="joe", language="en", sample_rate=16000)
        assert ready.sample_rate == 16000 and session.ready is ready
        speech = await session.say("At sixteen kilohertz now.")
        audio, _ = await speech.collect()
        assert audio and speech.sample_rate == 16000 and speech.utterance_index == 1


def test_unknown_events_decode_instead_of_failing() -> None:
    ev = events.decode_event(b'{"type": "audio.future", "utterance_index": 3, "context_id": "c"}')
    assert isinstance(ev, events.UnknownEvent) and ev.type == "audio.future" and ev.context_id == "c"
    words = events.decode_event(b'{"type": "audio.words", "utterance_index": 0, "extra": 1, "words": '
                                b'[{"word": "Hi", "start_ms": 0, "end_ms": 120, "segment_index": 0}]}')
    assert isinstance(words, events.AudioWords) and words.words[0].end_ms == 120


def test_the_client_types_agree_with_the_servers() -> None:
    """Every server event has a client type of the same tag whose fields are the server's (the client may
    know more: fields a newer server adds, such as context_id)."""
    from gateway import protocol

    server = {t.__struct_config__.tag: t for t in typing.get_args(protocol.Event)}
    for tag, kind in server.items():
        assert tag in events.EVENT_TYPES, f"the client has no type for {tag}"
        ours = {f.name for f in msgspec.structs.fields(events.EVENT_TYPES[tag])}
        theirs = {f.name for f in msgspec.structs.fields(kind)}
        assert theirs <= ours, (tag, theirs - ours)
    timing = protocol.Timing(0, 1, 2, 3, 4, 0.5, 0)
    sample = protocol.AudioDone(utterance_index=0, total_bytes=2, error=False, timing=timing)
    decoded = events.decode_event(protocol.encode(sample))
    assert isinstance(decoded, events.AudioDone) and decoded.timing == events.Timing(0, 1, 2, 3, 4, 0.5, 0)


def test_the_client_imports_nothing_of_the_server() -> None:
    probe = ("import sys, voxgate_client, voxgate_client.session;"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gateway', 'engine', 'sessions', "
             "'segmentation', 'torch', 'numpy')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_client_messages_agree_with_the_servers() -> None:
    """Every field the client can send is one the server's messages decode."""
    from gateway import protocol
    from voxgate_client import messages

    pairs = [(messages.SessionConfig, protocol.SessionConfig), (messages.InputText, protocol.InputText),
             (messages.InputDone, protocol.InputDone), (messages.InputCancel, protocol.InputCancel)]  # fmt: skip
    for ours, theirs in pairs:
        mine = {f.name for f in msgspec.structs.fields(ours)}
        assert mine <= {f.name for f in msgspec.structs.fields(theirs)}, (ours, mine)


async def test_contexts_interleave_on_one_socket_and_a_cancel_leaves_the_other(gateway: str) -> None:
    async with await open_session(gateway) as session:
        a, b = session.speech(context_id="a"), session.speech(context_id="b")
        other = "The other context speaks on, whole."
        for piece_a, piece_b in zip(INTERRUPTIBLE.split(" "), other.split(" "), strict=False):
            await a.send(piece_a + " ")
            await b.send(piece_b + " ")
        await a.send(" ".join(INTERRUPTIBLE.split(" ")[6:]))
        await a.done()
        await b.done()
        async for item in a:  # a plays first (it opened first); cancel it once its audio flows
            if isinstance(item, Audio):
                break
        answer = await a.cancel(played_ms=200)
        assert answer is not None and answer.cancelled and answer.context_id == "a"
        audio_b, events_b = await b.collect()
        assert audio_b and isinstance(events_b[-1], SessionDone) and events_b[-1].context_id == "b"
        assert all(e.context_id == "b" for e in events_b)
        committed = "".join(e.text for e in events_b if isinstance(e, SegmentCommitted))
        assert words_of(committed) == words_of(other)
        assert a.result is answer and not any(isinstance(i, Audio) for i in [x async for x in a])


async def test_word_timings_and_what_the_listener_heard(gateway: str) -> None:
    async with await open_session(gateway, word_timestamps=True) as session:
        speech = await session.say(LONG)
        async for item in speech:
            if isinstance(item, Audio) and speech.received_ms > 1500:
                break
        answer = await speech.cancel(played_ms=1200)
        assert answer is not None and answer.heard_text is not None
        heard = [w for w in speech.words if (w.start_ms + w.end_ms) / 2 <= 1200]
        assert speech.words and all(isinstance(w, events.Word) for w in speech.words)
        assert [w.start_ms for w in speech.words] == sorted(w.start_ms for w in speech.words)
        assert words_of(answer.heard_text) == [w.word for w in heard]
