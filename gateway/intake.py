"""A connection's text intake: `input.text` into the segmenter, committed segments into the open
utterance's engine stream, `input.done` and idle commits. It owns the one utterance receiving text
(`current`); the Connection reads the socket and hands it the messages, the Playout sends the audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from engine import EngineError, Stream
from gateway import metrics
from gateway.admission import Ticket
from gateway.lexicons import Respelled, spoken_text
from gateway.outbox import SlowClient
from gateway.playback import Playback
from gateway.protocol import ProtocolError, SegmentCommitted
from gateway.queued_stream import QueuedStream
from gateway.seams import Emitter, PlayOrder, SessionView
from gateway.utterance import Utterance
from segmentation import Segment, StreamSegmenter

# A big input.text is fed to the segmenter this many characters at a time, yielding to the event loop
# between slices: the costliest text (dense clause marks, ~4 ms/KiB; bench/segmentation_bench.py
# --hostile) holds the loop about 2 ms per slice, prose a tenth of that.
FEED_SLICE = 512
# Segments longer than this (split_granularity "none") are normalised off the event loop (~1 ms/KiB).
NORMALIZE_INLINE_CHARS = 1024


def message_of(e: ProtocolError | EngineError) -> str:
    return e.message if isinstance(e, ProtocolError) else str(e)


class TextIntake:
    """One context's intake (gateway/contexts.py); `context_id` None: the session's default one. It reads
    the session through `view`, tells the client through `out`, hands each utterance it begins to the
    playing `order`, and has `tag` note the utterance's context (so its events are stamped with it).
    `listener`: who hears its utterances, where not the session's player (a context of its own, heard
    beside the others: interleaved contexts)."""

    def __init__(self, view: SessionView, out: Emitter, order: PlayOrder, tag: Callable[[Utterance], None],
                 context_id: str | None = None, listener: Playback | None = None) -> None:  # fmt: skip
        self._view, self._out, self._order, self._tag = view, out, order, tag
        self.context_id = context_id
        self._listener = listener
        self.current: Utterance | None = None  # the one receiving text
        self.latest: Utterance | None = None  # the last one begun (what a context's late cancel names)

    @property
    def listener(self) -> Playback:
        """Who hears this context's utterances."""
        return self._listener or self._view.listener

    async def text(self, text: str) -> None:
        if not isinstance(text, str):
            raise ProtocolError("invalid_message", "input.text requires a string value")
        if not text:
            return
        utt = self.current or self._begin(len(text))
        utt.last_input = time.monotonic()  # refused text is input too: the client is not idle
        self._view.backlog.admit(utt, text)
        utt.chars += len(text)
        for i in range(0, len(text), FEED_SLICE):
            if i:
                await asyncio.sleep(0)  # a long message shares the loop with every other session
                if utt.cancelled:
                    return  # a cancel from another replica came in between the slices
                # Still reading the client's message: not idle, so the poller must not finish the
                # utterance under it (its later slices would go to a finished stream: invalid_state).
                utt.last_input = time.monotonic()
            try:
                segments = utt.segmenter.feed(text[i : i + FEED_SLICE])
            except ValueError as e:
                raise ProtocolError("invalid_text", str(e), utterance_index=utt.index) from None
            if segments:  # most pieces end no segment: no coroutine to make and await for nothing
                await self.commit(utt, segments)

    def _begin(self, rejected_chars: int) -> Utterance:
        """A new utterance, opened by its first text (`rejected_chars` of it, named if it is refused)."""
        cfg = self._view.config
        assert cfg is not None
        self.current = self._new(StreamSegmenter(cfg.language_code, cfg.split_granularity), rejected_chars)
        metrics.UTTERANCES.inc()
        return self.current

    def _new(self, segmenter: StreamSegmenter, rejected_chars: int = 0) -> Utterance:
        """An utterance of this context, its place in the playing order taken now. Every utterance is made
        here (by input.text, by an input.done with nothing open, by session.close), so its bounds hold
        for each of them."""
        self._may_begin(rejected_chars)
        utt = self.latest = Utterance(self._view.next_utterance_index(), segmenter, context_id=self.context_id,
                                      listener=self.listener)  # fmt: skip
        self._tag(utt)
        self._order.reserve(utt)
        return utt

    def _may_begin(self, rejected_chars: int) -> None:
        """Refuse a new utterance while the server drains (the one under way still finishes: the socket
        is then closed to resume elsewhere) or while `max_open_utterances` wait to play."""
        what = f"{rejected_chars} characters of input.text were not accepted" if rejected_chars else "input.done"
        fields = {"rejected_chars": rejected_chars} if rejected_chars else {}
        if self._view.draining():
            raise ProtocolError(
                "draining", f"{what}: no new utterance begins while the server drains; reconnect and resume "
                "the session elsewhere", **fields,
            )  # fmt: skip
        bound = self._view.limits.max_open_utterances
        if len(self._order.playing) >= bound:
            raise ProtocolError(
                "too_many_utterances",
                f"{what}: {bound} utterances (max_open_utterances) are waiting to play; wait or cancel", **fields,
            )  # fmt: skip

    async def commit(self, utt: Utterance, segments: list[Segment]) -> None:
        """Announce and speak committed segments. A segment that cannot be spoken (no stream slot, the
        store down) is named in an `error`; the segments after it are still tried."""
        unspoken: list[tuple[int, ProtocolError | EngineError]] = []
        for s in segments:
            index = len(utt.segments)
            utt.segments.append(s)
            utt.words.committed(index, s.text, s.start, self._view.pronunciations)  # its engine words, matched back
            metrics.SEGMENTS.labels(s.reason).inc()
            await self._out.emit(SegmentCommitted(utterance_index=utt.index, segment_index=index, text=s.text,
                                                  start=s.start, end=s.end, reason=s.reason))  # fmt: skip
            try:
                await self._speak(utt, index, s.text)
            except (ProtocolError, EngineError) as e:
                unspoken.append((index, e))
        if unspoken:
            index, e = unspoken[0]
            which = ", ".join(str(i) for i, _ in unspoken)
            extra = getattr(e, "fields", {}) if isinstance(e, EngineError) else {}  # a refused stream's bound
            raise ProtocolError(
                e.code, f"segment {which} of utterance {utt.index} will not be spoken: {message_of(e)}",
                utterance_index=utt.index, segment_indexes=[i for i, _ in unspoken], **extra,
            )  # fmt: skip

    async def _speak(self, utt: Utterance, index: int, text: str) -> None:
        """One committed segment to the utterance's engine stream (opened with its first speakable one)."""
        view = self._view
        assert view.config is not None
        pronunciations, language = view.pronunciations, view.config.language_code
        # The lexicon's respellings are charged to the utterance: at most max_respelling_growth × its text.
        respelled = utt.respelled = utt.respelled or Respelled.of(view.limits)

        def speech() -> str:  # read in the utterance's language where the segment has no letters ("12.5%。")
            return spoken_text(pronunciations, text, utt.reading.of(text, language), respelled)

        spoken = await asyncio.to_thread(speech) if len(text) > NORMALIZE_INLINE_CHARS else speech()
        if not spoken or utt.cancelled:
            return
        await self._open(utt, spoken)
        assert utt.stream is not None
        utt.engine_segments.append(index)  # a refused append spends its engine index all the same
        utt.stream.append(spoken + " ")  # may raise the engine's own backstop (queue_full)
        view.backlog.committed(utt, index, len(spoken))

    async def _open(self, utt: Utterance, text: str) -> None:
        """The utterance's engine stream, opened with its first speakable segment (`text`)."""
        if utt.stream is not None:
            return
        session = self._view.session
        utt.slot = await session.acquire_slot()
        try:
            utt.stream = self._admitted_stream(utt, text)
        except BaseException:
            await self._order.release_slot(utt)
            raise
        session.begin(utt.index)
        utt.pump = self._order.start(utt)

    def _admitted_stream(self, utt: Utterance, text: str) -> Stream:
        """The engine stream, opened once admission lets it (gateway/admission.py). Never waits: the
        wait runs in its own task, so the reader still reads (a cancel withdraws the wait), and the
        utterance's pump tells the client `audio.waiting {reason: "queue"}` when its turn comes first."""
        view = self._view
        assert view.config is not None
        # The engine of the model the utterance begins on: a session.config naming another model while it
        # waits for admission must not move it (its admission is this model's).
        cfg, voice, engine, admission = view.config, view.voice, view.engine, view.admission
        listener = self.listener
        if admission is None:
            return view.open_stream(cfg, voice, engine, listener)

        def admitted(ticket: Ticket) -> None:  # its text goes to the engine now, with no await between
            utt.queue_wait_s = ticket.waited_s
            utt.engine_at = time.monotonic()

        frame_rate = 12.5
        if cfg.output_mode == "codec_tokens":
            frame_rate = float(engine.codec_info().get("frame_rate_hz", 12.5))  # type: ignore[attr-defined]
        tenant = view.session.tenant
        # A listener still playing this session's audio must not hear a gap before the next utterance:
        # its stream goes before newcomers once that audio runs low (engine/fair_queue.py, continuations),
        # asked while it waits, so one queued before the audio ahead of it began counts once it plays.
        return QueuedStream(admission, tenant.name, tenant.weight,
                            lambda: view.open_stream(cfg, voice, engine, listener),
                            on_lost=lambda e, indexes: self._lost(utt, e, indexes), on_admitted=admitted,
                            frame_rate_hz=frame_rate, listener=listener,
                            language=cfg.language_code, voice=voice[0], text=text)  # fmt: skip

    async def _lost(self, utt: Utterance, e: ProtocolError | EngineError, engine_indexes: list[int]) -> None:
        """Admission refused the stream after its text was taken: the segments it held are named."""
        segments = [utt.engine_segments[i] for i in engine_indexes if i < len(utt.engine_segments)]
        message = message_of(e)
        fields = e.fields if isinstance(e, ProtocolError) else {}
        if segments:
            which = ", ".join(map(str, segments))
            message = f"segment {which} of utterance {utt.index} will not be spoken: {message}"
        with contextlib.suppress(SlowClient):  # the pump notices a client that stopped reading
            await self._out.error(e.code, message, utterance_index=utt.index, segment_indexes=segments, **fields)

    async def finish(self) -> None:
        """input.done: the tail committed and the utterance closed (the connection stays open)."""
        utt = self.current
        if utt is None:
            # input.done with nothing said: vLLM-Omni answers session.done with no sentences. It is an
            # utterance of its own (its session.done comes in order, after those playing), bounded as any.
            if self._view.config is None:
                return
            utt = self._new(StreamSegmenter())
        unspoken: ProtocolError | None = None
        if utt is self.current:
            try:
                await self.commit(utt, utt.segmenter.flush())
            except ProtocolError as e:  # the tail named as not spoken; the utterance still ends here
                unspoken = e
        self.current = None
        self._order.finished(utt)
        if unspoken is not None:
            raise unspoken

    def detach(self, utt: Utterance) -> bool:
        """The engine ended `utt` before input.done: later text starts the next utterance."""
        if self.current is not utt:
            return False
        self.current = None
        utt.finished = True
        return True

    async def tick(self, now: float) -> None:
        """The open utterance's idle commit; quiet past its bound, it is finished (its text spoken, its
        engine capacity given back) and the client told so."""
        utt = self.current
        if utt is None:
            return
        try:
            if now - utt.last_input > (bound := self.idle_bound(utt)):
                await self._out.error(
                    "utterance_timeout",
                    f"no input for {bound:g} s: utterance {utt.index} was finished as if input.done had "
                    "come (its text is spoken)",
                    utterance_index=utt.index, action="finished",
                )  # fmt: skip
                await self.finish()
            else:
                await self.commit(utt, utt.segmenter.poll(now))
        except ProtocolError as e:
            await self._out.error(e.code, e.message, **e.fields)
        except EngineError as e:
            await self._out.error(e.code, str(e), utterance_index=utt.index)

    def idle_bound(self, utt: Utterance) -> float:
        """How long the open utterance may stay quiet: shorter while it holds engine capacity (an admitted
        stream) that others are waiting for — a parked stream must not keep them out."""
        limits, admission = self._view.limits, self._view.admission
        holds = utt.stream is not None and not getattr(utt.stream, "queued", False)
        if holds and admission is not None and admission.waiting > 0:
            return min(limits.utterance_idle_under_pressure, limits.utterance_idle_timeout)
        return limits.utterance_idle_timeout
