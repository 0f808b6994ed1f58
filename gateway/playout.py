"""A connection's utterances from input.done to their last audio: one pump task each, chained so their
audio leaves in order (the next synthesises while the one before plays), and cancelled together or
one by one.

The chain is the session's (the native protocol: its binary frames name no utterance, so the order is
what tells the client whose audio it is), or, where contexts interleave, each context's: a provider wire
that tags every audio message with its context (ElevenLabs' multi-stream-input) gets each context's audio
as it is made, as ElevenLabs sends it, and its client picks what to play.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

from msgspec import UNSET

from gateway import metrics
from gateway.outbox import SlowClient
from gateway.protocol import AudioCancelled, AudioWaiting
from gateway.pump import Pump, codec_done
from gateway.queued_stream import QueuedStream
from gateway.seams import Emitter, SessionView
from gateway.utterance import Utterance

log = logging.getLogger("voxgate.ws")


class Playout:
    """The playing order (a `PlayOrder`). It reads the session through `view` and tells the client through
    `out`; `detach` ends an utterance's text intake early (the engine ended its stream before input.done)."""

    def __init__(self, view: SessionView, out: Emitter, detach: Callable[[Utterance], bool], *,
                 interleaved: bool = False) -> None:  # fmt: skip
        self._view, self._out = view, out
        self._audio = Pump(view, out, self.release_slot, detach)
        self.playing: deque[Utterance] = deque()  # finished input, audio still to send, in order
        self.last_utterance: Utterance | None = None  # the last whose pump ended (what a late cancel names)
        self.interleaved = interleaved  # each context its own order (see the module doc)
        # The turn of the utterance begun last: the session's (key None), or each context's when interleaved.
        self._last_turn: dict[str | None, asyncio.Future[None]] = {}

    def reserve(self, utt: Utterance) -> None:
        """The utterance's place in the order, taken when it begins: after the one begun before it in the
        session (contexts play in the order their utterances began, whichever speaks first), or, when
        contexts interleave, in its context."""
        key = utt.context_id if self.interleaved else None
        utt.after, utt.turn = self._last_turn.get(key), asyncio.get_running_loop().create_future()
        if key not in self._last_turn and len(self._last_turn) >= 64:
            # Contexts come and go: a done turn orders nothing (its successor starts at once), so those go.
            # Bounded without it too: the live ones are bounded by max_contexts and max_open_utterances.
            for k in [k for k, turn in self._last_turn.items() if turn.done()]:
                del self._last_turn[k]
        self._last_turn[key] = utt.turn

    def start(self, utt: Utterance) -> asyncio.Task[None]:
        """The utterance's pump, started when its engine stream opens (or its input is over): it sends the
        audio once every utterance before it has been sent."""
        if utt.stream is not None and utt.engine_at is None:
            # Its first segment is appended right after, with no await between (under admission the
            # stream is a QueuedStream, and this is set again when admission lets the text go in).
            utt.engine_at = time.monotonic()
        return asyncio.create_task(self._pump(utt))

    def finished(self, utt: Utterance) -> None:
        """Its input is over (input.done): the engine stream finishes, the audio plays out in order."""
        utt.finished = True
        if utt.stream is not None:
            utt.stream.finish()
        else:
            utt.pump = self.start(utt)  # no audio: the pump still closes it in order
        assert utt.pump is not None
        if not utt.pump.done():  # one the engine ended early has told its client already
            self.playing.append(utt)

    async def wait(self) -> None:
        """Until every utterance whose input is over has been sent."""
        for utt in list(self.playing):
            if utt.pump is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await utt.pump

    async def cancel(self, victims: Iterable[Utterance], notify: bool) -> int:
        """Stop `victims` now: generation, queued audio, and any audio still to come; each is named in
        `audio.cancelled` (`codec.done` in codec mode) when `notify`. Returns how many there were."""
        view, out, victims = self._view, self._out, list(victims)
        for utt in victims:
            with contextlib.suppress(ValueError):
                self.playing.remove(utt)
            utt.cancelled = True
            if utt.pump is None:  # never started: its turn passes once those before it are done
                self._pass_on(utt)
            if utt.stream is not None:
                utt.stream.cancel()
            out.outbox.cancel_audio(utt.index)
            if utt.pump is None or utt.pump.done():
                out.outbox.settled(utt.index)  # no pump: no later audio to keep out
            view.backlog.forget(utt)
        if notify:
            metrics.CANCELS.inc()
        for utt in victims:
            spoken = utt.spoken_text
            await view.session.record(utt.index, spoken, cancelled=True)
            if notify and view.codec_mode:
                await out.emit(codec_done(utt, error=False, cancelled=True, spoken_text=spoken, **utt.heard_fields()))
            elif notify:
                await out.emit(AudioCancelled(utterance_index=utt.index, played_bytes=utt.sent_bytes,
                                              spoken_text=spoken, **utt.heard_fields()))  # fmt: skip
        return len(victims)

    async def nothing_to_cancel(self, last: Utterance | None, context_id: str | None = None) -> None:
        """A cancel with nothing queued or playing is answered all the same (a client waiting for the
        acknowledgement must not hang): `audio.cancelled {cancelled: false}` for `last`, the last utterance
        (of the context named), whose audio was all sent (null index, 0 bytes: there has been none)."""
        await self._out.emit(AudioCancelled(
            utterance_index=None if last is None else last.index, played_bytes=0 if last is None else last.sent_bytes,
            spoken_text="" if last is None else last.spoken_text, cancelled=False,
            **({} if last is None else last.heard_fields()),
            context_id=UNSET if context_id is None else context_id,
        ))  # fmt: skip

    def _pass_on(self, utt: Utterance) -> None:
        """`utt` is done with: its turn is over once the one before it is (the order holds past a cancel)."""
        def over(_: object = None) -> None:
            if utt.turn is not None and not utt.turn.done():
                utt.turn.set_result(None)

        if utt.after is None or utt.after.done():
            over()
        else:
            utt.after.add_done_callback(over)

    async def _pump(self, utt: Utterance) -> None:
        """Send one utterance's audio once every utterance before it has been sent."""
        if utt.after is not None:
            await asyncio.wait({utt.after})  # a wait, not an await: cancelling this pump leaves the turn alone
        out = self._out
        try:
            if utt.cancelled:
                return
            await self._queued(utt)
            await self._audio.run(utt)
        except SlowClient:
            out.stop()
        except Exception:  # one utterance's failure must not take the session down silently
            log.exception("session %s: utterance %d failed", self._view.session_id, utt.index)
            utt.cancelled = True
            if utt.stream is not None:
                utt.stream.cancel()
            with contextlib.suppress(SlowClient):
                await out.error("internal_error", "the utterance failed", utterance_index=utt.index)
        finally:
            if utt.stream is not None or not utt.cancelled:  # one cancelled before it spoke was never played
                self.last_utterance = utt
            if utt in self.playing:
                self.playing.remove(utt)
            self._view.backlog.forget(utt)
            out.outbox.settled(utt.index)
            self._pass_on(utt)
            await self.release_slot(utt)

    async def _queued(self, utt: Utterance) -> None:
        """The utterance's turn to play has come while admission still holds its stream: say why audio
        is late, and wait (admission bounds the wait; a cancel ends it)."""
        stream = utt.stream
        if isinstance(stream, QueuedStream) and stream.queued:
            await self._out.emit(AudioWaiting(utterance_index=utt.index, reason="queue", ahead=stream.ahead()))
            await stream.settled()

    async def release_slot(self, utt: Utterance) -> None:
        """The engine is done with the utterance: its admission and its tenant's stream slot go back."""
        if isinstance(utt.stream, QueuedStream):
            utt.stream.release()
        slot, utt.slot = utt.slot, None
        if slot is not None:
            with contextlib.suppress(Exception):
                await slot.release()
