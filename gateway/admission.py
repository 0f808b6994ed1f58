"""Admission at the gateway: a stream starts only when the engine has room for it, tenants in turn.

`Admission` (one per model, gateway/models.py) puts engine/admission.py's FairQueue on the event
loop: `ticket = await admission.admit(tenant, weight)` returns once the engine's capacity
(`engine.capacity()`, capped by the `max_active_streams` setting) has room and it is this tenant's turn,
or raises `QueueFull` naming the bound that refused it. The ticket is released when the stream ends
(idempotent) and told the audio seconds served (`served`), which is what fairness counts.

A stream holds what it costs the engine (`Capacity.costs`, by its language and voice) of the capacity
where the engine measures one (`Capacity.budget`: the CPU voices), and one of `streams` elsewhere.
Costs are measured and move, so every look re-reads them for every stream, admitted ones too (`_look`).

Room is looked for again when a ticket is released and on a short timer while anyone waits (capacity
moves as the engine measures its cost, and waits past `max_queue_wait_s` are refused on that timer).

`QueuedStream` is the WebSocket side: an engine stream that opens once admitted, holding the text
appended meanwhile, so the connection's reader never waits for admission (a cancel is still read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from engine import AudioChunk, Capacity, CodecFrames, Engine, EngineError, Stream, StreamEnd, StreamEvent
from engine.admission import Bound, FairQueue, Refused, Waiter
from engine.languages import canonical_language, text_language
from gateway.protocol import ProtocolError

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger("voxgate.admission")

RECHECK_S = 0.1  # while anyone waits: how often capacity is read again and overdue waits refused

# When (time.monotonic) the listener a stream continues runs out of audio; None while it hears none.
# It also names the listener: streams whose `runs_dry` are equal (one player's bound method) continue
# the same one: the next starts beside the one heard (`FairQueue.admit_beside`) and takes its slot.
RunsDry = Callable[[], float | None]

# What a stream speaks, (language, voice), None where unsaid: what its cost is read by (`FairQueue`'s kind).
Speaks = tuple[str | None, str | None]
Price = Callable[[str | None, str | None], float]  # (language, voice) → what such a stream costs


def spoken_language(language: str | None, text: str) -> str:
    """The language a stream asked to speak `language` speaks `text` in, as its cost goes: the language
    given, by its canonical name ("English", "en-US" → "en"; the cost tables are keyed so), or for "auto"
    (the protocol's default; vLLM-Omni's clients send "Auto") the text's (`text_language`: Mandarin where
    it holds a Han character, as the CPU voices choose). Priced as the costliest voice, every such stream
    on `cpu` was charged Kokoro's cost, ten times Piper's, for an English reply."""
    lang = canonical_language(language or "")
    return text_language(text) if lang == "auto" else lang


def _price(measured: Capacity | None) -> Price:
    """What a stream costs by the engine's word `measured` (its tables read once, for every stream of a
    look). One stream where the engine counts streams. Else its language's cost (that language's
    default voice's), or its voice's where that costs more (a voice that does not speak the language
    leaves it to the default). A language or voice the engine does not cost ("auto" among them): the
    costliest, as the engine may speak it with its costliest voice (never admitted for less)."""
    if measured is None or measured.budget is None:
        return lambda language, voice: 1.0
    by_language, by_voice = dict(measured.costs), dict(measured.voice_costs)
    costliest = max((*by_language.values(), *by_voice.values()), default=measured.budget)  # none told: all

    def price(language: str | None, voice: str | None) -> float:
        default = voice in (None, "default", "auto")  # StreamRequest.voice: the language's default
        if language not in by_language or not (default or voice in by_voice):
            return costliest
        return by_language[language] if default else max(by_language[language], by_voice[cast(str, voice)])

    return price

_BOUNDS = {
    "tenant": "too many streams of this tenant are waiting for the engine",
    "model": "too many streams are waiting for the engine",
    "wait": "the stream waited for the engine past the longest wait allowed",
}


class QueueFull(ProtocolError):
    """A stream admission refused: `bound` is "tenant", "model" or "wait"; `retry_after_s` a hint."""

    def __init__(self, bound: Bound, retry_after_s: float) -> None:
        self.bound: Bound = bound
        self.retry_after_s = max(1.0, retry_after_s)
        message = f"{_BOUNDS[bound]}; retry in {self.retry_after_s:.0f} s"
        super().__init__("queue_full", message, bound=bound, retry_after_s=round(self.retry_after_s, 1))

    @property
    def retry_after_header(self) -> str:
        """HTTP's Retry-After: whole seconds, at least 1."""
        return str(math.ceil(self.retry_after_s))


@dataclass(frozen=True, slots=True)
class Place:
    """A stream's place in the line: its waiter, and the future that resolves at its turn (None:
    admitted at once)."""

    waiter: Waiter
    turn: asyncio.Future[None] | None


class Ticket:
    """An admitted stream's hold on the engine's capacity."""

    def __init__(self, admission: Admission, waiter: Waiter) -> None:
        self._admission = admission
        self._waiter = waiter
        # A ticket dropped without release would shrink the capacity for good: give it back, and say so.
        self._finalizer = weakref.finalize(self, admission._leaked, waiter)
        self._finalizer.atexit = False

    @property
    def waited_s(self) -> float:
        return self._waiter.waited_s

    def served(self, audio_s: float) -> None:
        """Audio seconds sent for this stream (the tenant's fairness account)."""
        self._admission._queue.served(self._waiter, audio_s)

    def release(self) -> None:
        """The stream no longer uses the engine. Idempotent."""
        if self._finalizer.detach() is not None:
            self._admission._finish(self._waiter)


class Admission:
    def __init__(self, engine: Engine, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self._clock = clock
        self._ceiling = settings.max_active_streams
        self._queue = FairQueue(
            max_waiting_per_key=settings.max_waiting_per_tenant,
            max_waiting=settings.max_waiting_per_model,
            max_wait_s=settings.max_queue_wait_s,
            continuation_lead_s=settings.continuation_lead_s,
            clock=clock,
            max_in_flight=settings.max_active_streams,
        )
        self._futures: dict[Waiter, asyncio.Future[None]] = {}
        self._listeners: dict[Waiter, RunsDry] = {}  # the waiting streams that may continue a listener
        self._holders: dict[Waiter, RunsDry] = {}  # the admitted streams of a listener (bounded by capacity)
        self._timer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe_failed = False

    @property
    def waiting(self) -> int:
        return self._queue.waiting

    @property
    def admitted(self) -> int:
        return self._queue.in_flight

    def engine_capacity(self) -> Capacity | None:
        """The engine's own word on its capacity (None: it cannot tell); may raise."""
        return self._engine.capacity()

    @property
    def load(self) -> float:
        """The cost of the admitted streams, in the capacity's units."""
        return self._queue.load

    def capacity(self) -> float:
        """What may be admitted now: the engine's judgement (the cost it carries, or how many streams),
        capped by the setting (a count: `FairQueue.max_in_flight` keeps it beside a cost)."""
        return self._slots(self._measured())

    def cost(self, language: str | None = None, voice: str | None = None) -> float:
        """What a stream in `language` (`voice`: named by its session, None: the language's default)
        would hold of the capacity now."""
        return _price(self._measured())(language, voice)

    def _measured(self) -> Capacity | None:
        """The engine's word on its capacity; None when it cannot tell or its probe fails (logged once)."""
        try:
            return self.engine_capacity()
        except Exception:  # the engine's estimate is advice: never let it stop admission
            if not self._probe_failed:
                log.exception("engine.capacity() failed; admitting up to max_active_streams")
                self._probe_failed = True
            return None

    def _look(self) -> tuple[Price, float]:
        """What a stream costs now and the capacity, by the engine's word now, with every waiting and
        admitted stream's cost re-read from it (bounded by those streams): a stream held at what it
        cost when admitted would let newcomers in on top of it once the box got busier."""
        measured = self._measured()
        price = _price(measured)
        self._queue.recost(lambda kind: price(*cast(Speaks, kind)))
        return price, self._slots(measured)

    def _slots(self, measured: Capacity | None) -> float:
        """`measured` capped by the setting; the setting alone for an engine that cannot tell."""
        if measured is None:
            return self._ceiling
        if measured.budget is not None:
            return max(0.0, measured.budget)  # one stream always has room (FairQueue.fits): never a deadlock
        return max(1, min(self._ceiling, measured.streams))

    def ahead(self, waiter: Waiter) -> int:
        return self._queue.ahead(waiter)

    def _offset(self) -> float:
        """Admission's clock less time.monotonic (a listener's run-dry time is on the latter). Read once
        per look, so the waiting utterances of one listener get one `continue_by` and keep their order."""
        return self._clock() - time.monotonic()

    @staticmethod
    def _continue_by(runs_dry: RunsDry | None, offset: float) -> float | None:
        at = None if runs_dry is None else runs_dry()
        return None if at is None else at + offset

    def try_admit(self, tenant: str, weight: float, *, runs_dry: RunsDry | None = None,
                  language: str | None = None, voice: str | None = None) -> Ticket | None:
        """A ticket at once when there is room and nobody waits who goes first; None otherwise (then
        `admit` decides). `runs_dry` names the listener its stream speaks to (the slot passes on);
        `language` and `voice` what it speaks (its cost)."""
        price, capacity = self._look()
        cost = price(language, voice)
        if self._queue.waiting or not self._queue.fits(cost, capacity):
            return None
        self._loop = asyncio.get_running_loop()
        # admitted by push: there is room
        waiter = self._queue.push(tenant, weight, capacity, cost=cost, kind=(language, voice))
        if runs_dry is not None:
            self._holders[waiter] = runs_dry
        return Ticket(self, waiter)

    def enqueue(self, tenant: str, weight: float, *, runs_dry: RunsDry | None = None,
                language: str | None = None, voice: str | None = None) -> Place:
        """Take a place in the line now (or room at once); raises QueueFull. `wait(place)` returns its
        ticket. Synchronous, so the place is known (`ahead`) from the moment the stream asks. `runs_dry`:
        when the listener this stream continues runs out of audio, None while it hears none
        (engine/admission.py: it goes first in its tenant's line once that is near), asked again at
        every look while it waits: an utterance queued before the audio ahead of it began (a client
        sending sentence by sentence) becomes a continuation once its listener hears it. `language` and
        `voice`: what it speaks, which is what it costs (`cost`, read as it asks)."""
        self._loop = asyncio.get_running_loop()
        try:
            continue_by = self._continue_by(runs_dry, self._offset())
            price, capacity = self._look()
            waiter = self._queue.push(tenant, weight, capacity, continue_by=continue_by,
                                      cost=price(language, voice), kind=(language, voice))
        except Refused as e:
            raise QueueFull(e.bound, e.retry_after_s) from None
        if waiter.state != "waiting":
            if runs_dry is not None:
                self._holders[waiter] = runs_dry
            return Place(waiter, None)
        future = self._loop.create_future()
        self._futures[waiter] = future
        if runs_dry is not None:
            self._listeners[waiter] = runs_dry
            self._beside(runs_dry)
        if waiter.state == "waiting" and self._queue.fits(waiter.cost, capacity):
            self._grant()  # it may pass those ahead of it in the room they leave: at once, not at the next look
        if waiter.state == "waiting" and (self._timer is None or self._timer.done()):
            self._timer = asyncio.create_task(self._recheck())
        return Place(waiter, future)

    async def wait(self, place: Place) -> Ticket:
        """The place's ticket once it is its turn; raises QueueFull (waited past the bound). A cancelled
        wait is withdrawn."""
        if place.turn is not None:
            try:
                await place.turn
            except asyncio.CancelledError:
                self.withdraw(place)
                raise
        return Ticket(self, place.waiter)

    async def admit(self, tenant: str, weight: float, *, runs_dry: RunsDry | None = None,
                    language: str | None = None, voice: str | None = None) -> Ticket:
        """Wait until the stream may start; raises QueueFull. A cancelled wait is withdrawn."""
        return await self.wait(self.enqueue(tenant, weight, runs_dry=runs_dry, language=language, voice=voice))

    def withdraw(self, place: Place) -> None:
        """Give a place up whose ticket nobody holds: withdrawn, or, admitted just now, its slot given
        back. Idempotent."""
        self._futures.pop(place.waiter, None)
        self._listeners.pop(place.waiter, None)
        self._finish(place.waiter)

    def _finish(self, waiter: Waiter) -> None:
        """A place given up or a slot freed. A freed slot stays its listener's: the stream riding it
        holds it now (and that one's next may ride it), or the listener's next waiting stream (the
        earliest) takes it, before anyone else looks."""
        listener = self._holders.pop(waiter, None)
        successor = None
        if listener is not None and listener not in self._holders.values():
            successor = self._next_of(listener)
        if successor is not None and self._queue.hand_over(waiter, successor, self._look()[1]):
            self._started(successor)
        else:
            self._queue.withdraw(waiter)
            if listener is not None:
                self._beside(listener)
        self._grant()

    def _started(self, waiter: Waiter) -> None:
        """A waiter the queue admitted: its wait resolves, and its listener now holds a slot (and its
        next stream, waiting, may start beside it)."""
        future = self._futures.pop(waiter, None)
        if future is not None and not future.done():
            future.set_result(None)
        if (runs_dry := self._listeners.pop(waiter, None)) is not None:
            self._holders[waiter] = runs_dry
            self._beside(runs_dry)

    def _beside(self, listener: RunsDry) -> None:
        """While `listener` holds one admitted stream, its next waiting stream starts beside it
        (engine/admission.py, a listener's next stream). At most two: the one heard and the next. While it
        holds none, its streams having ended as their audio was made, its next takes the slot back once it
        is a continuation (`FairQueue.take_back`)."""
        held = [w for w, r in self._holders.items() if r == listener]  # bounded by the streams in flight
        successor = self._next_of(listener) if len(held) <= 1 else None
        if successor is None:
            return
        measured = self._measured()  # only an engine that makes the next one due after the one heard
        if measured is None or not measured.follows_listener:
            return
        capacity = self._slots(measured)
        if held:
            took = self._queue.admit_beside(held[0], successor, capacity)
        else:
            took = self._queue.take_back(successor, capacity)
        if took:
            self._started(successor)

    def _next_of(self, listener: RunsDry) -> Waiter | None:
        """The listener's earliest waiting stream (a few dozen waiting at most: bounded)."""
        return min((w for w, r in self._listeners.items() if r == listener), key=lambda w: w.seq, default=None)

    def _leaked(self, waiter: Waiter) -> None:
        log.warning("an admission ticket of %r was dropped without release", waiter.key)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._finish, waiter)

    def _grant(self) -> None:
        if self._listeners:  # where each waiting one's listener is now (a few dozen at most: bounded)
            offset = self._offset()
            for waiter, runs_dry in self._listeners.items():
                self._queue.relisten(waiter, self._continue_by(runs_dry, offset))
            # A listener holding no slot may have begun hearing while its next stream waited: it takes the
            # slot back now (`_beside`). Listeners compared by equality (bound methods), a few dozen.
            idle: list[RunsDry] = []
            for runs_dry in self._listeners.values():
                if runs_dry not in idle and runs_dry not in self._holders.values():
                    idle.append(runs_dry)
            for runs_dry in idle:
                self._beside(runs_dry)
        for waiter in self._queue.grant(self._look()[1]):
            self._started(waiter)

    def _expire(self) -> None:
        for waiter in self._queue.expire():
            self._listeners.pop(waiter, None)
            future = self._futures.pop(waiter, None)
            if future is not None and not future.done():
                future.set_exception(QueueFull("wait", self._queue.retry_after(self.capacity())))

    async def _recheck(self) -> None:
        while self._queue.waiting:
            await asyncio.sleep(RECHECK_S)
            self._expire()
            self._grant()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer


class TicketedStream:
    """An admitted engine stream: the audio it yields is counted to its ticket, which is released as the
    stream ends or is cancelled."""

    def __init__(self, stream: Stream, ticket: Ticket, frame_rate_hz: float = 12.5) -> None:
        self._stream = stream
        self._ticket = ticket
        self._frame_rate = frame_rate_hz

    def append(self, text: str) -> None:
        self._stream.append(text)

    def finish(self) -> None:
        self._stream.finish()

    def cancel(self) -> None:
        self._stream.cancel()
        self._ticket.release()

    async def events(self) -> AsyncIterator[StreamEvent]:
        async for ev in self._stream.events():
            if isinstance(ev, AudioChunk):
                self._ticket.served(ev.pcm.size / ev.sample_rate)
            elif isinstance(ev, CodecFrames) and not ev.prime:
                self._ticket.served(ev.codes.shape[0] / self._frame_rate)
            elif isinstance(ev, StreamEnd):
                self._ticket.release()  # before the consumer, which may not come back to this generator
            yield ev
            if isinstance(ev, StreamEnd):
                return


class TicketedEngine:
    """The engine as one admitted request sees it: its stream holds `ticket` (`ticketed`)."""

    def __init__(self, engine: Engine, ticket: Ticket) -> None:
        self._engine = engine
        self._ticket = ticket

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    def open_stream(self, voice: str | None, language: str, **options: object) -> Stream:
        try:
            stream = self._engine.open_stream(voice, language, **options)
        except BaseException:
            self._ticket.release()
            raise
        return TicketedStream(stream, self._ticket)


def ticketed(engine: Engine, ticket: Ticket | None) -> Engine:
    """`engine`, or the engine whose stream holds `ticket` (None: no admission, the engine as is)."""
    return engine if ticket is None else TicketedEngine(engine, ticket)  # type: ignore[return-value]


class RefusedAppend(EngineError):
    """Text appended to a stream admission refused: `queue_full`, with the refusal's bound and hint
    (`fields`, as a QueueFull has them)."""

    def __init__(self, refused: QueueFull) -> None:
        super().__init__("queue_full", f"the utterance was refused: {refused.message}")
        self.fields = dict(refused.fields)


@dataclass(frozen=True, slots=True)
class Refusal(StreamEnd):
    """How a refused QueuedStream ends: its client was told when the refusal came (`on_lost`)."""


# (error, engine append indexes): text a QueuedStream took but the engine will never speak.
OnLost = Callable[[ProtocolError | EngineError, list[int]], Awaitable[None]]


class QueuedStream:
    """An engine stream opened once admission lets it (the Stream protocol meanwhile).

    Text appended before that is held (the gateway's backlog bound keeps it small) and replayed in
    order when the engine stream opens; `finish` and `cancel` likewise. Refused, the text is reported
    through `on_lost` at once (not when the utterance's turn to play comes), later appends raise the
    engine's `queue_full`, and `events()` ends with a `Refusal`."""

    def __init__(
        self,
        admission: Admission,
        tenant: str,
        weight: float,
        open_stream: Callable[[], Stream],
        on_lost: OnLost,
        on_admitted: Callable[[Ticket], None] | None = None,
        frame_rate_hz: float = 12.5,
        runs_dry: RunsDry | None = None,
        language: str | None = None,
        voice: str | None = None,
        text: str = "",
    ) -> None:
        self._admission = admission
        # What it speaks, its cost: "auto" is read from its text, its first (`text`) and later appends'.
        self._reads_text = canonical_language(language or "") == "auto"
        self._speaks: Speaks = (spoken_language(language, text), voice)
        self._open_stream = open_stream
        self._on_lost = on_lost
        self._on_admitted = on_admitted
        self._frame_rate = frame_rate_hz
        self._held: list[str] = []
        self._finished = False
        self._cancelled = False
        self._ended = asyncio.Event()  # finish or cancel came: an unopened stream may end
        self._place: Place | None = None  # its place in the line while it waits
        self.stream: Stream | None = None
        self.ticket: Ticket | None = None
        self.refused: QueueFull | None = None
        self.failed: str | None = None  # the engine stream could not be opened
        self.failed_code = ""  # its EngineError's code (e.g. engine_unavailable)
        self._task: asyncio.Task[None] | None = None
        language = self._speaks[0]
        self._waiter: Waiter | None = None  # its place in the admission queue, waiting or admitted
        ticket = admission.try_admit(tenant, weight, runs_dry=runs_dry, language=language, voice=voice)
        if ticket is not None:  # room and nobody waiting: open now, the first text goes straight in
            self._waiter = ticket._waiter
            self._start(ticket)
            return
        refusal: QueueFull | None = None
        try:  # its place is taken now, so `ahead` knows it before the admission task first runs
            self._place = admission.enqueue(tenant, weight, runs_dry=runs_dry, language=language, voice=voice)
            self._waiter = self._place.waiter
        except QueueFull as e:  # told through the task, as a refusal after a wait is (the held text named)
            refusal = e
        self._task = asyncio.create_task(self._admit(refusal))

    @property
    def queued(self) -> bool:
        """Still waiting for admission (the stream is not open, refused or cancelled yet)."""
        return self._task is not None and not self._task.done() and self.ticket is None

    def ahead(self) -> int | None:
        return None if self._place is None or not self.queued else self._admission.ahead(self._place.waiter)

    async def settled(self) -> None:
        """Return once admission has decided (or the stream was cancelled)."""
        if self._task is not None:
            await asyncio.wait({self._task})

    async def _admit(self, refusal: QueueFull | None) -> None:
        try:
            if refusal is not None:
                raise refusal
            assert self._place is not None
            ticket = await self._admission.wait(self._place)
        except QueueFull as e:
            self.refused = e
            lost, self._held = list(range(len(self._held))), []
            await self._on_lost(e, lost)
            return
        except Exception:  # a bug in admission must not leave the utterance waiting for ever
            log.exception("admission failed")
            self.failed = "admission failed"
            return
        if self._cancelled:  # cancelled as admission came: the slot goes straight back
            ticket.release()
            return
        lost, error = self._start(ticket)
        if error is not None:
            await self._on_lost(error, lost)

    def _start(self, ticket: Ticket) -> tuple[list[int], EngineError | None]:
        """Admitted: open the engine stream and give it the text held meanwhile, with no await in
        between (so a later append comes after it). Returns the held appends the engine refused."""
        self.ticket = ticket
        if self._on_admitted is not None:
            self._on_admitted(ticket)
        try:
            stream = self._open_stream()
        except EngineError as e:
            self.failed, self.failed_code = str(e), e.code
        except Exception as e:  # never lose an utterance silently: it ends with an error
            log.exception("opening an admitted engine stream failed")
            self.failed = f"the engine stream could not be opened ({type(e).__name__})"
        if self.failed is not None:
            ticket.release()
            return [], None
        stream = TicketedStream(stream, ticket, self._frame_rate)
        lost: list[int] = []
        error: EngineError | None = None
        for i, text in enumerate(self._held):  # in order, before any later append (no await in between)
            try:
                stream.append(text)
            except EngineError as e:  # the engine's own backstop: the index is spent all the same
                lost.append(i)
                error = e
        self._held = []
        if self._finished:
            stream.finish()
        self.stream = stream
        return lost, error

    # -- the Stream protocol ------------------------------------------------------------------------

    def append(self, text: str) -> None:
        self._read(text)
        if self.stream is not None:
            self.stream.append(text)
        elif self.refused is not None:
            raise RefusedAppend(self.refused)
        elif not self._cancelled and self.failed is None:  # a failed one names its text as it ends
            self._held.append(text)

    def _read(self, text: str) -> None:
        """An "auto" stream read as English so far that now speaks Han text costs Mandarin's cost, from
        admission's next look on (it re-reads every stream's cost by its `kind`), waiting or admitted."""
        if self._reads_text and self._speaks[0] != "zh" and text_language(text) == "zh":
            self._speaks = ("zh", self._speaks[1])
            if self._waiter is not None:
                self._waiter.kind = self._speaks

    def finish(self) -> None:
        self._finished = True
        self._ended.set()
        if self.stream is not None:
            self.stream.finish()

    def cancel(self) -> None:
        self._cancelled = True
        self._ended.set()
        if self.stream is not None:
            self.stream.cancel()  # its ticket too
        self.release()

    def release(self) -> None:
        """The engine capacity goes back: the ticket is released, or a waiting admission withdrawn."""
        if self.ticket is not None:
            self.ticket.release()
        elif self._task is not None and not self._task.done():
            self._task.cancel()  # wait() withdraws the place ...
            if self._place is not None:
                self._admission.withdraw(self._place)  # ... but a task cancelled before it first ran cannot

    async def events(self) -> AsyncIterator[StreamEvent]:
        await self.settled()
        if self.stream is None:
            # Refused or not opened, it ends only once its utterance does (input.done): text that comes
            # until then is named as it comes, and nothing of the utterance follows its session.done.
            await self._ended.wait()
            if self._cancelled:
                yield StreamEnd("cancelled")
            elif self.refused is not None:
                yield Refusal("error", self.refused.message)
            elif self.failed is not None:
                yield StreamEnd("error", self.failed, self.failed_code)
            else:
                yield StreamEnd("cancelled")
            return
        async for ev in self.stream.events():
            yield ev
            if isinstance(ev, StreamEnd):
                return
