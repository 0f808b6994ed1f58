"""Several contexts on one socket (`context_id` on input.text, input.done, input.cancel).

A context is an utterance stream with its own text intake; the default one (no `context_id`) is the
session as it has always been. Contexts play in the order their utterances began (the next one
synthesises while the one before plays: gateway/playout.py chains their pumps), a cancel names one
context and leaves the others alone, and at most `Limits.max_contexts` named contexts are open at once
(a context whose audio is still being sent is open). Where contexts interleave (a provider wire that
tags each audio message with its context), each named context's audio is sent as it is made and each
has a listener of its own: the engine and admission see its first utterance as one nobody is hearing
yet, not as the continuation of another context's (which its client may have dropped).
Every event about a context's utterance carries its `context_id`: the Connection stamps it on the way
out (`tag`), so no event built anywhere can forget it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import msgspec

from gateway.intake import TextIntake
from gateway.playback import Playback
from gateway.protocol import ProtocolError, ServerEvent, quote
from gateway.seams import Emitter, PlayOrder, SessionView
from gateway.settings import Limits
from gateway.ticker import shared_ticker
from gateway.utterance import Utterance


def tagged_bound(limits: Limits) -> int:
    """How many utterances' contexts are remembered for stamping their events: four times as many as
    can be live at once (each context's open one, and those finished — `max_open_utterances`, each
    context's open one finished past it — until their pumps end), so an event of a live utterance
    always finds its context. Every way an utterance begins is bounded (TextIntake._new)."""
    live = limits.max_open_utterances + 2 * (limits.max_contexts + 1)
    return 4 * live


class Contexts:
    """A socket's text intakes, the default one and the named ones, and the context of each recent
    utterance. It sees the session (`view`), the client (`out`) and the playing order (`order`) only to
    hand them to the intakes it opens."""

    def __init__(self, view: SessionView, out: Emitter, order: PlayOrder, *, interleaved: bool = False) -> None:
        self._view, self._out, self._order = view, out, order
        self._interleaved = interleaved  # each named context heard apart (see the module doc)
        self._limits = view.limits
        self.default = self._intake(None)
        self._named: dict[str, TextIntake] = {}
        self._context_of: dict[int, str] = {}  # utterance index → context_id, the most recent ones
        self._tagged = tagged_bound(view.limits)
        # Set by `tag`, which every utterance's making passes through (TextIntake._new): wakes the poller.
        self._began = asyncio.Event()

    def _intake(self, context_id: str | None) -> TextIntake:
        own = Playback(count_underruns=False) if self._interleaved and context_id is not None else None
        return TextIntake(self._view, self._out, self._order, self.tag, context_id, listener=own)

    def __iter__(self) -> Iterator[TextIntake]:
        yield self.default
        yield from list(self._named.values())

    def get(self, context_id: str | None) -> TextIntake | None:
        return self.default if context_id is None else self._named.get(context_id)

    def open(self, context_id: str | None, rejected_chars: int = 0) -> TextIntake:
        """The context's intake, opened if needed; past `max_contexts` open ones: `too_many_contexts`."""
        intake = self.get(context_id)
        if intake is not None:
            return intake
        assert context_id is not None
        self._prune()
        bound = self._limits.max_contexts
        if len(self._named) >= bound:
            refused = f" ({rejected_chars} characters of input.text not accepted)" if rejected_chars else ""
            raise ProtocolError(
                "too_many_contexts",
                f"context {quote(context_id)} was not opened{refused}: {bound} contexts are open on this socket; "
                "finish or cancel one first",
                context_id=context_id, **({"rejected_chars": rejected_chars} if rejected_chars else {}),
            )  # fmt: skip
        intake = self._named[context_id] = self._intake(context_id)
        return intake

    def _prune(self) -> None:
        """Named contexts with nothing open and nothing playing are closed."""
        playing = {utt.context_id for utt in self._order.playing}
        for cid, intake in list(self._named.items()):
            if intake.current is None and cid not in playing:
                del self._named[cid]

    def tag(self, utt: Utterance) -> None:
        """`utt` belongs to its context: its events will say so. Every utterance is tagged as it is made,
        before any intake holds it as `current`: the poller wakes to check it."""
        self._began.set()
        if utt.context_id is None:
            return
        self._context_of[utt.index] = utt.context_id
        if len(self._context_of) > self._tagged:
            del self._context_of[next(iter(self._context_of))]

    def stamped(self, ev: ServerEvent) -> ServerEvent:
        """`ev` with its utterance's `context_id` (as it was when no context applies)."""
        if not self._context_of or ev.context_id is not msgspec.UNSET:
            return ev
        context_id = self._context_of.get(getattr(ev, "utterance_index", None))  # type: ignore[arg-type]
        return ev if context_id is None else msgspec.structs.replace(ev, context_id=context_id)

    @property
    def current(self) -> Utterance | None:
        """An utterance receiving text, in any context."""
        return next((i.current for i in self if i.current is not None), None)

    def victims(self, context_id: str | None) -> list[Utterance]:
        """What a cancel stops, their input closed: one context's utterances; with no `context_id`, every
        context's (so a session without contexts cancels as it always has)."""
        every = context_id is None
        intakes = list(self) if every else [i for i in (self.get(context_id),) if i is not None]
        victims = [utt for utt in self._order.playing if every or utt.context_id == context_id]
        for intake in intakes:
            if intake.current is not None:
                victims.append(intake.current)
                intake.current = None
        return victims

    def listeners(self, context_id: str | None) -> list[Playback]:
        """Who hears the context named (with no `context_id`: every context's listeners)."""
        intakes = list(self) if context_id is None else [i for i in (self.get(context_id),) if i is not None]
        return list({id(i.listener): i.listener for i in intakes}.values()) or [self._view.listener]

    def detach(self, utt: Utterance) -> bool:
        return any(intake.detach(utt) for intake in self)

    async def finish_all(self) -> None:
        """session.close: every context's open utterance is finished (the default one as input.done is)."""
        for intake in self:
            if intake.current is not None:
                await intake.finish()
            elif intake is self.default:
                # The default context's bare session.done (as input.done's) is an acknowledgement only:
                # at a bound (max_open_utterances, a drain) the close goes on without it.
                with contextlib.suppress(ProtocolError):
                    await intake.finish()

    async def poller(self) -> None:
        """Idle commits of every context's open utterance, every `poll_interval` while one is open (the
        process's one timer for them all: gateway/ticker.py). With none open it sleeps until one begins
        (`tag`), with no timer: a socket between turns costs nothing (a 1 s backstop timer per socket was
        256 timers a second at 256 sockets; bench/results/capacity_s24.md)."""
        ticker = shared_ticker(self._limits.poll_interval)
        while True:
            if all(intake.current is None for intake in self):
                self._began.clear()
                await self._began.wait()
                continue
            await ticker.wait()
            now = time.monotonic()
            for intake in self:
                await intake.tick(now)
