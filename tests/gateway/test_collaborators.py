"""The connection's collaborators (Contexts, TextIntake, Playout, Pump) built over small fakes of the narrow
Protocols they take (gateway/seams.py), no `Connection` and no socket: each one's rules, checked alone.
The engine stream is a fake fed by the test (what it yields is what a real engine's stream yields)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import numpy as np
import pytest

from engine import AudioChunk, StreamEnd, Waiting
from engine.types import StreamEvent
from gateway.backlog import Backlog
from gateway.contexts import Contexts
from gateway.intake import TextIntake
from gateway.lexicons import NO_LEXICON
from gateway.outbox import Outbox, Outgoing
from gateway.playout import Playout
from gateway.protocol import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    AudioWaiting,
    Error,
    ProtocolError,
    SegmentCommitted,
    ServerEvent,
    SessionConfig,
    SessionDone,
)
from gateway.seams import Binding, Emitter, PlayOrder, SessionView, Voice
from gateway.settings import Limits
from gateway.utterance import Utterance
from sessions import StreamSlot, Tenant

RATE = 24000
WAIT_S = 5.0  # every wait on a pump or an event is bounded


class FakeStream:
    """An engine stream the test drives: `feed` what the engine would yield; what went in is kept."""

    def __init__(self) -> None:
        self.appended: list[str] = []
        self.finished = self.cancelled = False
        self._events: asyncio.Queue[StreamEvent] = asyncio.Queue(maxsize=64)

    def append(self, text: str) -> None:
        self.appended.append(text)

    def finish(self) -> None:
        self.finished = True

    def cancel(self) -> None:
        self.cancelled = True
        self._events.put_nowait(StreamEnd("cancelled"))

    def feed(self, *events: StreamEvent) -> None:
        for ev in events:
            self._events.put_nowait(ev)

    async def events(self) -> AsyncIterator[StreamEvent]:
        while True:
            ev = await self._events.get()
            yield ev
            if isinstance(ev, StreamEnd):
                return


class FakeOut:
    """An `Emitter` that keeps what it is given."""

    def __init__(self) -> None:
        self.outbox = Outbox(256, 1.0)
        self.events: list[ServerEvent] = []
        self.stopped = False

    async def emit(self, ev: ServerEvent, audio_of: int | None = None) -> None:
        self.events.append(ev)

    async def error(self, code: str, message: str, **fields: object) -> None:
        self.events.append(Error(code=code, message=message, **fields))  # type: ignore[arg-type]

    def stop(self, code: int | None = None, reason: str = "") -> None:
        self.stopped = True

    def of(self, kind: type[ServerEvent]) -> list[Any]:
        return [ev for ev in self.events if isinstance(ev, kind)]


class FakeBinding:
    """A `Binding` with no store: the slots it gave, the utterances begun and the spoken log."""

    def __init__(self) -> None:
        self.tenant = Tenant("t")
        self.begun: list[int] = []
        self.log: list[tuple[int, str, bool]] = []

    async def acquire_slot(self) -> StreamSlot | None:
        return None

    def begin(self, utterance: int) -> None:
        self.begun.append(utterance)

    async def record(self, utterance: int, spoken: str, *, cancelled: bool) -> None:
        self.log.append((utterance, spoken, cancelled))


class FakeEngine:
    sample_rate = RATE


class FakeView:
    """A `SessionView` of a configured session whose streams are `FakeStream`s."""

    def __init__(self, limits: Limits | None = None, **config: Any) -> None:
        self.limits = limits or Limits()
        self.backlog = Backlog(self.limits)
        self.listener = self.backlog.listener
        self.session = FakeBinding()
        self.session_id = "s1"
        self.config: SessionConfig | None = SessionConfig(sample_rate=RATE, **config)
        self.voice: Voice = (None, {})
        self.pronunciations = NO_LEXICON
        self.engine: Any = FakeEngine()
        self.admission = None
        self.model = "m"
        self.is_draining = False
        self.draining = lambda: self.is_draining
        self.streams: list[FakeStream] = []
        self._count = 0

    @property
    def sample_rate(self) -> int:
        return RATE

    @property
    def codec_mode(self) -> bool:
        return False

    def open_stream(self, cfg: SessionConfig, voice: Voice, engine: Any = None, listener: Any = None) -> FakeStream:
        self.streams.append(FakeStream())
        return self.streams[-1]

    def next_utterance_index(self) -> int:
        self._count += 1
        return self._count - 1


class FakeOrder:
    """A `PlayOrder` that plays nothing: what the intake handed it."""

    def __init__(self) -> None:
        self.playing: deque[Utterance] = deque()
        self.reserved: list[Utterance] = []
        self.done: list[Utterance] = []

    def reserve(self, utt: Utterance) -> None:
        self.reserved.append(utt)

    def start(self, utt: Utterance) -> asyncio.Task[None]:
        return asyncio.create_task(asyncio.sleep(0))

    def finished(self, utt: Utterance) -> None:
        utt.finished = True
        self.done.append(utt)
        self.playing.append(utt)

    async def release_slot(self, utt: Utterance) -> None:
        pass


def test_the_fakes_are_what_the_protocols_ask() -> None:
    # Structural: a fake missing a member the collaborators use would fail here, not deep in a test.
    for fake, proto in ((FakeOut, Emitter), (FakeBinding, Binding), (FakeOrder, PlayOrder), (FakeView, SessionView)):
        members = {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))
        instance = fake()
        assert all(hasattr(instance, n) for n in members), (fake, members - set(dir(instance)))


def loud(seconds: float, first_frame: int = 0, segment: int = 0) -> AudioChunk:
    t = np.arange(int(RATE * seconds)) / RATE
    pcm = (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
    return AudioChunk(pcm, RATE, first_frame, segment)


async def settled(task: asyncio.Task[None] | None) -> None:
    assert task is not None
    async with asyncio.timeout(WAIT_S):
        await task


# -- TextIntake ------------------------------------------------------------------------------------


async def test_intake_commits_sentences_into_one_stream_and_hands_the_utterance_to_the_order() -> None:
    view, out, order = FakeView(), FakeOut(), FakeOrder()
    intake = TextIntake(view, out, order, tag=lambda utt: None)
    await intake.text("Hello there. How are")
    utt = intake.current
    assert utt is not None and order.reserved == [utt] and view.session.begun == [utt.index]
    assert [ev.text.strip() for ev in out.of(SegmentCommitted)] == ["Hello there."]
    assert view.streams[0].appended == ["Hello there. "]
    await intake.finish()  # the tail is committed and the utterance closed
    assert intake.current is None and order.done == [utt]
    assert [ev.text.strip() for ev in out.of(SegmentCommitted)] == ["Hello there.", "How are"]
    assert len(view.streams) == 1 and len(view.streams[0].appended) == 2


async def test_intake_refuses_a_new_utterance_while_draining_or_at_the_bound() -> None:
    view, out, order = FakeView(Limits(max_open_utterances=2)), FakeOut(), FakeOrder()
    intake = TextIntake(view, out, order, tag=lambda utt: None)
    view.is_draining = True
    with pytest.raises(ProtocolError) as refused:
        await intake.text("Hello.")
    assert refused.value.code == "draining" and refused.value.fields["rejected_chars"] == 6
    view.is_draining = False
    for text in ("One.", "Two."):
        await intake.text(text)
        await intake.finish()
    with pytest.raises(ProtocolError) as refused:
        await intake.text("Three.")
    assert refused.value.code == "too_many_utterances" and intake.current is None
    assert not out.of(SegmentCommitted)[2:]  # nothing of the refused text was committed


async def test_an_idle_utterance_is_finished_and_the_client_told() -> None:
    view, out, order = FakeView(Limits(utterance_idle_timeout=1.0)), FakeOut(), FakeOrder()
    intake = TextIntake(view, out, order, tag=lambda utt: None)
    await intake.text("Still talking")
    utt = intake.current
    assert utt is not None
    await intake.tick(utt.last_input + 0.5)  # quiet, not yet idle
    assert intake.current is utt and not out.of(Error)
    await intake.tick(utt.last_input + 1.5)
    assert [e.code for e in out.of(Error)] == ["utterance_timeout"] and intake.current is None
    assert order.done == [utt] and view.streams[0].appended == ["Still talking "]


# -- Contexts ----------------------------------------------------------------------------------------


async def test_contexts_are_bounded_pruned_and_stamp_their_events() -> None:
    view, out, order = FakeView(Limits(max_contexts=2)), FakeOut(), FakeOrder()
    contexts = Contexts(view, out, order)
    await contexts.open("a").text("Alpha")
    await contexts.open("b").text("Beta")
    with pytest.raises(ProtocolError) as refused:
        contexts.open("c", rejected_chars=5)
    assert refused.value.code == "too_many_contexts" and refused.value.fields["rejected_chars"] == 5
    b = contexts.get("b")
    assert b is not None and b.current is not None
    b_utt = b.current
    await b.finish()
    order.playing.clear()  # its audio was all sent: "b" has nothing open and nothing playing
    assert contexts.open("c").context_id == "c" and contexts.get("b") is None
    stamped = contexts.stamped(AudioWaiting(utterance_index=b_utt.index, reason="queue", ahead=None))
    assert stamped.context_id == "b"  # an event of a closed context's utterance still names it
    untouched = contexts.stamped(AudioWaiting(utterance_index=99, reason="queue", ahead=None))
    assert untouched.context_id is msgspec.UNSET


async def test_a_cancel_takes_one_context_and_leaves_the_others() -> None:
    view, out, order = FakeView(), FakeOut(), FakeOrder()
    contexts = Contexts(view, out, order)
    await contexts.open("a").text("First.")
    await contexts.open("a").finish()  # "a" has one playing ...
    await contexts.open("a").text("Second")  # ... and one open
    await contexts.open("b").text("Other")
    victims = contexts.victims("a")
    assert sorted(u.index for u in victims) == [0, 1] and all(u.context_id == "a" for u in victims)
    assert contexts.get("a").current is None  # type: ignore[union-attr]
    assert contexts.current is not None and contexts.current.context_id == "b"
    assert [u.context_id for u in contexts.victims(None)] == ["a", "b"]  # no context_id: every context's


# -- Playout and Pump --------------------------------------------------------------------------------


def collaborators(*, interleaved: bool = False, **config: Any) -> tuple[FakeView, FakeOut, Playout, Contexts]:
    """The real intake, order and pump over the fakes, wired as the Connection wires them."""
    view, out = FakeView(**config), FakeOut()
    contexts: Contexts | None = None
    playout = Playout(view, out, detach=lambda utt: contexts is not None and contexts.detach(utt),
                      interleaved=interleaved)  # fmt: skip
    contexts = Contexts(view, out, playout, interleaved=interleaved)
    return view, out, playout, contexts


async def frames(outbox: Outbox) -> list[Outgoing]:
    got: list[Outgoing] = []
    while len(outbox):
        got.append(await outbox.get())
    return got


async def test_utterances_play_in_the_order_they_began_whichever_the_engine_makes_first() -> None:
    view, out, playout, contexts = collaborators()
    first, second = contexts.open("a"), contexts.open("b")
    await first.text("One.")
    await second.text("Two.")
    await second.finish()
    await first.finish()
    s1, s2 = (intake.latest.stream for intake in (first, second))  # type: ignore[union-attr]
    assert isinstance(s1, FakeStream) and isinstance(s2, FakeStream)
    s2.feed(loud(0.3), StreamEnd("done"))  # the second is made first ...
    await asyncio.sleep(0.05)
    assert not out.of(AudioStart)  # ... and waits for the first's turn
    s1.feed(Waiting("capacity", 2), loud(0.3), StreamEnd("done"))
    async with asyncio.timeout(WAIT_S):
        await playout.wait()
    assert [ev.utterance_index for ev in out.of(AudioStart)] == [0, 1]
    assert [ev.utterance_index for ev in out.of(SessionDone)] == [0, 1]
    assert [(ev.reason, ev.ahead) for ev in out.of(AudioWaiting)] == [("capacity", 2)]
    audio = [f.utterance for f in await frames(out.outbox) if f.is_audio]
    assert audio and audio == sorted(audio)  # every frame of 0 before any of 1
    assert [(i, cancelled) for i, _, cancelled in view.session.log] == [(0, False), (1, False)]
    assert not playout.playing and playout.last_utterance is not None and playout.last_utterance.index == 1


async def test_interleaved_contexts_each_play_in_order_beside_the_others_each_heard_apart() -> None:
    """Where contexts interleave (a provider wire that tags audio with its context), a context's audio is
    sent as it is made, whatever another context still has to send; within a context the order holds. Each
    named context has a listener of its own, so its first stream is nobody's continuation."""
    view, out, playout, contexts = collaborators(interleaved=True)
    a, b = contexts.open("a"), contexts.open("b")
    await a.text("One.")
    await a.finish()
    a1 = a.latest
    await a.text("Two.")
    await a.finish()
    a2 = a.latest
    await b.text("Three.")
    await b.finish()
    b1 = b.latest
    assert a1 and a2 and b1 and a1.stream and a2.stream and b1.stream
    s_a1, s_a2, s_b1 = a1.stream, a2.stream, b1.stream
    assert isinstance(s_a1, FakeStream) and isinstance(s_a2, FakeStream) and isinstance(s_b1, FakeStream)
    s_a2.feed(loud(0.3), StreamEnd("done"))  # a's second, made first, waits for a's first ...
    s_b1.feed(loud(0.3), StreamEnd("done"))  # ... b's goes out while a's first has sent nothing
    async with asyncio.timeout(WAIT_S):
        while not out.of(SessionDone):
            await asyncio.sleep(0.01)
    assert [ev.utterance_index for ev in out.of(AudioStart)] == [b1.index]
    s_a1.feed(loud(0.3), StreamEnd("done"))
    async with asyncio.timeout(WAIT_S):
        await playout.wait()
    assert [ev.utterance_index for ev in out.of(AudioStart)] == [b1.index, a1.index, a2.index]
    audio = [f.utterance for f in await frames(out.outbox) if f.is_audio]
    assert [i for i in audio if i != b1.index] == sorted(i for i in audio if i != b1.index)  # a's in order
    assert a1.listener is a2.listener and a1.listener is not b1.listener
    assert view.listener not in (a1.listener, b1.listener)  # the session's player hears neither
    assert a1.listener is not None and a1.listener.queued > 0  # a's audio counted as a's listener's


async def test_a_cancel_stops_the_stream_purges_its_audio_and_names_it() -> None:
    view, out, playout, contexts = collaborators()
    intake = contexts.default
    await intake.text("A long reply.")
    await intake.finish()
    utt, stream = playout.playing[0], view.streams[0]
    stream.feed(loud(0.5))
    async with asyncio.timeout(WAIT_S):
        while not utt.sent_bytes:
            await asyncio.sleep(0.01)
    assert await playout.cancel([utt], notify=True) == 1
    await settled(utt.pump)
    assert stream.cancelled and not playout.playing
    (cancelled,) = out.of(AudioCancelled)
    assert cancelled.utterance_index == utt.index and cancelled.played_bytes == utt.sent_bytes > 0
    assert not out.of(AudioDone) and view.session.log == [(utt.index, utt.spoken_text, True)]
    assert not [f for f in await frames(out.outbox) if f.is_audio]  # its queued audio was purged
    await playout.nothing_to_cancel(playout.last_utterance)  # a second cancel is still answered
    late = out.of(AudioCancelled)[-1]
    assert late.cancelled is False and late.utterance_index == utt.index


async def test_a_stream_that_ends_before_input_done_detaches_and_names_what_was_not_spoken() -> None:
    view, out, _, contexts = collaborators()
    intake = contexts.default
    await intake.text("First sentence. Second sentence. And the rest")
    utt = intake.current
    assert utt is not None
    view.streams[0].feed(loud(0.2, segment=0), StreamEnd("done"))
    await settled(utt.pump)
    assert intake.current is None  # detached: later text starts the next utterance
    (error,) = out.of(Error)
    assert error.code == "engine_error" and error.segment_indexes == [1]
    assert "before input.done" in error.message and "And the rest" in error.message
    assert out.of(AudioDone)[0].error is True and out.of(SessionDone)[0].utterance_index == utt.index


async def test_a_file_past_its_bound_is_sent_cut_and_says_so() -> None:
    view, out, playout, contexts = collaborators(response_format="wav")
    view.limits = Limits(max_file_audio_s=0.5)
    intake = contexts.default
    await intake.text("A reply far too long for its file.")
    await intake.finish()
    utt, stream = playout.playing[0], view.streams[0]
    stream.feed(loud(0.3), loud(0.3, first_frame=int(0.3 * RATE)), loud(0.3, first_frame=int(0.6 * RATE)))
    await settled(utt.pump)
    assert stream.cancelled  # the rest is not made
    assert [e.code for e in out.of(Error)] == ["file_too_long"]
    files = [f for f in await frames(out.outbox) if isinstance(f.data, bytes)]
    assert len(files) == 1 and files[0].data[:4] == b"RIFF"


async def test_a_client_that_stops_reading_stops_the_connection() -> None:
    view, out, playout, contexts = collaborators()
    out.outbox = Outbox(1, 0.05)  # one frame, then a put waits 50 ms and gives up
    intake = contexts.default
    await intake.text("Hello.")
    await intake.finish()
    utt = playout.playing[0]
    view.streams[0].feed(*[loud(0.1, first_frame=i * 2400) for i in range(5)], StreamEnd("done"))
    started = time.monotonic()
    await settled(utt.pump)
    assert out.stopped and time.monotonic() - started < WAIT_S
