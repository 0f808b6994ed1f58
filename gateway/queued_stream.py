"""The WebSocket side of admission: an engine stream that opens once admitted (`QueuedStream`), holding
the text appended meanwhile, so the connection's reader never waits for admission (a cancel is still
read); and an admitted stream that counts its audio to its ticket (`TicketedStream`, `ticketed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from engine import AudioChunk, CodecFrames, Engine, EngineError, Stream, StreamEnd, StreamEvent, Waiting
from engine.fair_queue import Waiter
from engine.languages import canonical_language, text_language
from gateway.admission import Admission, Listener, Place, QueueFull, Speaks, Ticket
from gateway.protocol import ProtocolError

log = logging.getLogger("voxgate.admission")


def spoken_language(language: str | None, text: str) -> str:
    """The language a stream asked to speak `language` speaks `text` in, as its cost goes: the language
    given, by its canonical name ("English", "en-US" → "en"), or for "auto" the text's (`text_language`:
    Mandarin where it holds a Han character, as the CPU voices choose)."""
    lang = canonical_language(language or "")
    return text_language(text) if lang == "auto" else lang


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
                self._ticket.heard()  # the first: the SLO's measure (later ones are ignored)
                self._ticket.served(ev.pcm.size / ev.sample_rate)
            elif isinstance(ev, CodecFrames) and not ev.prime:
                self._ticket.heard()
                self._ticket.served(ev.codes.shape[0] / self._frame_rate)
            elif isinstance(ev, Waiting) and ev.reason == "pacing":
                # Its first audio is made and held for pacing: the box's speed is measured to here (the
                # hold waits on the client's text as much as on the box; engine/types.py `Waiting`).
                self._ticket.heard()
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
        listener: Listener | None = None,
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
        ticket = admission.try_admit(tenant, weight, listener=listener, language=language, voice=voice)
        if ticket is not None:  # room and nobody waiting: open now, the first text goes straight in
            self._waiter = ticket.waiter
            self._start(ticket)
            return
        refusal: QueueFull | None = None
        try:  # its place is taken now, so `ahead` knows it before the admission task first runs
            self._place = admission.enqueue(tenant, weight, listener=listener, language=language, voice=voice)
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
        now on (`Admission.rekind`), waiting or admitted."""
        if self._reads_text and self._speaks[0] != "zh" and text_language(text) == "zh":
            self._speaks = ("zh", self._speaks[1])
            if self._waiter is not None:
                self._admission.rekind(self._waiter, self._speaks)

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

    def events(self) -> AsyncIterator[StreamEvent]:
        """The stream's events. Admitted and open already (as most are by the time their audio is read),
        the open stream's own: no layer that only passes each event on."""
        if self.stream is not None and (self._task is None or self._task.done()):
            return self.stream.events()
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
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
