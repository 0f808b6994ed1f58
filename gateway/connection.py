"""One WebSocket connection: a reader, a writer, and one engine stream per utterance.

The reader decodes client messages and drives segmentation; each utterance's audio is pumped from
its engine stream into a bounded outbox, in utterance order; the writer drains the outbox onto the
socket. So a cancel is read while audio streams, and a client that stops reading fills the outbox
and is disconnected instead of stalling anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar.exceptions import WebSocketDisconnect

from engine import Engine, EngineError, Stream, StreamRequest
from engine.types import MAX_LISTENER_BUFFER_S
from gateway import metrics
from gateway.admission import Admission
from gateway.backlog import Backlog
from gateway.contexts import Contexts
from gateway.deadline import Deadline
from gateway.intake import TextIntake
from gateway.lexicons import NO_LEXICON, spoken_with
from gateway.outbox import Outbox, Outgoing, SlowClient
from gateway.playback import Playback
from gateway.playout import Playout
from gateway.protocol import (
    CLOSE_INTERNAL,
    CLOSE_POLICY,
    CLOSE_TAKEN_OVER,
    CLOSE_TIMEOUT,
    CLOSE_TRY_LATER,
    ConfigMessage,
    InputCancel,
    InputDone,
    InputText,
    ProtocolError,
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
from gateway.pump import heard_by
from gateway.session_state import SessionBinding
from gateway.settings import Limits
from gateway.utterance import Utterance
from gateway.voices import open_request, refuse_missing_capability, stream_request, voice_switches
from segmentation.lexicon import Pronunciations
from sessions import SESSION_TAKEN_OVER

__all__ = ["Connection", "Limits"]  # Limits lives in gateway.settings; importing it from here still works

log = logging.getLogger("voxgate.ws")

Send = Callable[[bytes | str], Awaitable[None]]
SendAudio = Callable[[bytes, int], Awaitable[None]]  # an audio frame, and the utterance whose it is
Select = Callable[[str | None], tuple[Engine, Admission | None, str]]


class Connection:
    def __init__(self, engine: Engine, limits: Limits, session: SessionBinding,
                 receive: Callable[[], Awaitable[dict]], send: Send, model: str = "default",
                 admission: Admission | None = None, select: Select | None = None,
                 draining: Callable[[], bool] = lambda: False,
                 interleaved: SendAudio | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.model = model  # the timing histograms' label
        self.admission = admission  # None: streams open at once (no capacity bound, no fairness)
        # session.config's `model` → its (engine, admission, name) (gateway/models.py); None: one model only.
        self.select = select
        self.draining = draining  # the server drains (gateway/drain.py): no new utterance begins
        self._chosen = (engine, admission, model)
        self.limits = limits
        self.session = session
        self._receive = receive
        self._send = send
        # None: the session's utterances play one after another (the native protocol: its binary frames name
        # no utterance). Given: named contexts interleave, each audio frame sent through it with its utterance
        # (a provider wire that tags every audio message with its context: gateway/playout.py).
        self._send_audio = interleaved
        self.outbox = Outbox(limits.outbox_frames, limits.send_timeout)
        self.config: SessionConfig | None = None
        self.session_id = ""
        self.utterance_count = 0
        # The utterances whose input is over, their audio in order; their intakes, each owning the utterance
        # taking its text.
        self.playout = Playout(self, self, self.detach, interleaved=interleaved is not None)
        self.contexts = Contexts(self, self, self.playout, interleaved=interleaved is not None)
        self._stopped = asyncio.Event()
        self._quiet = Deadline(self.limits.config_timeout)  # the reader's wait for the client's next message
        self._watch: asyncio.Task[None] | None = None
        self.voice: tuple[str | None, dict[str, Any]] = (None, {})  # resolved at session.config
        self.pronunciations: Pronunciations = NO_LEXICON  # its lexicon's respellings (session.config `lexicon`)
        self.close_code, self.close_reason = 1000, ""  # how the socket is closed, and why
        self.backlog = Backlog(limits)
        self.listener = self.backlog.listener  # the client's player, across utterances

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client leaves, a bad first message, or `stop()`."""
        metrics.SESSIONS.inc()
        writer = asyncio.create_task(self._writer())
        poller = asyncio.create_task(self._supervised("idle commits", self.contexts.poller))
        reader = asyncio.create_task(self._reader())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({reader, writer, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, stopped, poller, self._watch):
                if task is not None:
                    task.cancel()
            await self._cancel(None, notify=False)
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
            self._quiet.close()
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
        sending = Deadline(self.limits.send_timeout)  # one timer for the writer's life, not one per frame
        try:
            while True:
                item = self.outbox.get_nowait() or await self.outbox.get()
                if item.last:
                    return
                if isinstance(item.data, bytes) and item.utterance is not None:
                    metrics.AUDIO_BYTES.inc(len(item.data))
                try:
                    with sending:
                        if self._send_audio is not None and isinstance(item.data, bytes) and item.utterance is not None:
                            await self._send_audio(item.data, item.utterance)
                        else:
                            await self._send(item.data)
                except TimeoutError:
                    raise  # an OSError too, but it says the client stopped reading (run() closes with 1008)
                except (OSError, WebSocketDisconnect):  # the transport is gone (uvicorn's ClientDisconnected)
                    log.info("session %s: the client went away while it was sent to", self.session_id)
                    return
        finally:
            sending.close()

    async def emit(self, ev: ServerEvent, audio_of: int | None = None) -> None:
        """Queue `ev`, stamped with its utterance's context; `audio_of`: the utterance whose audio it carries
        (vLLM-Omni's audio.chunk), so a cancel purges it as it purges audio frames."""
        data = encode(self.contexts.stamped(ev))
        await self.outbox.put(Outgoing(data) if audio_of is None else Outgoing(data, audio_of, audio=True))

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
                if self.config is None:  # capacity (queue_full): try again later; anything else: policy
                    self._close_with(CLOSE_TRY_LATER if e.code == "queue_full" else CLOSE_POLICY, e.code)
                    return  # only a bad first message closes the session

    async def _next_event(self) -> dict | None:
        """The socket's next event; None once the session idled past its timeout (the client is told)."""
        while True:
            timeout = self.limits.config_timeout if self.config is None else self.limits.idle_timeout
            self._quiet.seconds = timeout
            try:
                with self._quiet:  # one timer for the reader's life, not one per message
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
            await self.contexts.finish_all()
            await self.playout.wait()
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
        try:
            if isinstance(msg, InputText):
                await self.contexts.open(msg.context_id, len(msg.text)).text(msg.text)
            elif isinstance(msg, InputDone):
                await self.contexts.open(msg.context_id).finish()
            else:
                if not await self._cancel(msg.context_id, notify=True, played_ms=msg.played_ms):
                    await self.playout.nothing_to_cancel(self._last_of(msg.context_id), msg.context_id)
        except ProtocolError as e:
            if msg.context_id is not None:  # a refusal in a context names it
                e.fields.setdefault("context_id", msg.context_id)
            raise

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
        self.config, self.voice = cfg, voice
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
            voice_switches=voice_switches(self.engine, voice[0], cfg.language_code) or msgspec.UNSET,
        ))  # fmt: skip

    async def _check(self, cfg: SessionConfig) -> tuple[str | None, dict[str, Any]]:
        """Validate a config; returns the engine voice and options its voice name resolves to."""
        cfg.validate()
        # unknown_model, model_unloading, …: a ProtocolError; the model is switched once the config is taken.
        chosen = (self.engine, self.admission, self.model) if self.select is None else self.select(cfg.model)
        refuse_missing_capability(chosen[0], cfg.task_type, cfg.inline_reference)  # cloning, voice design
        voice = await self.session.resolve_voice(chosen[0], cfg.voice_name)
        # The engine is the judge of voices, languages, options and capabilities (codec_tokens_unsupported,
        # voice_cloning_unsupported): it checks the request without opening a stream.
        # Off the event loop: an engine in a child process answers by a round trip (engine/process).
        # The lexicon's IPA entries are the engine's to take or refuse (gateway/lexicons.py); taken, they are
        # one more of the stream options the voice carries, so every stream of this config is opened with them.
        lexicon = await self.session.lexicon(cfg.lexicon)
        request, self.pronunciations = await asyncio.to_thread(
            spoken_with, chosen[0], self._request(cfg, voice), lexicon)
        self._chosen = chosen
        return voice if request.phonemes is None else (voice[0], {**voice[1], "phonemes": request.phonemes})

    async def _control(self) -> None:
        """Cancels and takeovers sent by other replicas through the store."""
        async for msg in self.session.events():
            if msg.kind == "cancel":  # answered as input.cancel is, whether or not anything was left to stop
                if not await self._cancel(None, notify=True, played_ms=msg.played_ms):
                    await self.playout.nothing_to_cancel(self._last_of(None))
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

    def open_stream(self, cfg: SessionConfig, voice: tuple[str | None, dict[str, Any]],
                    engine: Engine | None = None, listener: Playback | None = None) -> Stream:  # fmt: skip
        """`engine`: the model's the utterance began on (None: the session's now); `listener`: who hears it
        (None: the session's player). The engine is told whose it is (`listener`: its streams are heard one
        after another, so one opened while the one before is still made continues it; `listener_group`: its
        tenant, within which alone the engine learns from listeners' habits), and, opened while its listener
        still plays earlier audio, how long that audio lasts (`listener_buffer_s`): its first audio is due
        by then."""
        listener = listener or self.listener
        request = msgspec.structs.replace(self._request(cfg, voice), listener=listener.name,
                                          listener_group=listener_group(self.session.tenant.name))
        if (heard := listener.timeline()) is not None:
            left = min(MAX_LISTENER_BUFFER_S, heard.ahead_s(time.monotonic()))
            request = msgspec.structs.replace(request, listener_buffer_s=left)
        return open_request(self.engine if engine is None else engine, request)

    def next_utterance_index(self) -> int:
        self.utterance_count += 1
        return self.utterance_count - 1

    def detach(self, utt: Utterance) -> bool:
        """The engine ended `utt` before input.done: it stops taking text (False: it had already)."""
        return self.contexts.detach(utt)

    async def _cancel(self, context_id: str | None, notify: bool, played_ms: float | None = None) -> int:
        """Stop a context's utterances (no context_id: every context's, as a session without contexts has).
        A cancel's playback position belongs to the utterance playing (the first to go; with nothing left to
        send, the last one sent, which its listener may still be hearing); those queued behind it were not
        heard at all. Their audio.cancelled then says what was heard (gateway/words.py)."""
        victims = self.contexts.victims(context_id)
        last = self._last_of(context_id)
        for i, utt in enumerate(victims or ([last] if last is not None else [])):
            utt.played_ms = played_ms if i == 0 or played_ms is None else 0.0
        cancelled = await self.playout.cancel(victims, notify)
        for listener in self.contexts.listeners(context_id):
            if not any(heard_by(self, utt) is listener for utt in self.playout.playing):
                # A barge-in: the client drops what it was playing. The next utterance starts a listener
                # afresh, not as the continuation of audio nobody hears (its first audio would wait for that).
                listener.stop()
        return cancelled

    def _last_of(self, context_id: str | None) -> Utterance | None:
        """The session's last utterance sent, or the named context's latest (what a late cancel names)."""
        if context_id is None:
            return self.playout.last_utterance
        intake = self.contexts.get(context_id)
        return None if intake is None else intake.latest

    @property
    def intake(self) -> TextIntake:
        """The default context's intake (no context_id)."""
        return self.contexts.default

    @property
    def current(self) -> Utterance | None:
        """An utterance receiving text, in any context (the drain reads it)."""
        return self.contexts.current

    @property
    def playing(self) -> deque[Utterance]:
        return self.playout.playing

    @property
    def codec_mode(self) -> bool:
        return self.config is not None and self.config.output_mode == "codec_tokens"


def listener_group(tenant: str) -> str:
    """The engine's listener group of `tenant`: a fixed-length digest (a tenant's name may be longer than
    a group name may be, and the engine needs no names)."""
    return hashlib.blake2b(tenant.encode(), digest_size=16).hexdigest()
