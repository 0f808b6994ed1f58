"""A Pipecat TTS service speaking through voxgate's streaming WebSocket (extra `pipecat`).

    from voxgate_client.pipecat import VoxgateTTSService
    tts = VoxgateTTSService(url="ws://127.0.0.1:8000", voice="joe", language="en")

Built on Pipecat's own `WebsocketTTSService`, as its Cartesia and ElevenLabs services are:
- one socket for the whole pipeline; each Pipecat audio context (a turn, or a `TTSSpeakFrame`) is one voxgate
  utterance, its text streamed in as it comes (token mode by default: voxgate commits at sentence and clause
  boundaries itself), flushed with `input.done` at the turn's end;
- with `contexts=True` (a server with contexts) each audio context is a voxgate `context_id`; without, the
  utterances of one socket play in order, which is how Pipecat plays its contexts anyway;
- word timestamps (`audio.words`) are handed to Pipecat, which then emits the spoken words in time with the
  audio, so the assistant's context holds only what was played;
- an interruption sends `input.cancel` with the playback position (`played_ms`), on the same socket (no
  reconnect); audio of the interrupted utterance still queued is dropped, and the server's answer
  (`audio.cancelled`, with `heard_text`) goes to the `on_voxgate_cancelled` event handler;
- any voxgate voice by name (`voice=`, or a `TTSUpdateSettingsFrame` between turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator
from typing import Any

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, InterruptionFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.transcriptions.language import Language

from voxgate_client.events import Audio, AudioCancelled, AudioWords, Error, Word
from voxgate_client.session import Session, SessionClosed, Speech, connect

# Words of scripts written without spaces: Pipecat must not put spaces between them.
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


class VoxgateTTSService(WebsocketTTSService):
    """Pipecat text-to-speech through a voxgate gateway (see the module's docstring).

    Args:
        url: the gateway (`ws://host:port`; the streaming path is added).
        voice, language: voxgate's `voice` and `language` (default: the server's).
        api_key: sent as a bearer token.
        sample_rate: output rate (default: the pipeline's); voxgate resamples to it.
        word_timestamps: ask for `audio.words` and let Pipecat time the spoken words by them (else
            the text of each utterance is pushed whole after its audio).
        contexts: map audio contexts to voxgate `context_id`s (a server with contexts).
        config: more `session.config` fields (`speed`, `split_granularity`, `instructions`, `seed`, …).
        text_aggregation_mode: Pipecat's; default TOKEN, since voxgate segments streamed text itself.
    """

    Settings = TTSSettings
    _settings: TTSSettings

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        voice: str | None = None,
        language: str | Language | None = None,
        api_key: str | None = None,
        sample_rate: int | None = None,
        word_timestamps: bool = True,
        contexts: bool = False,
        config: dict[str, Any] | None = None,
        text_aggregation_mode: TextAggregationMode | None = None,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        store = TTSSettings(model=None, voice=voice, language=language)
        if settings is not None:
            store.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode or TextAggregationMode.TOKEN,
            push_text_frames=not word_timestamps,
            push_start_frame=True,
            pause_frame_processing=False,  # every audio frame is attributed to its utterance
            append_trailing_space=True,  # sentence mode: voxgate appends text verbatim
            sample_rate=sample_rate,
            settings=store,
            # How long an audio context may wait for its next audio before Pipecat ends it. voxgate ends
            # every utterance itself (session.done), and an utterance may wait for capacity first
            # (audio.waiting, up to the server's 10 s admission bound): Pipecat's 3 s would cut it.
            stop_frame_timeout_s=kwargs.pop("stop_frame_timeout_s", 20.0),
            **kwargs,
        )
        # Our state and helpers are prefixed `_vx_`: Pipecat's base classes keep theirs in plain `_names` on
        # the same object, and shadowing one (its `_cancelling`, its `_cancel`) silently stops the processor.
        self._vx_url = url
        self._vx_api_key = api_key
        self._vx_word_timestamps = word_timestamps
        self._vx_contexts = contexts
        self._vx_extra_config = dict(config or {})
        self._vx_session: Session | None = None
        self._vx_config_stale = False  # voice/language changed: send session.config before the next utterance
        self._vx_speeches: dict[str, Speech] = {}  # audio context → its utterance taking text (or the last)
        self._vx_players: dict[str, asyncio.Task[None]] = {}  # audio context → the task playing its last utterance
        self._vx_played_before_ms: dict[str, float] = {}  # audio context → audio of its earlier utterances
        self._vx_flushed: set[str] = set()  # audio contexts whose input is finished
        self._vx_playback_start_ns: dict[str, int] = {}  # audio context → clock time its audio began to play
        self._vx_cancel_task: asyncio.Task[None] | None = None
        # The last utterance whose audio all arrived: Pipecat may still be playing it when the user barges in.
        self._vx_last: tuple[str, Speech] | None = None
        self._vx_cancel_sent = False
        self._receive_task: asyncio.Task[None] | None = None
        self._register_event_handler("on_voxgate_cancelled")

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """voxgate takes base language codes (`en`, `zh`) or `auto`."""
        return str(getattr(language, "value", language)).split("-")[0].lower()

    def session_config(self) -> dict[str, Any]:
        """The `session.config` this service sends."""
        config: dict[str, Any] = {"voice": self._settings.voice, "language": self._settings.language,
                                  "sample_rate": self.sample_rate or None, "response_format": "pcm",
                                  "word_timestamps": True if self._vx_word_timestamps else None}  # fmt: skip
        config = {k: v for k, v in config.items() if isinstance(v, str | int | bool) and v != ""}
        return config | self._vx_extra_config

    # -- connection (WebsocketService's hooks) ----------------------------------------------------------------

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._vx_session is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._vx_session is not None and self._vx_session.closed is None:
            return
        try:
            self._vx_session = await connect(self._vx_url, api_key=self._vx_api_key, **self.session_config())
            self._websocket = self._vx_session.websocket
            self._vx_config_stale = False
            await self._call_event_handler("on_connected")
        except Exception as e:
            self._vx_session = self._websocket = None
            await self.push_error(error_msg=f"{self}: cannot open a voxgate session: {e}", exception=e)
            await self._call_event_handler("on_connection_error", str(e))

    async def _disconnect_websocket(self) -> None:
        session, self._vx_session, self._websocket = self._vx_session, None, None
        for task in self._vx_players.values():
            task.cancel()
        self._vx_players.clear()
        self._vx_speeches.clear()
        if session is not None:
            await session.abort()
            await self._call_event_handler("on_disconnected")

    async def _receive_messages(self) -> None:
        """What no utterance claims (errors about the session); returns once the socket closed, and
        WebsocketService then reconnects (a draining server closes with 1012: go to another replica)."""
        session = self._vx_session
        if session is None:
            return
        async for item in session:
            if isinstance(item, Error):
                await self.push_error(error_msg=f"voxgate {item.code}: {item.message}")

    # -- text in ---------------------------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        try:
            if self._vx_session is None or self._vx_session.closed is not None:
                await self._connect()
            speech = self._vx_speeches.get(context_id)
            if speech is None or speech.input_done:
                speech = await self._vx_open(context_id)
            await speech.send(text)
            await self.start_tts_usage_metrics(text)
        except Exception as e:
            yield ErrorFrame(error=f"{self}: {e}")
            return
        yield None  # the audio comes through the audio context, from the player task

    async def _vx_open(self, context_id: str) -> Speech:
        """A new utterance for `context_id`, and the task that plays it into the audio context."""
        session = self._vx_session
        assert session is not None
        if not self._vx_contexts:
            for other_id, other in list(self._vx_speeches.items()):  # one utterance takes text at a time
                if other_id != context_id and not other.input_done:
                    await other.done()
        if self._vx_config_stale and not session.taking_text:
            await session.configure(**self.session_config())
            self._vx_config_stale = False
        speech = session.speech(context_id if self._vx_contexts else None)
        previous = self._vx_players.get(context_id)
        self._vx_speeches[context_id] = speech
        self._vx_players[context_id] = self.create_task(self._vx_play(context_id, speech, previous))
        return speech

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is all sent: `input.done`."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id is None:
            return
        self._vx_flushed.add(context_id)
        speech = self._vx_speeches.get(context_id)
        if speech is not None:
            with contextlib.suppress(SessionClosed):
                await speech.done()

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed = await super()._update_settings(delta)
        if changed.keys() & {"voice", "language", "model"}:
            self._vx_config_stale = True  # voxgate's config is sticky: re-sent before the next utterance
        return changed

    # -- audio out ----------------------------------------------------------------------------------------

    async def _vx_play(self, context_id: str, speech: Speech, previous: asyncio.Task[None] | None) -> None:
        """Hand one utterance's audio and word timings to its audio context, in order."""
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous  # an earlier utterance of the same context plays first
        base_s = self._vx_played_before_ms.get(context_id, 0.0) / 1000
        try:
            async for item in speech:
                if isinstance(item, Audio):
                    frame = TTSAudioRawFrame(audio=item.data, sample_rate=speech.sample_rate, num_channels=1,
                                             context_id=context_id)  # fmt: skip
                    await self.append_to_audio_context(context_id, frame)
                elif isinstance(item, AudioWords):
                    await self._vx_add_words(item.words, base_s, context_id)
                elif isinstance(item, Error):
                    await self.push_error(error_msg=f"voxgate {item.code}: {item.message}")
        except SessionClosed as e:
            await self.push_error(error_msg=f"{self}: {e}")
        self._vx_played_before_ms[context_id] = self._vx_played_before_ms.get(context_id, 0.0) + speech.received_ms
        if self._vx_players.get(context_id) is asyncio.current_task() and isinstance(speech.result, AudioCancelled):
            return  # interrupted: Pipecat has dropped the context already
        last = self._vx_speeches.get(context_id) is speech and (context_id in self._vx_flushed or speech.result is None)
        if last and self.audio_context_available(context_id):
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
            start = self._vx_playback_start_ns.get(context_id)
            self._vx_forget(context_id)
            if start is not None:  # kept: a barge-in while its audio still plays says where it was
                self._vx_playback_start_ns[context_id] = start
            self._vx_last = (context_id, speech)

    async def _vx_add_words(self, words: list[Word], base_s: float, context_id: str) -> None:
        # Pipecat puts no spaces between words flagged as carrying their own (Han text): one call per run.
        run: list[tuple[str, float]] = []
        unspaced = False
        for w in words:
            flag = bool(_UNSPACED.search(w.word))
            if run and flag != unspaced:
                await self.add_word_timestamps(run, context_id, includes_inter_frame_spaces=unspaced or None)
                run = []
            run.append((w.word, base_s + w.start_ms / 1000))
            unspaced = flag
        if run:
            await self.add_word_timestamps(run, context_id, includes_inter_frame_spaces=unspaced or None)

    def _vx_forget(self, context_id: str) -> None:
        for table in (self._vx_speeches, self._vx_players, self._vx_played_before_ms, self._vx_playback_start_ns):
            table.pop(context_id, None)  # type: ignore[attr-defined]
        self._vx_flushed.discard(context_id)
        if self._vx_last is not None and self._vx_last[0] != context_id:
            self._vx_playback_start_ns.pop(self._vx_last[0], None)
            self._vx_last = None

    # -- interruptions ---------------------------------------------------------------------------------------

    async def start_word_timestamps(self) -> None:
        """The playing context's first audio goes out: where its playback clock starts (the same baseline
        Pipecat times its words from, so `played_ms` and the words it emitted agree)."""
        context_id = self.get_active_audio_context_id()
        if context_id is not None and context_id not in self._vx_playback_start_ns:
            now = self.get_clock().get_time()
            self._vx_playback_start_ns[context_id] = max(self._word_timestamp_tracker.last_pts, now)
        await super().start_word_timestamps()

    def played_ms(self, context_id: str) -> float:
        """How much of the context's audio has played by now (0 before it began)."""
        start = self._vx_playback_start_ns.get(context_id)
        if start is None:
            return 0.0
        return max(0.0, (self.get_clock().get_time() - start) / 1e6)

    async def _handle_interruption(self, frame: InterruptionFrame, direction: FrameDirection) -> None:
        """Pipecat interrupts the contexts still open (`on_audio_context_interrupted` cancels those); an
        utterance whose audio had all arrived may still be playing, and the server is told where it stopped
        all the same: its answer (`cancelled: false`) then says what the listener heard."""
        late, self._vx_last, self._vx_cancel_sent = self._vx_last, None, False
        await super()._handle_interruption(frame, direction)
        if late is None or self._vx_cancel_sent or self._vx_session is None:
            return
        context_id, speech = late
        played = self.played_ms(context_id)
        self._vx_playback_start_ns.pop(context_id, None)
        if 0 < played < speech.received_ms:
            self.create_task(self._vx_cancel(speech, context_id, played))

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the context's utterance on the server, on this socket."""
        await self.stop_all_metrics()
        speech = self._vx_speeches.get(context_id)
        played = self.played_ms(context_id)
        if not self._vx_contexts:  # one cancel for all: the position of the one playing
            played = max([played, *(self.played_ms(c) for c in self.get_audio_contexts())])
        player = self._vx_players.get(context_id)
        if player is not None:
            player.cancel()
        self._vx_forget(context_id)
        if speech is not None and not speech.ended.is_set() and self._vx_session is not None:
            self._vx_cancel_sent = True
            if self._vx_contexts:
                self.create_task(self._vx_cancel(speech, context_id, played))
            elif self._vx_cancel_task is None or self._vx_cancel_task.done():
                # Without contexts one input.cancel cuts every utterance of the socket: sent once for all
                # the contexts Pipecat interrupts together, with the playing one's position.
                self._vx_cancel_task = self.create_task(self._vx_cancel(speech, context_id, played))
            for other in self._vx_speeches.values() if not self._vx_contexts else ():
                other._drop_audio()
        await super().on_audio_context_interrupted(context_id)

    async def _vx_cancel(self, speech: Speech, context_id: str, played_ms: float) -> None:
        try:
            answer = await speech.cancel(played_ms=round(played_ms, 1))
        except (SessionClosed, TimeoutError) as e:
            logger.warning(f"{self}: the cancel of {context_id} was not answered: {e}")
            return
        if answer is not None:
            await self._call_event_handler("on_voxgate_cancelled", context_id, answer)
