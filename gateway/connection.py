"""One WebSocket connection: a reader, a writer, and one engine stream per utterance.

The reader decodes client messages and drives segmentation; each utterance's audio is pumped from
its engine stream into a bounded outbox, in utterance order; the writer drains the outbox onto the
socket. So a cancel is read while audio streams, and a client that stops reading fills the outbox
and is disconnected instead of stalling anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from engine import Engine, EngineError, Stream, StreamRequest
from gateway import metrics
from gateway.admission import Admission, QueuedStream, Ticket
from gateway.backlog import Backlog
from gateway.outbox import Outbox, Outgoing, SlowClient
from gateway.protocol import (
    CLOSE_INTERNAL,
    CLOSE_POLICY,
    CLOSE_TAKEN_OVER,
    CLOSE_TIMEOUT,
    AudioCancelled,
    AudioWaiting,
    ConfigMessage,
    InputCancel,
    InputDone,
    InputText,
    ProtocolError,
    SegmentCommitted,
    ServerEvent,
    SessionClose,
    SessionConfig,
    SessionReady,
    config_of,
    decode,
    encode,
    error_event,
    sent_fields,
)
from gateway.pump import codec_done, pump_audio
from gateway.session_state import SessionBinding
from gateway.settings import Limits
from gateway.utterance import Utterance
from gateway.voices import open_request, stream_request
from segmentation import Segment, StreamSegmenter, normalize_for_speech
from sessions import SESSION_TAKEN_OVER

__all__ = ["Connection", "Limits"]  # Limits lives in gateway.settings; importing it from here still works

log = logging.getLogger("voxgate.ws")

Send = Callable[[bytes | str], Awaitable[None]]
Select = Callable[[str | None], tuple[Engine, Admission | None, str]]

# A big input.text is fed to the segmenter this many characters at a time, yielding to the event loop
# between slices: the costliest text (dense clause marks, ~4 ms/KiB; bench/segmentation_bench.py
# --hostile) holds the loop about 2 ms per slice, prose a tenth of that.
FEED_SLICE = 512
# Segments longer than this (split_granularity "none") are normalised off the event loop (~1 ms/KiB).
NORMALIZE_INLINE_CHARS = 1024


class Connection:
    def __init__(self, engine: Engine, limits: Limits, session: SessionBinding,
                 receive: Callable[[], Awaitable[dict]], send: Send, model: str = "default",
                 admission: Admission | None = None, select: Select | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.model = model  # the timing histograms' label
        self.admission = admission  # None: streams open at once (no capacity bound, no fairness)
        # session.config's `model` → its (engine, admission, name) (gateway/models.py); None: one model only.
        self.select = select
        self._chosen = (engine, admission, model)
        self.limits = limits
        self.session = session
        self._receive = receive
        self._send = send
        self.outbox = Outbox(limits.outbox_frames, limits.send_timeout)
        self.config: SessionConfig | None = None
        self.session_id = ""
        self.utterance_count = 0
        self.current: Utterance | None = None  # the one receiving text
        self.playing: deque[Utterance] = deque()  # finished input, audio still to send, in order
        self._last_pump: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._voice: tuple[str | None, dict[str, Any]] = (None, {})  # resolved at session.config
        self.close_code, self.close_reason = 1000, ""  # how the socket is closed, and why
        self.backlog = Backlog(limits)
        self.listener = self.backlog.listener  # the client's player, across utterances
        self.last_utterance: Utterance | None = None  # the last whose pump ended (what a late cancel names)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client leaves, a bad first message, or `stop()`."""
        metrics.SESSIONS.inc()
        writer = asyncio.create_task(self._writer())
        poller = asyncio.create_task(self._supervised("idle commits", self._poller))
        reader = asyncio.create_task(self._reader())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({reader, writer, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, stopped, poller, self._watch):
                if task is not None:
                    task.cancel()
            await self._cancel_all(notify=False)
            for task in (reader, writer):
                exc = task.exception() if task.done() and not task.cancelled() else None
                if isinstance(exc, SlowClient | TimeoutError):
                    log.info("session %s: the client stopped reading; disconnected", self.session_id)
                    self._close_with(CLOSE_POLICY, "the client stopped reading")
                elif exc is not None:
                    log.error("session %s: connection failed", self.session_id, exc_info=exc)
                    self._close_with(CLOSE_INTERNAL, "internal error")
            # Let what is queued (session.done, an error) reach the client, briefly. The writer is
            # stopped by a sentinel, not by cancel, which asyncio can lose in a finishing send.
            self.outbox.close()
            await asyncio.wait({writer}, timeout=1.0)
            writer.cancel()
            await asyncio.wait({writer, reader, poller}, timeout=1.0)
            self.outbox.discard()
            await self.session.close()
            metrics.SESSIONS.dec()

    def stop(self, code: int | None = None, reason: str = "") -> None:
        """End the connection from outside the reader (a slow client, a takeover)."""
        if code is not None:
            self._close_with(code, reason)
        self._stopped.set()

    def _close_with(self, code: int, reason: str) -> None:
        if self.close_code == 1000:  # the first cause is the one the client hears
            self.close_code, self.close_reason = code, reason

    async def _supervised(self, what: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run one of the connection's background tasks: a failure is logged and told to the client
        (the socket stays usable, minus that task), never lost silently."""
        try:
            await work()
        except SlowClient:
            self.stop(CLOSE_POLICY, "the client stopped reading")
        except Exception:
            log.exception("session %s: %s failed", self.session_id, what)
            with contextlib.suppress(SlowClient):
                await self.error("internal_error", f"{what} failed on this connection")

    async def _writer(self) -> None:
        while True:
            item = await self.outbox.get()
            if item.last:
                return
            if isinstance(item.data, bytes) and item.utterance is not None:
                metrics.AUDIO_BYTES.inc(len(item.data))
            async with asyncio.timeout(self.limits.send_timeout):
                await self._send(item.data)

    async def emit(self, ev: ServerEvent) -> None:
        await self.outbox.put(Outgoing(encode(ev)))

    async def error(self, code: str, message: str, **fields: object) -> None:
        metrics.ERRORS.labels(code).inc()
        await self.emit(error_event(code, message, **fields))

    # -- reading ----------------------------------------------------------------------------------

    async def _reader(self) -> None:
        while (ev := await self._next_event()) is not None and ev["type"] != "websocket.disconnect":
            try:
                if not await self._dispatch(ev.get("text")):
                    return
            except (ProtocolError, EngineError) as e:
                await self._refused(e)
                if self.config is None:
                    self._close_with(CLOSE_POLICY, e.code)
                    return  # only a bad first message closes the session

    async def _next_event(self) -> dict | None:
        """The socket's next event; None once the session idled past its timeout (the client is told)."""
        while True:
            timeout = self.limits.config_timeout if self.config is None else self.limits.idle_timeout
            try:
                async with asyncio.timeout(timeout):
                    return await self._receive()
            except TimeoutError:
                if self.current is not None or self.playing:
                    continue  # idle means between turns; a long reply still playing is not idle
            what = "session.config" if self.config is None else "input"
            await self.error("timeout", f"no {what} within {timeout:g} s; closing")
            self._close_with(CLOSE_TIMEOUT, f"no {what} within {timeout:g} s")
            return None

    async def _dispatch(self, raw: str | None) -> bool:
        """Act on one client message; False: the session ends (session.close)."""
        if raw is None:
            raise ProtocolError("binary_not_supported", "client frames must be JSON text")
        msg = decode(raw)
        if self.config is None and not isinstance(msg, ConfigMessage):
            raise ProtocolError("config_required", "the first message must be session.config")
        if isinstance(msg, SessionClose):
            await self._finish_current()
            await self._wait_playing()
            return False
        if isinstance(msg, ConfigMessage):
            await self._configure(config_of(msg), sent_fields(msg))
        else:
            await self._handle(msg)
        return True

    async def _refused(self, e: ProtocolError | EngineError) -> None:
        if isinstance(e, ProtocolError):
            await self.error(e.code, e.message, **e.fields)
        else:
            await self.error(e.code, str(e))

    async def _handle(self, msg: InputText | InputDone | InputCancel) -> None:
        if isinstance(msg, InputText):
            await self._text(msg.text)
        elif isinstance(msg, InputDone):
            await self._finish_current()
        else:
            self._heard_at(msg.played_ms)
            if not await self._cancel_all(notify=True):
                await self._nothing_to_cancel()

    async def _configure(self, cfg: SessionConfig, explicit: dict[str, object]) -> None:
        if self.current is not None:
            raise ProtocolError(
                "utterance_in_progress",
                "session.config cannot change an open utterance; send input.done first",
            )
        if self.config is None:
            cfg = await self.session.attach(cfg, explicit)  # a resume restores the stored config
            try:
                voice = await self._check(cfg)
            except (ProtocolError, EngineError):
                await self.session.close()
                raise
            self.utterance_count = self.session.next_utterance
            self._watch = asyncio.create_task(self._supervised("cross-replica cancel", self._control))
        else:
            if cfg.session_id not in (None, self.session_id):
                raise ProtocolError("invalid_config", "session_id cannot change on an open connection")
            voice = await self._check(cfg)
            await self.session.update(cfg)
        self.config, self._voice = cfg, voice
        self.engine, self.admission, self.model = self._chosen
        self.session_id = self.session.session_id
        await self.emit(SessionReady(
            session_id=self.session_id,
            sample_rate=self.sample_rate,
            channels=1,
            format=cfg.response_format,
            voice=cfg.voice_name,
            language=cfg.language,
            split_granularity=cfg.split_granularity,
            resumed=self.session.resumed,
            next_utterance_index=self.utterance_count,
        ))  # fmt: skip

    async def _check(self, cfg: SessionConfig) -> tuple[str | None, dict[str, Any]]:
        """Validate a config; returns the engine voice and options its voice name resolves to."""
        cfg.validate()
        # unknown_model, model_unloading, …: a ProtocolError; the model is switched once the config is taken.
        chosen = (self.engine, self.admission, self.model) if self.select is None else self.select(cfg.model)
        voice = await self.session.resolve_voice(chosen[0], cfg.voice_name)
        # The engine is the judge of voices, languages, options and capabilities (codec_tokens_unsupported,
        # voice_cloning_unsupported): it checks the request without opening a stream.
        chosen[0].check(self._request(cfg, voice))
        self._chosen = chosen
        return voice

    async def _control(self) -> None:
        """Cancels and takeovers sent by other replicas through the store."""
        async for msg in self.session.events():
            if msg.kind == "cancel":
                self._heard_at(msg.played_ms)
                await self._cancel_all(notify=True)
            elif msg.kind == "takeover":
                await self.error(SESSION_TAKEN_OVER, "another connection took over this session")
                self.stop(CLOSE_TAKEN_OVER, "taken over")
                return

    @property
    def sample_rate(self) -> int:
        assert self.config is not None
        return self.config.sample_rate or self.engine.sample_rate

    def _request(self, cfg: SessionConfig, voice: tuple[str | None, dict[str, Any]]) -> StreamRequest:
        return stream_request(voice, cfg.language, sample_rate=cfg.sample_rate, speed=cfg.speed, seed=cfg.seed,
                              instructions=cfg.instructions, output=cfg.output_mode,
                              word_timings=cfg.word_timestamps)  # fmt: skip

    def _open_stream(self, cfg: SessionConfig, voice: tuple[str | None, dict[str, Any]]) -> Stream:
        return open_request(self.engine, self._request(cfg, voice))

    async def _text(self, text: str) -> None:
        if not isinstance(text, str):
            raise ProtocolError("invalid_message", "input.text requires a string value")
        if not text:
            return
        utt = self.current
        if utt is None:
            if len(self.playing) >= self.limits.max_open_utterances:
                raise ProtocolError(
                    "too_many_utterances", "too many utterances waiting to play; wait or cancel"
                )
            assert self.config is not None
            seg = StreamSegmenter(self.config.language, self.config.split_granularity)
            utt = self.current = Utterance(self.utterance_count, seg)
            self.utterance_count += 1
            metrics.UTTERANCES.inc()
        utt.last_input = time.monotonic()  # refused text is input too: the client is not idle
        self.backlog.admit(utt, text)
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
            await self._commit(utt, segments)

    async def _commit(self, utt: Utterance, segments: list[Segment]) -> None:
        """Announce and speak committed segments. A segment that cannot be spoken (no stream slot, the
        store down) is named in an `error`; the segments after it are still tried."""
        unspoken: list[tuple[int, ProtocolError | EngineError]] = []
        for s in segments:
            index = len(utt.segments)
            utt.segments.append(s)
            metrics.SEGMENTS.labels(s.reason).inc()
            await self.emit(SegmentCommitted(utterance_index=utt.index, segment_index=index, text=s.text,
                                             start=s.start, end=s.end, reason=s.reason))  # fmt: skip
            try:
                await self._speak(utt, index, s.text)
            except (ProtocolError, EngineError) as e:
                unspoken.append((index, e))
        if unspoken:
            index, e = unspoken[0]
            which = ", ".join(str(i) for i, _ in unspoken)
            message = e.message if isinstance(e, ProtocolError) else str(e)
            extra = getattr(e, "fields", {}) if isinstance(e, EngineError) else {}  # a refused stream's bound
            raise ProtocolError(
                e.code, f"segment {which} of utterance {utt.index} will not be spoken: {message}",
                utterance_index=utt.index, segment_indexes=[i for i, _ in unspoken], **extra,
            )  # fmt: skip

    async def _speak(self, utt: Utterance, index: int, text: str) -> None:
        """One committed segment to the utterance's engine stream (opened with its first speakable one)."""
        assert self.config is not None
        if len(text) > NORMALIZE_INLINE_CHARS:
            spoken = await asyncio.to_thread(normalize_for_speech, text, self.config.language)
        else:
            spoken = normalize_for_speech(text, self.config.language)
        if not spoken or utt.cancelled:
            return
        await self._open(utt)
        assert utt.stream is not None
        utt.engine_segments.append(index)  # a refused append spends its engine index all the same
        utt.stream.append(spoken + " ")  # may raise the engine's own backstop (queue_full)
        self.backlog.committed(utt, index, len(spoken))

    async def _open(self, utt: Utterance) -> None:
        """The utterance's engine stream, opened with its first speakable segment."""
        if utt.stream is not None:
            return
        assert self.config is not None
        utt.slot = await self.session.acquire_slot()
        try:
            utt.stream = self._admitted_stream(utt)
        except BaseException:
            await self._release_slot(utt)
            raise
        self.session.begin(utt.index)
        utt.pump = self._start_pump(utt)

    def _admitted_stream(self, utt: Utterance) -> Stream:
        """The engine stream, opened once admission lets it (gateway/admission.py). Never waits: the
        wait runs in its own task, so the reader still reads (a cancel withdraws the wait), and the
        utterance's pump tells the client `audio.waiting {reason: "queue"}` when its turn comes first."""
        assert self.config is not None
        cfg, voice = self.config, self._voice
        if self.admission is None:
            return self._open_stream(cfg, voice)

        def admitted(ticket: Ticket) -> None:  # its text goes to the engine now, with no await between
            utt.queue_wait_s = ticket.waited_s
            utt.engine_at = time.monotonic()

        async def lost(e: ProtocolError | EngineError, engine_indexes: list[int]) -> None:
            segments = [utt.engine_segments[i] for i in engine_indexes if i < len(utt.engine_segments)]
            message = e.message if isinstance(e, ProtocolError) else str(e)
            fields = e.fields if isinstance(e, ProtocolError) else {}
            if segments:
                which = ", ".join(map(str, segments))
                message = f"segment {which} of utterance {utt.index} will not be spoken: {message}"
            with contextlib.suppress(SlowClient):  # the pump notices a client that stopped reading
                await self.error(e.code, message, utterance_index=utt.index, segment_indexes=segments, **fields)

        frame_rate = 12.5
        if cfg.output_mode == "codec_tokens":
            frame_rate = float(self.engine.codec_info().get("frame_rate_hz", 12.5))  # type: ignore[attr-defined]
        tenant = self.session.tenant
        # A listener still playing this session's audio must not hear a gap before the next utterance:
        # its stream goes before newcomers once that audio runs low (engine/admission.py, continuations).
        listening = self.listener.ahead()
        return QueuedStream(self.admission, tenant.name, tenant.weight, lambda: self._open_stream(cfg, voice),
                            on_lost=lost, on_admitted=admitted, frame_rate_hz=frame_rate,
                            listening_s=listening if listening > 0 else None)  # fmt: skip

    async def _finish_current(self) -> None:
        utt = self.current
        if utt is None:
            # input.done with nothing said: vLLM-Omni answers session.done with no sentences.
            if self.config is not None:
                utt = Utterance(self.utterance_count, StreamSegmenter())
                self.utterance_count += 1
            else:
                return
        unspoken: ProtocolError | None = None
        if utt is self.current:
            try:
                await self._commit(utt, utt.segmenter.flush())
            except ProtocolError as e:  # the tail named as not spoken; the utterance still ends here
                unspoken = e
        self.current = None
        utt.finished = True
        if utt.stream is not None:
            utt.stream.finish()
        else:
            utt.pump = self._start_pump(utt)  # no audio: the pump still closes it in order
        if not utt.pump.done():  # one the engine ended early has told its client already
            self.playing.append(utt)
        if unspoken is not None:
            raise unspoken

    async def _wait_playing(self) -> None:
        for utt in list(self.playing):
            if utt.pump is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await utt.pump

    async def _poller(self) -> None:
        """Idle commits of the open utterance's tail; an open utterance quiet past its bound is finished
        (its text spoken, its engine capacity given back) and the client told so."""
        while True:
            await asyncio.sleep(self.limits.poll_interval)
            utt = self.current
            if utt is None:
                continue
            now = time.monotonic()
            try:
                if now - utt.last_input > (bound := self._idle_bound(utt)):
                    await self.error(
                        "utterance_timeout",
                        f"no input for {bound:g} s: utterance {utt.index} was finished as if input.done had "
                        "come (its text is spoken)",
                        utterance_index=utt.index, action="finished",
                    )  # fmt: skip
                    await self._finish_current()
                else:
                    await self._commit(utt, utt.segmenter.poll(now))
            except ProtocolError as e:
                await self.error(e.code, e.message, **e.fields)
            except EngineError as e:
                await self.error(e.code, str(e), utterance_index=utt.index)

    def _idle_bound(self, utt: Utterance) -> float:
        """How long the open utterance may stay quiet: shorter while it holds engine capacity (an admitted
        stream) that others are waiting for — a parked stream must not keep them out."""
        holds = utt.stream is not None and not getattr(utt.stream, "queued", False)
        if holds and self.admission is not None and self.admission.waiting > 0:
            return min(self.limits.utterance_idle_under_pressure, self.limits.utterance_idle_timeout)
        return self.limits.utterance_idle_timeout

    def _heard_at(self, played_ms: float | None) -> None:
        """A cancel's playback position belongs to the utterance playing (the first to go; with nothing
        left to send, the last one sent, which its listener may still be hearing); those queued behind it
        were not heard at all. Their audio.cancelled then says what was heard (gateway/words.py)."""
        victims = [*self.playing, *([self.current] if self.current is not None else [])]
        if not victims and self.last_utterance is not None:
            victims = [self.last_utterance]
        for i, utt in enumerate(victims):
            utt.played_ms = played_ms if i == 0 or played_ms is None else 0.0

    async def _cancel_all(self, notify: bool) -> int:
        victims = list(self.playing)
        if self.current is not None:
            victims.append(self.current)
            self.current = None
        self.playing.clear()
        for utt in victims:
            utt.cancelled = True
            if utt.stream is not None:
                utt.stream.cancel()
            self.outbox.cancel_audio(utt.index)
            if utt.pump is None or utt.pump.done():
                self.outbox.settled(utt.index)  # no pump: no later audio to keep out
            self.backlog.forget(utt)
        if notify:
            metrics.CANCELS.inc()
        for utt in victims:
            spoken = utt.spoken_text
            await self.session.record(utt.index, spoken, cancelled=True)
            if notify and self.codec_mode:
                await self.emit(codec_done(utt, error=False, cancelled=True, spoken_text=spoken))
            elif notify:
                await self.emit(AudioCancelled(utterance_index=utt.index, played_bytes=utt.sent_bytes,
                                               spoken_text=spoken, **utt.heard_fields()))  # fmt: skip
        return len(victims)

    async def _nothing_to_cancel(self) -> None:
        """A cancel with nothing queued or playing is answered all the same (a client waiting for the
        acknowledgement must not hang): `audio.cancelled {cancelled: false}` for the last utterance, whose
        audio was all sent (null index, 0 bytes: the session has had none)."""
        last = self.last_utterance
        await self.emit(AudioCancelled(
            utterance_index=None if last is None else last.index, played_bytes=0 if last is None else last.sent_bytes,
            spoken_text="" if last is None else last.spoken_text, cancelled=False,
            **({} if last is None else last.heard_fields()),
        ))  # fmt: skip

    # -- audio ----------------------------------------------------------------------------------

    def _start_pump(self, utt: Utterance) -> asyncio.Task[None]:
        if utt.stream is not None and utt.engine_at is None:
            # Its first segment is appended right after, with no await between (under admission the
            # stream is a QueuedStream, and this is set again when admission lets the text go in).
            utt.engine_at = time.monotonic()
        previous = self._last_pump
        task = asyncio.create_task(self._pump(utt, previous))
        self._last_pump = task
        return task

    async def _pump(self, utt: Utterance, previous: asyncio.Task[None] | None) -> None:
        """Send one utterance's audio once the utterance before it has been sent."""
        if previous is not None:
            with contextlib.suppress(BaseException):
                await previous
        try:
            await self._queued(utt)
            await pump_audio(self, utt)
        except SlowClient:
            self.stop()
        except Exception:  # one utterance's failure must not take the session down silently
            log.exception("session %s: utterance %d failed", self.session_id, utt.index)
            utt.cancelled = True
            if utt.stream is not None:
                utt.stream.cancel()
            with contextlib.suppress(SlowClient):
                await self.error("internal_error", "the utterance failed", utterance_index=utt.index)
        finally:
            self.last_utterance = utt
            if utt in self.playing:
                self.playing.remove(utt)
            self.backlog.forget(utt)
            self.outbox.settled(utt.index)
            await self._release_slot(utt)

    async def _queued(self, utt: Utterance) -> None:
        """The utterance's turn to play has come while admission still holds its stream: say why audio
        is late, and wait (admission bounds the wait; a cancel ends it)."""
        stream = utt.stream
        if isinstance(stream, QueuedStream) and stream.queued:
            await self.emit(AudioWaiting(utterance_index=utt.index, reason="queue", ahead=stream.ahead()))
            await stream.settled()

    async def _release_slot(self, utt: Utterance) -> None:
        """The engine is done with the utterance: its admission and its tenant's stream slot go back."""
        if isinstance(utt.stream, QueuedStream):
            utt.stream.release()
        slot, utt.slot = utt.slot, None
        if slot is not None:
            with contextlib.suppress(Exception):
                await slot.release()

    @property
    def codec_mode(self) -> bool:
        return self.config is not None and self.config.output_mode == "codec_tokens"
