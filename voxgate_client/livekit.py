"""A LiveKit Agents TTS speaking through voxgate's streaming WebSocket (extra `livekit`).

    from voxgate_client.livekit import TTS
    session = AgentSession(tts=TTS(url="ws://127.0.0.1:8000", voice="joe"), ...)

Built on LiveKit's own `tts.TTS` / `tts.SynthesizeStream` (streaming, aligned transcripts):
- one socket per TTS object, kept open across streams (connected on first use or `prewarm()`, again if it
  dropped); each `SynthesizeStream` is one voxgate utterance in a context of its own (`context_id`, on a
  server with contexts; `contexts=False` for one without), its text streamed in as LiveKit pushes it;
- word timings (`audio.words`) become LiveKit's `TimedString`s, so the agent's transcript is cut where
  the listener was interrupted;
- closing a stream before its audio ended (an interruption) sends `input.cancel` for its context on the
  same socket, no reconnect; what the server answered is emitted as `voxgate_cancelled`;
- any voxgate voice by name (`voice=`, `update_options(voice=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any

from livekit.agents import APIConnectionError, APIConnectOptions, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, TimedString

from voxgate_client.events import Audio, AudioCancelled, AudioWords, Error, SessionDone
from voxgate_client.session import Session, SessionClosed, Speech, VoxgateError, connect

log = logging.getLogger("voxgate_client.livekit")
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")  # Han and kana: no spaces


class TTS(tts.TTS):
    """LiveKit text-to-speech through a voxgate gateway (see the module's docstring)."""

    def __init__(self, *, url: str = "ws://127.0.0.1:8000", voice: str | None = None, language: str | None = None,
                 api_key: str | None = None, sample_rate: int = 24000, word_timestamps: bool = True,
                 contexts: bool = True, config: dict[str, Any] | None = None) -> None:  # fmt: skip
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=word_timestamps),
                         sample_rate=sample_rate, num_channels=1)  # fmt: skip
        # State and helpers prefixed `_vx_`: LiveKit's base classes keep theirs in plain `_names` on the same
        # objects, and one of ours must never shadow one of theirs.
        self._vx_url, self._vx_api_key = url, api_key
        self._vx_options: dict[str, Any] = {"voice": voice, "language": language}
        self._vx_word_timestamps = word_timestamps
        self._vx_contexts = contexts
        self._vx_extra = dict(config or {})
        self._vx_session: Session | None = None
        self._vx_connecting = asyncio.Lock()
        self._vx_stale = False  # options changed: configure before the next utterance

    @property
    def model(self) -> str:
        return str(self._vx_extra.get("model") or "voxgate")

    @property
    def provider(self) -> str:
        return "voxgate"

    def session_config(self) -> dict[str, Any]:
        config = {**self._vx_options, "sample_rate": self.sample_rate, "response_format": "pcm",
                  "word_timestamps": True if self._vx_word_timestamps else None}  # fmt: skip
        return {k: v for k, v in config.items() if v is not None} | self._vx_extra

    def update_options(self, *, voice: str | None = None, language: str | None = None) -> None:
        """Applied from the next utterance (voxgate's config is sticky and re-sent between utterances)."""
        if voice is not None:
            self._vx_options["voice"] = voice
        if language is not None:
            self._vx_options["language"] = language
        self._vx_stale = True

    async def connection(self, timeout: float = 10.0) -> Session:
        """The socket, opened (or reopened) when needed."""
        async with self._vx_connecting:
            if self._vx_session is None or self._vx_session.closed is not None:
                try:
                    self._vx_session = await connect(self._vx_url, api_key=self._vx_api_key, open_timeout=timeout,
                                                  **self.session_config())  # fmt: skip
                except (OSError, TimeoutError, VoxgateError) as e:
                    raise APIConnectionError(f"voxgate: cannot open a session: {e}") from e
                self._vx_stale = False
            elif self._vx_stale and not self._vx_session.taking_text:
                await self._vx_session.configure(**self.session_config())
                self._vx_stale = False
            return self._vx_session

    def prewarm(self) -> None:
        asyncio.get_event_loop().create_task(self.connection())

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
                   ) -> tts.ChunkedStream:  # fmt: skip
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._vx_session is not None:
            await self._vx_session.close(timeout=2.0)
            self._vx_session = None


class SynthesizeStream(tts.SynthesizeStream):
    """One voxgate utterance: LiveKit's pushed text in, its audio and timed words out."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._vx_tts: TTS = tts
        self.speech: Speech | None = None

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        output_emitter.initialize(request_id=request_id, sample_rate=self._vx_tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)  # fmt: skip
        session = await self._vx_tts.connection(self._conn_options.timeout)
        speech = self.speech = session.speech(request_id if self._vx_tts._vx_contexts else None)
        output_emitter.start_segment(segment_id=request_id)
        sender = asyncio.create_task(self._vx_send(speech), name="voxgate_client.livekit.send")
        try:
            await self._vx_receive(speech, output_emitter)
            await sender
        except BaseException:
            sender.cancel()
            if not speech.ended.is_set() and speech.sent_text:
                # Closed before its audio ended (an interruption): cancel it on the server, on this socket.
                # Shielded: the task running this is being cancelled, the cancel must still go out.
                await asyncio.shield(asyncio.ensure_future(self._vx_cancel(speech)))
            raise

    async def _vx_send(self, speech: Speech) -> None:
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                break  # one stream is one utterance (LiveKit deprecates several segments per stream)
            self._mark_started()
            await speech.send(data)
        await speech.done()

    async def _vx_receive(self, speech: Speech, output_emitter: tts.AudioEmitter) -> None:
        try:
            async for item in speech:
                if isinstance(item, Audio):
                    output_emitter.push(item.data)
                elif isinstance(item, AudioWords):
                    output_emitter.push_timed_transcript([_timed(w.word, w.start_ms, w.end_ms) for w in item.words])
                elif isinstance(item, Error):
                    log.warning("voxgate %s: %s", item.code, item.message)
                elif isinstance(item, SessionDone):
                    break
        except SessionClosed as e:
            raise APIConnectionError(f"voxgate: {e}") from e
        output_emitter.end_segment()

    async def _vx_cancel(self, speech: Speech) -> None:
        with contextlib.suppress(SessionClosed, TimeoutError):
            answer = await speech.cancel(timeout=3.0)
            if isinstance(answer, AudioCancelled):
                self._vx_tts.emit("voxgate_cancelled", answer)  # type: ignore[arg-type]


def _timed(word: str, start_ms: float, end_ms: float) -> TimedString:
    """A word as LiveKit's transcript piece: the pieces are joined as they are, so a spaced word brings its
    space."""
    text = word if _UNSPACED.search(word) else word + " "
    return TimedString(text, start_time=start_ms / 1000, end_time=end_ms / 1000)
