"""Admission at the gateway: engine/fair_queue.py's policy on the event loop, priced by the engine.

`Admission` (one per model): `ticket = await admission.admit(tenant, weight)` returns once the engine has
room and it is this tenant's turn, or raises `QueueFull` naming the bound that refused it ("slo": it
would be heard past the `first_audio_slo_s` setting). The ticket is released when the stream ends, told
the audio served (fairness) and when its first audio came (the SLO's measure). The policy is all in
`FairQueue`: this reads the engine's word (`Capacity`) at every look, resolves the waits the policy
decides, and looks when a ticket is released and on a timer while anyone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from engine import Capacity, Engine
from engine.fair_queue import Bound, FairQueue, FairQueueConfig, Refused, Waiter
from engine.listening import ListenerTimeline
from gateway.protocol import ProtocolError

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger("voxgate.admission")

# What a stream speaks, (language, voice), None where unsaid: what its cost is read by (`Waiter.kind`).
Speaks = tuple[str | None, str | None]
Price = Callable[[str | None, str | None], float]  # (language, voice) → what such a stream costs
Classify = Callable[[str | None, str | None], str]  # (language, voice) → its class of voice (`Capacity.voice_class`)


class Listener(Protocol):
    """Whose streams a stream is one of (a session's player), compared by identity."""

    def timeline(self) -> ListenerTimeline | None:
        """Its timeline on time.monotonic (when the audio sent to it runs out); None while it hears none."""
        ...


def _timeline(listener: object) -> ListenerTimeline | None:
    """A listener's timeline, on time.monotonic: admission's clock is the listeners' clock."""
    return cast(Listener, listener).timeline()


def _price(measured: Capacity | None) -> Price:
    """What a stream costs by the engine's cost model (`Capacity.price`); one each where it has none."""
    return (lambda language, voice: 1.0) if measured is None else measured.price


def _classify(measured: Capacity | None) -> Classify:
    """Which class of voice a stream's first audio is forecast by (the engine's word); "" where it tells none."""
    return (lambda language, voice: "") if measured is None else measured.voice_class


_UNPRICED = object()


def _pricing(measured: Capacity | None) -> object:
    """What `Capacity.price` reads: two capacities alike in it price every stream alike."""
    return None if measured is None or measured.budget is None else (measured.budget, measured.costs,
                                                                    measured.voice_costs)


_BOUNDS = {
    "tenant": "too many streams of this tenant are waiting for the engine",
    "model": "too many streams are waiting for the engine",
    "wait": "the stream waited for the engine past the longest wait allowed",
    "slo": "the stream would be heard past the first-audio target",
}


class QueueFull(ProtocolError):
    """A stream admission refused: `bound` is "tenant", "model", "wait" or "slo"; `retry_after_s` a hint.
    Refused by the SLO, it names it (`first_audio_slo_s`) and when it would have been heard."""

    def __init__(self, bound: Bound, retry_after_s: float, *, slo_s: float | None = None,
                 predicted_s: float | None = None) -> None:
        self.bound: Bound = bound
        self.retry_after_s = max(1.0, retry_after_s)
        fields: dict[str, object] = {"bound": bound, "retry_after_s": round(self.retry_after_s, 1)}
        message = _BOUNDS[bound]
        if bound == "slo" and slo_s is not None:
            fields["first_audio_slo_s"] = slo_s
            message += f" (first_audio_slo_s = {slo_s:g} s"
            if predicted_s is not None:
                fields["predicted_first_audio_s"] = round(predicted_s, 2)
                message += f"; predicted {predicted_s:.1f} s"
            message += ")"
        super().__init__("queue_full", f"{message}; retry in {self.retry_after_s:.0f} s", **fields)

    @property
    def retry_after_header(self) -> str:
        """HTTP's Retry-After: whole seconds, at least 1."""
        return str(math.ceil(self.retry_after_s))


def queue_config(settings: Settings) -> FairQueueConfig:
    """The policy's knobs from the gateway's settings (the rest keep the policy's defaults)."""
    return FairQueueConfig(
        max_waiting_per_key=settings.max_waiting_per_tenant, max_waiting=settings.max_waiting_per_model,
        max_wait_s=settings.max_queue_wait_s, continuation_lead_s=settings.continuation_lead_s,
        max_in_flight=settings.max_active_streams, first_audio_slo_s=settings.first_audio_slo_s or None,
    )


@dataclass(frozen=True, slots=True)
class Place:
    """A stream's place in the line: its waiter, and the future resolved at its turn (None: admitted)."""

    waiter: Waiter
    turn: asyncio.Future[None] | None


class Ticket:
    """An admitted stream's hold on the engine's capacity."""

    def __init__(self, admission: Admission, waiter: Waiter) -> None:
        self._admission = admission
        self.waiter = waiter
        # A ticket dropped without release would shrink the capacity for good: give it back, and say so.
        self._finalizer = weakref.finalize(self, admission._leaked, waiter)
        self._finalizer.atexit = False

    @property
    def waited_s(self) -> float:
        return self.waiter.waited_s

    def served(self, audio_s: float) -> None:
        """Audio seconds sent for this stream (the tenant's fairness account)."""
        self._admission._queue.served(self.waiter, audio_s)

    def heard(self) -> None:
        """Its first audio came (the SLO's measure): the waiters' predictions move with it, so they are
        judged again now, not at the next timed look."""
        if self._admission._queue.heard(self.waiter) and self._admission.waiting:
            self._admission._tick()

    def release(self) -> None:
        """The stream no longer uses the engine. Idempotent."""
        if self._finalizer.detach() is not None:
            self._admission._release(self.waiter)


class Admission:
    def __init__(self, engine: Engine, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self._ceiling = settings.max_active_streams
        self._queue = FairQueue(queue_config(settings), clock)
        self._futures: dict[Waiter, asyncio.Future[None]] = {}  # the waiting places (bounded by the line)
        self._timer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe_failed = False
        # What the streams' costs were last read by (`_pricing`): re-read only when it moves, not at every look
        # (each look at 256 streams in flight re-read 256 costs, three looks per stream; bench/results/capacity_s25.md).
        self._priced: object = _UNPRICED

    @property
    def waiting(self) -> int:
        return self._queue.waiting

    @property
    def admitted(self) -> int:
        return self._queue.in_flight

    @property
    def load(self) -> float:
        """The cost of the admitted streams, in the capacity's units."""
        return self._queue.load

    def first_audio_alone_s(self) -> dict[str, float]:
        """This box's measured start-to-first-audio time of a stream alone, at the tail, per class of voice
        ("": the engine tells none), from the engine's word now: what the first-audio SLO's forecast starts
        from. Bounded (`FairQueueConfig.first_audio_voices`)."""
        self._told(self._measured())
        return {voice: self._queue.first_audio_tail_s(voice) for voice in self._queue.forecast.voices or [""]}

    def slo_room(self) -> dict[str, float]:
        """The capacity the first-audio SLO last left a listener's first stream (the load's units), per
        class of voice as `first_audio_alone_s`."""
        return {voice: self._queue.slo_room(voice) for voice in self._queue.forecast.voices or [""]}

    def _told(self, measured: Capacity | None) -> None:
        """The engine's word on each class of voice's first audio: the forecast's priors (a failed probe
        keeps the last word)."""
        if measured is not None:
            self._queue.forecast.estimates(measured.first_audio_s)

    def engine_capacity(self) -> Capacity | None:
        """The engine's own word on its capacity (None: it cannot tell); may raise."""
        return self._engine.capacity()

    def capacity(self) -> float:
        """What may be admitted now: the engine's judgement (the cost it carries, or how many streams),
        capped by the setting (a count: `max_in_flight` keeps it beside a cost)."""
        return self._slots(self._measured())

    def cost(self, language: str | None = None, voice: str | None = None) -> float:
        """What a stream in `language` (`voice`: None, the language's default) would hold now."""
        return _price(self._measured())(language, voice)

    def ahead(self, waiter: Waiter) -> int:
        return self._queue.ahead(waiter)

    def _measured(self) -> Capacity | None:
        """The engine's word on its capacity; None when it cannot tell or its probe fails (logged once)."""
        try:
            measured = self.engine_capacity()
            self._queue.engine_behind(0.0 if measured is None else measured.behind_s)
            return measured
        except Exception:  # the engine's estimate is advice: never let it stop admission
            if not self._probe_failed:
                log.exception("engine.capacity() failed; admitting up to max_active_streams")
                self._probe_failed = True
            return None

    def _slots(self, measured: Capacity | None) -> float:
        if measured is None:
            return self._ceiling
        if measured.budget is not None:
            return max(0.0, measured.budget)  # one stream always has room (FairQueue.fits): never a deadlock
        return max(1, min(self._ceiling, measured.streams))

    def _look(self) -> tuple[Price, float, bool, Classify]:
        """The price of a stream, the capacity, whether the engine follows listeners and a stream's class
        of voice, by its word now, with every stream's cost re-read when its pricing moved (one held at its
        admission cost would let newcomers in on top) and its word on each class's first audio (the
        forecast's priors)."""
        measured = self._measured()
        price = _price(measured)
        if (pricing := _pricing(measured)) != self._priced:  # a stream's kind moving is re-read as it moves (`rekind`)
            self._queue.recost(lambda kind: price(*cast(Speaks, kind)))
            self._priced = pricing
        self._told(measured)
        follows = measured is not None and measured.follows_listener
        return price, self._slots(measured), follows, _classify(measured)

    def rekind(self, waiter: Waiter, kind: Speaks) -> None:
        """A stream now speaks `kind` (an "auto" stream turned to Han text): it costs what such a stream costs,
        waiting or admitted, from now on."""
        self._queue.rekind(waiter, kind, self.cost(*kind))

    def try_admit(self, tenant: str, weight: float, *, listener: Listener | None = None,
                  language: str | None = None, voice: str | None = None) -> Ticket | None:
        """A ticket at once when there is room (what the first-audio SLO leaves of the capacity) and nobody
        waits who goes first; None otherwise (then `enqueue` decides). `listener`: whose stream it is;
        `language` and `voice`: its cost."""
        price, capacity, follows, classify = self._look()
        cost, voice_class = price(language, voice), classify(language, voice)
        if self._queue.waiting or not self._queue.fits(cost, self._queue.slo_capacity(capacity, voice_class)):
            return None
        self._loop = asyncio.get_running_loop()
        # Where its listener is, as `enqueue` tells it: one still hearing audio is a continuation, not a
        # leader, whichever way it starts (told none, one admitted at once was measured as a leader, and
        # its first audio, due by design when that audio runs out, read as this box's speed).
        waiter = self._queue.push(tenant, weight, capacity, cost=cost, kind=(language, voice), listener=listener,
                                  timeline=None if listener is None else _timeline(listener),
                                  follows=follows, voice=voice_class)  # fmt: skip
        return Ticket(self, waiter)

    def enqueue(self, tenant: str, weight: float, *, listener: Listener | None = None,
                language: str | None = None, voice: str | None = None) -> Place:
        """Take a place in the line now (or room at once); raises QueueFull (a refusal is decided here,
        at once, where the policy can). `wait(place)` returns its ticket. Synchronous, so the place is
        known (`ahead`) from the moment the stream asks."""
        self._loop = asyncio.get_running_loop()
        price, capacity, follows, classify = self._look()
        try:
            waiter = self._queue.push(tenant, weight, capacity, cost=price(language, voice), kind=(language, voice),
                                      timeline=None if listener is None else _timeline(listener),
                                      listener=listener, follows=follows, voice=classify(language, voice))  # fmt: skip
        except Refused as e:
            raise self._refusal(e) from None
        if waiter.state != "waiting":
            return Place(waiter, None)
        self._futures[waiter] = self._loop.create_future()
        place = Place(waiter, self._futures[waiter])
        self._tick()  # it may pass in the room others leave
        if self._queue.waiting and (self._timer is None or self._timer.done()):
            self._timer = asyncio.create_task(self._recheck())
        return place

    async def wait(self, place: Place) -> Ticket:
        """The place's ticket once it is its turn; raises QueueFull. A cancelled wait is withdrawn."""
        if place.turn is not None:
            try:
                await place.turn
            except asyncio.CancelledError:
                self.withdraw(place)
                raise
        return Ticket(self, place.waiter)

    async def admit(self, tenant: str, weight: float, *, listener: Listener | None = None,
                    language: str | None = None, voice: str | None = None) -> Ticket:
        """Wait until the stream may start; raises QueueFull. A cancelled wait is withdrawn."""
        return await self.wait(self.enqueue(tenant, weight, listener=listener, language=language, voice=voice))

    def withdraw(self, place: Place) -> None:
        """Give a place up whose ticket nobody holds: withdrawn, or, admitted just now, its slot given
        back. Idempotent."""
        self._futures.pop(place.waiter, None)
        self._release(place.waiter)

    def _release(self, waiter: Waiter) -> None:
        _, capacity, follows, _ = self._look()
        self._queue.release(waiter, capacity, follows=follows)
        self._tick()

    def _tick(self) -> None:
        """A look: the policy decides, the waits it decided are resolved."""
        _, capacity, follows, _ = self._look()
        self._queue.look(capacity, follows=follows, timeline_of=_timeline)
        self._settle()

    def _settle(self) -> None:
        """Resolve the waits the policy decided: admitted, or refused (bounded by the line)."""
        for waiter, future in list(self._futures.items()):
            if waiter.state == "waiting":
                continue
            del self._futures[waiter]
            if future.done():
                continue
            if waiter.state == "admitted":
                future.set_result(None)
            else:
                refused = waiter.refused or Refused("wait", self._queue.config.max_wait_s)
                future.set_exception(self._refusal(refused))

    def _refusal(self, e: Refused) -> QueueFull:
        slo_s = self._queue.config.first_audio_slo_s
        return QueueFull(e.bound, e.retry_after_s, slo_s=slo_s, predicted_s=e.predicted_s)

    def _leaked(self, waiter: Waiter) -> None:
        log.warning("an admission ticket of %r was dropped without release", waiter.key)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._release, waiter)

    async def _recheck(self) -> None:
        # While anyone waits: capacity moves as the engine measures its cost, and waits expire.
        while self._queue.waiting:
            await asyncio.sleep(self._queue.config.recheck_s)
            self._tick()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
