"""What the LiveKit tests share: their texts, a stream driven as LiveKit's agent pipeline drives one
(push_text token by token, end_input, read SynthesizedAudio; aclose() at an interruption), and an
AgentSession's real-time outputs (a speaker that reports its playback position, captions)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

from livekit import rtc
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities, TextOutput

RATE = 24000
SHORT = "Hello there. This is voxgate, speaking through LiveKit."
LONG = ("This is a long answer that keeps going for quite a while, so that the listener has plenty of time to "
        "interrupt it. It goes on with a second sentence, and then a third one, each of them long enough to "
        "take a few seconds to say out loud.")  # fmt: skip


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


@dataclass
class Spoken:
    seconds: float = 0.0  # of audio received
    timed: list = field(default_factory=list)  # the TimedStrings the stream delivered
    first_audio_s: float | None = None  # from the first token pushed to the first audio


async def speak(tts: object, text: str, *, stop_after_s: float | None = None,
                tokens_per_s: float | None = None) -> Spoken:  # fmt: skip
    """One stream of `tts` (any LiveKit TTS): the text token by token (at `tokens_per_s`: an LLM still
    writing); read until its end, or until `stop_after_s` of audio came, then closed (an interruption)."""
    stream = tts.stream()  # type: ignore[attr-defined]

    async def feed() -> None:
        for token in re.findall(r"\s*\S+", text):
            stream.push_text(token)
            if tokens_per_s:
                await asyncio.sleep(1 / tokens_per_s)
        stream.end_input()

    feeding = asyncio.create_task(feed())
    spoken, t0 = Spoken(), time.monotonic()
    try:
        async with asyncio.timeout(60):
            async for ev in stream:
                if spoken.first_audio_s is None:
                    spoken.first_audio_s = time.monotonic() - t0
                spoken.seconds += ev.frame.duration
                spoken.timed.extend(ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
                if stop_after_s is not None and spoken.seconds >= stop_after_s:
                    break
    finally:
        feeding.cancel()
        await stream.aclose()
    return spoken


class Speaker(AudioOutput):
    """A sound card: plays captured frames in real time and reports each segment's playback position."""

    def __init__(self) -> None:
        super().__init__(label="speaker", capabilities=AudioOutputCapabilities(pause=False), sample_rate=RATE)
        self.frames: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue()
        self.position = 0.0  # of the segment playing
        self.played_s = 0.0  # in all
        self.player: asyncio.Task[None] | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self.player is None:
            self.player = asyncio.create_task(self._play())
        self.frames.put_nowait(frame)

    def flush(self) -> None:
        super().flush()
        self.frames.put_nowait(None)  # the segment ends here

    def clear_buffer(self) -> None:
        while not self.frames.empty():
            self.frames.get_nowait()
        self.on_playback_finished(playback_position=self.position, interrupted=True)
        self.position = 0.0

    async def _play(self) -> None:
        while True:
            frame = await self.frames.get()
            if frame is None:
                self.on_playback_finished(playback_position=self.position, interrupted=False)
                self.position = 0.0
                continue
            if self.position == 0.0:
                self.on_playback_started(created_at=time.time())
            await asyncio.sleep(frame.duration)
            self.position += frame.duration
            self.played_s += frame.duration


class Captions(TextOutput):
    """Where LiveKit writes the agent's transcript as it is spoken."""

    def __init__(self) -> None:
        super().__init__(label="captions", next_in_chain=None)
        self.text = ""

    async def capture_text(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


@dataclass
class Interrupted:
    """What an AgentSession interrupted mid-reply left: the audio around the interruption, its history."""

    played_at_interrupt: float = 0.0
    played_after: float = 0.0  # 0.5 s after the interruption's playout ended
    said: str = ""  # the interrupted turn's text in the chat history
    interrupted: bool = False  # the history marks that turn interrupted
    next_turns: list[tuple[float, str]] = field(default_factory=list)  # (first audio after say(), history text)


async def interrupted_session(tts: object, then: list[str] = [], interrupt_at_s: float = 1.5) -> Interrupted:  # noqa: B006
    """An AgentSession speaking through `tts` into a real-time speaker: it says LONG, is interrupted once
    `interrupt_at_s` of it played, then says each of `then` in turn (the next turns)."""
    from livekit.agents import Agent, AgentSession
    from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

    session = AgentSession(tts=tts, use_tts_aligned_transcript=True)  # type: ignore[arg-type]
    speaker, captions, out = Speaker(), Captions(), Interrupted()
    # As LiveKit's RoomIO does: the transcript is released in step with the audio played (timed by the TTS's
    # aligned words), and an interruption cuts it at the playback position.
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=captions)
    session.output.audio, session.output.transcription = sync.audio_output, sync.text_output
    await session.start(agent=Agent(instructions="Say what you are told."))

    def assistant() -> list:
        return [item for item in session.history.items if getattr(item, "role", None) == "assistant"]

    try:
        handle = session.say(LONG)
        deadline = time.monotonic() + 30
        while speaker.played_s < interrupt_at_s:
            assert time.monotonic() < deadline, "no audio played"
            await asyncio.sleep(0.02)
        handle.interrupt()
        await asyncio.wait_for(handle.wait_for_playout(), 10)
        out.played_at_interrupt = speaker.played_s
        await asyncio.sleep(0.5)
        out.played_after = speaker.played_s
        while not assistant() and time.monotonic() < deadline:  # the history is written once the turn ends
            await asyncio.sleep(0.05)
        messages = assistant()
        out.said = " ".join(m.text_content or "" for m in messages)
        out.interrupted = bool(messages) and messages[-1].interrupted
        for text in then:
            before, asked = speaker.played_s, time.monotonic()
            handle = session.say(text)
            while speaker.played_s == before:
                assert time.monotonic() - asked < 10, "the next turn did not speak"
                await asyncio.sleep(0.02)
            first = time.monotonic() - asked
            await asyncio.wait_for(handle.wait_for_playout(), 30)
            out.next_turns.append((first, assistant()[-1].text_content or ""))
    finally:
        await session.aclose()
    return out
